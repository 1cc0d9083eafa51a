//go:build e2e

package demo

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/golden"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// fakeSMI builds the fake nvidia-smi once per test binary.
func fakeSMI(t *testing.T) string {
	t.Helper()
	path := filepath.Join(filepath.Dir(binary), "nvidia-smi")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	out, err := exec.Command("go", "build", "-o", path, "../../internal/gpu/nvidiasmi/internal/fakesmi").CombinedOutput()
	if err != nil {
		t.Fatalf("building the fake nvidia-smi: %v\n%s", err, out)
	}
	return path
}

// smiExporter runs the binary on the nvidia-smi source, with the fake's behaviour set by its environment.
func smiExporter(t *testing.T, env ...string) string {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	// An empty procfs: the fixtures' PIDs may exist on this machine, and their names and owners here are not the
	// fixture's.
	return e2eutil.StartExporter(t, binary, "--gpu.source=nvidia-smi", "--nvidia-smi.path="+fakeSMI(t), "--nvidia-smi.timeout=1s",
		"--collection.timeout=2s", "--path.procfs="+t.TempDir()).Addr
}

// Every real nvidia-smi output becomes a promtool-clean exposition, reviewed in testdata/nvidia-smi/*.prom.
func TestNvidiaSMIFixturesToMetrics(t *testing.T) {
	fixtures, _ := filepath.Glob("../../internal/gpu/nvidiasmi/testdata/*.xml")
	if len(fixtures) < 15 {
		t.Fatalf("found %d nvidia-smi fixtures, want the 15 shared ones and more", len(fixtures))
	}
	for _, fixture := range fixtures {
		name := strings.TrimSuffix(filepath.Base(fixture), ".xml")
		t.Run(name, func(t *testing.T) {
			abs, _ := filepath.Abs(fixture)
			addr := smiExporter(t, "FAKESMI_MODE=file", "FAKESMI_FILE="+abs)
			body, families := e2eutil.Scrape(t, addr)
			if len(families["gpu_info"].GetMetric()) == 0 {
				t.Fatalf("no gpu_info from %s", name)
			}
			if v := e2eutil.Value(families["gpu_pod_exporter_source_up"].GetMetric()[0]); v != 1 {
				t.Errorf("source_up = %v", v)
			}
			promtool := exec.Command("promtool", "check", "metrics")
			promtool.Stdin = strings.NewReader(body)
			if out, err := promtool.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
				t.Errorf("promtool check metrics: %v\n%s", err, out)
			}
			got := gpuSeries(t, body)
			golden.Check(t, filepath.Join("testdata", "nvidia-smi", name+".prom"), got)
		})
	}
}

// gpuSeries keeps the GPU families of an exposition: the exporter's own metrics (its self-metrics, the Go runtime's,
// the process's and the HTTP handler's) vary from run to run.
func gpuSeries(t *testing.T, body string) string {
	t.Helper()
	var keep []string
	for _, line := range strings.Split(body, "\n") {
		name := strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE ")
		if line == "" || strings.HasPrefix(name, "gpu_pod_exporter_") || strings.HasPrefix(name, "go_") ||
			strings.HasPrefix(name, "process_") || strings.HasPrefix(name, "promhttp_") {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n") + "\n"
}

// A broken nvidia-smi costs each scrape at most its deadline: the scrape still answers (one that waited for a
// stalled run would not, before the client gives up), with self-metrics that count the failure, and every run is
// ended rather than left behind.
func TestNvidiaSMIFailuresAreBoundedAndCounted(t *testing.T) {
	for _, mode := range []string{"exit", "garbage", "flood", "stall", "hang-child"} {
		t.Run(mode, func(t *testing.T) {
			pidfile := filepath.Join(t.TempDir(), "pids")
			addr := smiExporter(t, "FAKESMI_MODE="+mode, "FAKESMI_STDERR=NVIDIA-SMI has failed", "FAKESMI_PIDFILE="+pidfile)
			for i := 1; i <= 3; i++ {
				_, families := e2eutil.Scrape(t, addr)
				if len(families["gpu_info"].GetMetric()) != 0 {
					t.Errorf("scrape %d served GPU series from a broken nvidia-smi", i)
				}
				if v := sum(families["gpu_pod_exporter_source_up"]); v != 0 {
					t.Errorf("scrape %d: source_up = %v, want 0", i, v)
				}
				failures := sum(families["gpu_pod_exporter_collection_errors_total"]) +
					sum(families["gpu_pod_exporter_collection_timeouts_total"])
				if failures < float64(i) {
					t.Errorf("after %d failed scrapes, %v failures counted", i, failures)
				}
			}
			b, err := os.ReadFile(pidfile)
			if err != nil {
				t.Fatal(err)
			}
			pids := strings.Fields(string(b))
			testkit.WaitFor(t, 10*time.Second, "the runs' processes "+strings.Join(pids, ", ")+" to exit", func() bool {
				return !slices.ContainsFunc(pids, func(pid string) bool { return !testkit.Exited(pid) })
			})
		})
	}
}

// sum adds up a family's series; an absent family is 0.
func sum(mf *dto.MetricFamily) float64 {
	var total float64
	for _, m := range mf.GetMetric() {
		total += e2eutil.Value(m)
	}
	return total
}
