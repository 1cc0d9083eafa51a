//go:build e2e

package demo

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// --collector.process-user names real processes' owners through the passwd file under --path.rootfs, falls back
// to the uid, and puts user on process and workload series; without the flag there is no user label.
func TestProcessUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: starts processes as other users")
	}
	start := func(uid uint32) int {
		cmd := exec.Command("sleep", "600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	named, unnamed := start(4242), start(4343)

	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(root, "etc", "passwd"), "root:x:0:0:root:/root:/bin/bash\ngpe-alice:x:4242:4242::/home/gpe-alice:/bin/false\n")
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	write(t, cfg, fmt.Sprintf(`gpus:
  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60
    memory_total_bytes: 85520809984
    power_usage_watts: 300
    processes:
      - {pid: %d, type: compute, used_memory_bytes: 3221225472, sm_utilization_ratio: 0.5}
      - {pid: %d, type: compute, used_memory_bytes: 1073741824, sm_utilization_ratio: 0.25}
`, named, unnamed))

	users := func(args ...string) (process, workload map[string]string) {
		addr := e2eutil.StartExporter(t, binary, append([]string{"--gpu.simulated-config=" + cfg}, args...)...).Addr
		_, families := e2eutil.Scrape(t, addr)
		process, workload = map[string]string{}, map[string]string{}
		for _, m := range families["gpu_process_memory_used_bytes"].GetMetric() {
			process[e2eutil.Label(m, "pid")] = e2eutil.Label(m, "user")
		}
		for _, m := range families["gpu_workload_power_watts"].GetMetric() {
			workload[e2eutil.Label(m, "user")] = strconv.FormatFloat(e2eutil.Value(m), 'g', -1, 64)
		}
		return process, workload
	}
	process, workload := users("--collector.process-user", "--path.rootfs="+root)
	want := map[string]string{strconv.Itoa(named): "gpe-alice", strconv.Itoa(unnamed): "4343"}
	for pid, user := range want {
		if process[pid] != user {
			t.Errorf("process %s: user %q, want %q (all: %v)", pid, process[pid], user, process)
		}
	}
	// Two workloads, told apart by their users alone, splitting 300 W by SM share 0.5 : 0.25.
	if workload["gpe-alice"] != "200" || workload["4343"] != "100" {
		t.Errorf("workload power by user: %v, want gpe-alice 200 and 4343 100", workload)
	}

	process, workload = users()
	for pid, user := range process {
		if user != "" {
			t.Errorf("without --collector.process-user, process %s has user %q", pid, user)
		}
	}
	if len(workload) != 1 || workload[""] != "300" {
		t.Errorf("without --collector.process-user, workload power %v, want one workload with 300 W", workload)
	}
}
