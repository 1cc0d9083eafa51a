//go:build e2e

package demo

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// A GPU process whose cgroup path has a segment that is not valid UTF-8 (a delegated user may name a unit
// "\xff.service") keeps its process and workload series, with U+FFFD for the byte, and logs no error: before, its
// series failed at export, and every scrape logged a multi-line ERROR.
func TestInvalidUTF8IdentityKeepsItsSeries(t *testing.T) {
	procfs := t.TempDir()
	if err := e2eutil.WriteProc(procfs, 4242, "train\xff", "0::/user.slice/user-1000.slice/user@1000.service/app.slice/\xff.service\n"); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	write(t, cfg, `gpus:
  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60
    memory_total_bytes: 85520809984
    processes:
      - pid: 4242
        type: compute
        used_memory_bytes: 1073741824
`)
	e := e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+cfg, "--path.procfs="+procfs)
	for range 3 {
		_, families := e2eutil.Scrape(t, e.Addr)
		for _, name := range []string{"gpu_process_memory_used_bytes", "gpu_workload_memory_used_bytes"} {
			ms := families[name].GetMetric()
			if len(ms) != 1 || e2eutil.Label(ms[0], "systemd_unit") != "user@1000.service/\uFFFD.service" {
				t.Fatalf("%s = %v, want one series with systemd_unit=\"user@1000.service/\\uFFFD.service\"", name, ms)
			}
		}
		if ms := families["gpu_process_memory_used_bytes"].GetMetric(); e2eutil.Label(ms[0], "process_name") != "train\uFFFD" {
			t.Errorf("process_name = %q", e2eutil.Label(ms[0], "process_name"))
		}
	}
	if out := e.Process.Output(); strings.Contains(out, "level=ERROR") || strings.Contains(out, `"level":"ERROR"`) {
		t.Errorf("errors logged:\n%s", out)
	}
}
