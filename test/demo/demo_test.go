//go:build e2e

// Package demo runs the real binary on simulated nodes: the demo node and a node file, scraped directly, checked by
// promtool, and scraped by a real Prometheus server.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

var binary string

func TestMain(m *testing.M) { e2eutil.Main(m, &binary) }

// notOnTheDemo are the families of docs/reference.md that the demo node cannot show, and why.
var notOnTheDemo = map[string]string{
	"gpu_retired_pages_total":                            "GPUs before Ampere retire pages; the demo's Hopper and Ada GPUs remap rows",
	"gpu_retired_pages_pending":                          "GPUs before Ampere retire pages; the demo's Hopper and Ada GPUs remap rows",
	"gpu_pod_exporter_device_errors_total":               "it counts reads that failed; the demo's do not",
	"gpu_pod_exporter_series_dropped_total":              "it counts series past a family's limit; the demo has a few hundred",
	"gpu_pod_exporter_implausible_values_total":          "it counts values outside their family's range; the demo's are all within",
	"gpu_pod_exporter_basic_auth_refused_total":          "it counts password checks refused; the demo serves without --web.config.file",
	"gpu_pod_exporter_resolver_requests_total":           "the demo's owners are preset; no container runtime is asked",
	"gpu_pod_exporter_resolver_request_duration_seconds": "the demo's owners are preset; no container runtime is asked",
	"gpu_pod_exporter_resolver_pod_cache_entries":        "the demo's owners are preset; no container runtime is asked",
	"gpu_pod_exporter_resolver_pod_cache_bytes":          "the demo's owners are preset; no container runtime is asked",
}

// documentedFamilies are the first cells of docs/reference.md's tables whose first column is "metric".
func documentedFamilies(t *testing.T) []string {
	ref, err := os.ReadFile(filepath.Join(e2eutil.RepoRoot(), "docs", "reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	inMetricTable := false
	for _, line := range strings.Split(string(ref), "\n") {
		switch {
		case !strings.HasPrefix(line, "|"):
			inMetricTable = false
		case strings.HasPrefix(line, "| metric |"):
			inMetricTable = true
		case inMetricTable && strings.HasPrefix(line, "| `"):
			named = append(named, strings.Trim(strings.TrimSpace(strings.Split(line, "|")[1]), "`"))
		}
	}
	if !slices.Contains(named, "gpu_pod_exporter_kubelet_up") || !slices.Contains(named, "gpu_memory_reserved_bytes") {
		t.Fatalf("metric tables of docs/reference.md not found: %v", named)
	}
	return named
}

func TestDemoServesEveryFamilyAndPassesPromtool(t *testing.T) {
	addr := e2eutil.StartExporter(t, binary, "--demo").Addr
	body, families := e2eutil.Scrape(t, addr)
	for _, name := range documentedFamilies(t) {
		if _, excused := notOnTheDemo[name]; len(families[name].GetMetric()) == 0 && !excused {
			t.Errorf("demo exposition has no %s", name)
		}
	}
	if up := families["gpu_pod_exporter_kubelet_up"].GetMetric(); len(up) != 1 || e2eutil.Value(up[0]) != 1 {
		t.Errorf("demo's stand-in kubelet: kubelet_up %v, want 1", up)
	}
	for _, m := range families["gpu_info"].GetMetric() {
		if e2eutil.Label(m, "simulated") != "true" {
			t.Errorf("demo gpu_info without simulated=\"true\": %v", m)
		}
	}
	// Identity labels from the demo node, with no container runtime on this machine.
	// The demo's simulated kubelet allocations: one pod uses a GPU it never requested; one holds a GPU idle through
	// the device plugin, one through a DRA claim; the DRA claim of a MIG device is in use.
	var unrequested, idle, dra []string
	for _, m := range families["gpu_unrequested_use"].GetMetric() {
		unrequested = append(unrequested, e2eutil.Label(m, "namespace")+"/"+e2eutil.Label(m, "pod")+" GPU "+e2eutil.Label(m, "gpu"))
	}
	for _, m := range families["gpu_allocation_processes"].GetMetric() {
		if e2eutil.Value(m) == 0 {
			idle = append(idle, e2eutil.Label(m, "namespace")+"/"+e2eutil.Label(m, "pod")+" GPU "+e2eutil.Label(m, "gpu"))
		}
		if claim := e2eutil.Label(m, "dra_claim_name"); claim != "" {
			dra = append(dra, fmt.Sprintf("%s %s %s GPU %s/%s processes %v", claim, e2eutil.Label(m, "dra_driver_name"),
				e2eutil.Label(m, "dra_device_name"), e2eutil.Label(m, "gpu"), e2eutil.Label(m, "gpu_instance"), e2eutil.Value(m)))
		}
	}
	slices.Sort(idle)
	slices.Sort(dra)
	if fmt.Sprint(unrequested) != "[data-science/jupyter-bob-0 GPU 3]" ||
		fmt.Sprint(idle) != "[ml-research/hparam-sweep-3 GPU 6 search/rag-index-0 GPU 7]" {
		t.Errorf("demo allocation signals: unrequested %v, idle %v", unrequested, idle)
	}
	if want := "[embedder-0-mig-8xk2q gpu.nvidia.com gpu-2-mig-1g10gb-19-6 GPU 2/13 processes 1 " +
		"rag-index-gpu gpu.nvidia.com gpu-7 GPU 7/ processes 0]"; fmt.Sprint(dra) != want {
		t.Errorf("demo DRA allocations:\n%v\nwant\n%v", dra, want)
	}

	found := false
	for _, m := range families["gpu_process_memory_used_bytes"].GetMetric() {
		if e2eutil.Label(m, "pod") == "triton-llm-0" && e2eutil.Label(m, "namespace") == "inference" && e2eutil.Label(m, "container") == "triton" &&
			e2eutil.Label(m, "process_type") == "mps" && m.GetGauge().GetValue() == 9663676416 {
			found = true
		}
	}
	if !found {
		t.Error("demo has no MPS client series for inference/triton-llm-0/triton with 9 GiB")
	}

	promtool := exec.Command("promtool", "check", "metrics")
	promtool.Stdin = strings.NewReader(body)
	if out, err := promtool.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

func TestPSDemoJSON(t *testing.T) {
	out, err := exec.Command(binary, "ps", "--demo", "--output", "json").Output()
	if err != nil {
		t.Fatalf("ps --demo --output json: %v", err)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("ps output is not a JSON array: %v\n%s", err, out)
	}
	snap, _ := simulated.Demo().Snapshot(context.Background())
	want := 0
	for _, d := range snap.Devices {
		want += len(d.Processes)
	}
	if len(rows) != want {
		t.Fatalf("ps printed %d rows, the demo node has %d processes", len(rows), want)
	}
	keys := []string{"gpu", "uuid", "pid", "process_name", "process_type", "memory_used_bytes", "sm_utilization_ratio",
		"namespace", "pod", "container", "pod_uid", "container_id", "runtime", "slurm_job_id", "systemd_unit", "user"}
	for _, row := range rows {
		for _, k := range keys {
			if _, ok := row[k]; !ok {
				t.Fatalf("row %v has no key %q", row, k)
			}
		}
	}
	var sawNullSM, sawSlurm bool
	for _, row := range rows {
		if row["sm_utilization_ratio"] == nil {
			sawNullSM = true
		}
		if row["slurm_job_id"] == "88231" && row["pid"] == float64(61001) && row["gpu"] == float64(4) {
			sawSlurm = true
		}
	}
	if !sawNullSM || !sawSlurm {
		t.Errorf("ps JSON: null sm_utilization_ratio seen %v, Slurm job 88231 on GPU 4 seen %v", sawNullSM, sawSlurm)
	}

	// The table on stdout; the note that the data is simulated on stderr, with the others.
	var stderr bytes.Buffer
	cmd := exec.Command(binary, "ps", "--demo")
	cmd.Stderr = &stderr
	table, err := cmd.Output()
	if err != nil || !bytes.Contains(table, []byte("pod inference/triton-llm-0/triton")) || !bytes.Contains(stderr.Bytes(), []byte("# simulated")) {
		t.Errorf("ps --demo table (err %v):\n%s\n%s", err, table, stderr.Bytes())
	}
}

func TestSimulatedConfigValues(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	write(t, cfg, `driver_version: "580.95.05"
cuda_version: "13.0"
gpus:
  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
    utilization_ratio: 0.42
    temperature_celsius: 41
    power_usage_watts: 310.5
    processes:
      - pid: 4242
        type: compute
        used_memory_bytes: 1073741824
        sm_utilization_ratio: 0.35
`)
	addr := e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+cfg).Addr
	_, families := e2eutil.Scrape(t, addr)
	check := func(name string, want float64) {
		t.Helper()
		ms := families[name].GetMetric()
		if len(ms) != 1 || e2eutil.Value(ms[0]) != want {
			t.Errorf("%s = %v, want one series with %v", name, ms, want)
		}
	}
	check("gpu_utilization_ratio", 0.42)
	check("gpu_temperature_celsius", 41)
	check("gpu_power_usage_watts", 310.5)
	check("gpu_memory_total_bytes", 85520809984)
	check("gpu_process_memory_used_bytes", 1073741824)
	check("gpu_process_sm_utilization_ratio", 0.35)
	check("gpu_workload_processes", 1)
	for _, absent := range []string{"gpu_fan_speed_ratio", "gpu_memory_utilization_ratio", "gpu_clock_hertz", "gpu_mig_info"} {
		if n := len(families[absent].GetMetric()); n != 0 {
			t.Errorf("%s has %d series; the node file does not give it, so it must be absent", absent, n)
		}
	}
	// PID 4242 does not exist here (or is not ours): the series stays, the identity is empty.
	m := families["gpu_process_memory_used_bytes"].GetMetric()[0]
	if e2eutil.Label(m, "pid") != "4242" || e2eutil.Label(m, "pod") != "" {
		t.Errorf("process series labels = %v", m.GetLabel())
	}

	// Edit the file: the next scrape shows the change.
	write(t, cfg, strings.Replace(mustRead(t, cfg), "utilization_ratio: 0.42", "utilization_ratio: 0.5", 1))
	testkit.WaitFor(t, 5*time.Second, "the edited node file to be served", func() bool {
		_, f := e2eutil.Scrape(t, addr)
		ms := f["gpu_utilization_ratio"].GetMetric()
		return len(ms) == 1 && e2eutil.Value(ms[0]) == 0.5
	})
}

func TestBadNodeFileFailsWithKeyAndLine(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	write(t, cfg, "gpus:\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60\n    memory_total_bytes: 1\n    colour: green\n")
	out, err := exec.Command(binary, "ps", "--gpu.simulated-config="+cfg).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `line 4: unknown key "colour"`) {
		t.Errorf("ps with a bad node file: err %v, output:\n%s", err, out)
	}
}

func TestBasicAuthThroughWebConfig(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	webCfg := filepath.Join(t.TempDir(), "web.yml")
	write(t, webCfg, "basic_auth_users:\n  prometheus: "+string(hash)+"\n")
	addr := e2eutil.StartExporter(t, binary, "--demo", "--web.config.file="+webCfg).Addr
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /metrics without credentials: %s, want 401", resp.Status)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	req.SetBasicAuth("prometheus", "s3cret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /metrics with credentials: %s", resp.Status)
	}
}

// A real Prometheus scrapes the demo exporter; the per-GPU sum of process memory is what the demo node implies.
func TestPrometheusScrapesDemo(t *testing.T) {
	addr := e2eutil.StartExporter(t, binary, "--demo").Addr
	prom := e2eutil.StartPrometheus(t, e2eutil.ScrapeConfig(addr))

	snap, _ := simulated.Demo().Snapshot(context.Background())
	want := map[string]float64{}
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			want[strconv.Itoa(d.Index)] += p.UsedMemoryBytes.V
		}
	}
	var got map[string]float64
	testkit.WaitFor(t, 60*time.Second, "Prometheus to have the demo's process memory", func() bool {
		got = e2eutil.ByLabel(e2eutil.Query(t, prom, "sum by (gpu) (gpu_process_memory_used_bytes)"), "gpu")
		return len(got) > 0
	})
	if len(got) != len(want) {
		t.Errorf("sum by (gpu) returned GPUs %v, want %v", got, want)
	}
	for g, v := range want {
		if got[g] != v {
			t.Errorf("GPU %s: Prometheus sums %v bytes, the demo node has %v", g, got[g], v)
		}
	}
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
