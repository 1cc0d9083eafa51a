//go:build e2e

package demo

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvml/stubnvml"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// stubNVML builds the NVML source's stub libnvidia-ml.so.1 (two H100s on R580) into a directory of its own, for
// LD_LIBRARY_PATH.
func stubNVML(t *testing.T) string {
	t.Helper()
	return filepath.Dir(stubnvml.H100R580.Build(t))
}

// The real binary on the NVML source, loading the stub library by its usual name: the driver's reservation is its
// own family, a GPU that falls off the bus keeps its XID 79 series, the XID watcher reports itself up, and the
// exporter exits cleanly on SIGTERM (NVML is shut down only after the reading in progress).
func TestNVMLSourceWithStubLibrary(t *testing.T) {
	t.Setenv("LD_LIBRARY_PATH", stubNVML(t))
	t.Setenv("STUB_NVML_XID79", "1")
	addr := e2eutil.FreeAddr(t)
	cmd := exec.Command(binary, "--web.listen-address="+addr, "--gpu.source=nvml", "--path.procfs="+t.TempDir())
	p := e2eutil.Start(t, cmd)
	e2eutil.WaitListening(t, p, addr, 20*time.Second)

	series := func(families map[string]*dto.MetricFamily, name, uuid string, labels ...string) (float64, bool) {
		for _, m := range families[name].GetMetric() {
			match := e2eutil.Label(m, "uuid") == uuid
			for i := 0; i+1 < len(labels); i += 2 {
				match = match && e2eutil.Label(m, labels[i]) == labels[i+1]
			}
			if match {
				return e2eutil.Value(m), true
			}
		}
		return 0, false
	}
	var body string
	var families map[string]*dto.MetricFamily
	testkit.WaitFor(t, 20*time.Second, "XID 79 of the lost GPU exported", func() bool {
		body, families = e2eutil.Scrape(t, addr)
		v, ok := series(families, "gpu_xid_errors_total", "GPU-stub-1", "xid", "79")
		return ok && v == 1
	})
	if v, ok := series(families, "gpu_memory_reserved_bytes", "GPU-stub-0"); !ok || v != stubnvml.MemoryReserved {
		t.Errorf("gpu_memory_reserved_bytes of GPU 0 = %v (found %v), want %v", v, ok, stubnvml.MemoryReserved)
	}
	if v, ok := series(families, "gpu_memory_used_bytes", "GPU-stub-0"); !ok || v != stubnvml.MemoryUsed {
		t.Errorf("gpu_memory_used_bytes of GPU 0 = %v (found %v), want %v", v, ok, stubnvml.MemoryUsed)
	}
	if v, ok := series(families, "gpu_process_memory_used_bytes", "GPU-stub-0", "pid", "1002"); !ok || v != 2<<30 {
		t.Errorf("memory of PID 1002 = %v (found %v), want 2 GiB", v, ok)
	}
	if m := families["gpu_pod_exporter_xid_watcher_up"].GetMetric(); len(m) != 1 || e2eutil.Value(m[0]) != 1 {
		t.Errorf("gpu_pod_exporter_xid_watcher_up = %v, want 1", m)
	}
	promtool := exec.Command("promtool", "check", "metrics")
	promtool.Stdin = strings.NewReader(body)
	if out, err := promtool.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 20*time.Second, "the exporter to exit after SIGTERM", func() bool {
		exited, _ := p.Exited()
		return exited
	})
	if _, err := p.Exited(); err != nil {
		t.Errorf("exporter exited with %v after SIGTERM, want 0\n%s", err, p.Output())
	}
}

// Under --gpu.source=auto, a GPU whose processes NVML cannot list (the stub's list answers an error) takes its list
// from nvidia-smi, matched by UUID, and the exporter says so once.
func TestAutoListsProcessesWithNvidiaSMIWhereNVMLCannot(t *testing.T) {
	t.Setenv("LD_LIBRARY_PATH", stubNVML(t))
	t.Setenv("STUB_NVML_PROCESSES_FAIL", "1")
	fixture, err := os.ReadFile("../../internal/gpu/nvidiasmi/testdata/telegraf__a10g.xml") // PID 725 using 22 MiB
	if err != nil {
		t.Fatal(err)
	}
	smiOutput := filepath.Join(t.TempDir(), "smi.xml")
	xml := strings.Replace(string(fixture), "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94", "GPU-stub-0", 1)
	if err := os.WriteFile(smiOutput, []byte(xml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKESMI_MODE", "file")
	t.Setenv("FAKESMI_FILE", smiOutput)
	exp := e2eutil.StartExporter(t, binary, "--gpu.source=auto", "--nvidia-smi.path="+fakeSMI(t), "--path.procfs="+t.TempDir())
	for range 2 {
		testkit.WaitFor(t, 20*time.Second, "PID 725 of GPU 0 from nvidia-smi", func() bool {
			_, families := e2eutil.Scrape(t, exp.Addr)
			for _, m := range families["gpu_process_memory_used_bytes"].GetMetric() {
				if e2eutil.Label(m, "uuid") == "GPU-stub-0" && e2eutil.Label(m, "pid") == "725" {
					return e2eutil.Value(m) == 22<<20
				}
			}
			return false
		})
	}
	if n := strings.Count(exp.Output(), "listing them with nvidia-smi"); n != 1 {
		t.Errorf("the fallback was logged %d times, want once:\n%s", n, exp.Output())
	}
}

// A driver that answers NVML_VALUE_NOT_AVAILABLE (-1) for GPU 1's values with SUCCESS, as drivers do for some GPUs
// and fields: each is left out, not written as 4.29e7 of utilization, 4.29e9 °C, 4.29 MW or 2^64 KiB of NVLink
// traffic, and counted by family; GPU 0 is written whole, and GPU 1's other values too.
func TestNVMLSentinelsAreLeftOut(t *testing.T) {
	t.Setenv("LD_LIBRARY_PATH", stubNVML(t))
	t.Setenv("STUB_NVML_SENTINELS", "1")
	exp := e2eutil.StartExporter(t, binary, "--gpu.source=nvml", "--path.procfs="+t.TempDir(), "--compat=dcgm")
	body, families := e2eutil.Scrape(t, exp.Addr)
	byGPU := func(name, uuid string) int {
		n := 0
		for _, m := range families[name].GetMetric() {
			if e2eutil.Label(m, "uuid") == uuid || e2eutil.Label(m, "UUID") == uuid {
				n++
			}
		}
		return n
	}
	for _, name := range []string{"gpu_utilization_ratio", "gpu_memory_utilization_ratio", "gpu_temperature_celsius",
		"gpu_power_usage_watts", "gpu_energy_consumption_joules_total", "gpu_pcie_replays_total", "gpu_recovery_action",
		"gpu_nvlink_bytes_total", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
		"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"} {
		if n := byGPU(name, "GPU-stub-1"); n != 0 {
			t.Errorf("%s: %d series of GPU 1, written from NVML's \"not available\"", name, n)
		}
		if name != "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" && byGPU(name, "GPU-stub-0") == 0 { // a rate: absent at first
			t.Errorf("%s: no series of GPU 0", name)
		}
	}
	if byGPU("gpu_memory_used_bytes", "GPU-stub-1") != 1 || byGPU("gpu_clock_hertz", "GPU-stub-1") != 4 {
		t.Errorf("GPU 1's plausible values left out too")
	}
	counted := map[string]float64{}
	for _, m := range families["gpu_pod_exporter_implausible_values_total"].GetMetric() {
		counted[e2eutil.Label(m, "family")+"/"+e2eutil.Label(m, "reason")] = e2eutil.Value(m)
	}
	for _, f := range []string{"gpu_utilization_ratio", "gpu_temperature_celsius", "gpu_power_usage_watts",
		"gpu_energy_consumption_joules_total", "gpu_recovery_action"} {
		if counted[f+"/out_of_range"] != 1 {
			t.Errorf("gpu_pod_exporter_implausible_values_total: %v, want %s counted once", counted, f)
		}
	}
	if counted["gpu_nvlink_bytes_total/out_of_range"] != 2 {
		t.Errorf("gpu_pod_exporter_implausible_values_total: %v, want both NVLink directions counted", counted)
	}
	for line := range strings.Lines(body) {
		gpuSeries := strings.HasPrefix(line, "gpu_") || strings.HasPrefix(line, "DCGM_")
		if gpuSeries && (strings.Contains(line, "4.294967295e+") || strings.Contains(line, "1.8446744073709")) {
			t.Errorf("a sentinel was written: %s", line)
		}
	}
}
