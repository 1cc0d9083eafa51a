//go:build soak

package soak

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// TestSoakFileLimit runs the exporter under a hard limit of 1,024 file descriptors (a soft one of 256, which it
// raises to the hard one) on a node of 4,000 GPU processes, 500 on each of 8 GPUs, each in a pod of its own (a fake
// procfs). The exporter keeps process files open between scrapes only within what the limit leaves after the
// connections and its own files, and reads the others by path, so that every process keeps its pod identity (files
// kept without a budget would take every descriptor, and most processes would lose it), 100 new connections at once
// are all answered, and the self-metrics say how many files are kept.
func TestSoakFileLimit(t *testing.T) {
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("prlimit (util-linux) is not installed")
	}
	binary, err := e2eutil.BuildBinary(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const gpus, perGPU = 8, 500
	procfs, config := t.TempDir(), filepath.Join(t.TempDir(), "node.yaml")
	var node strings.Builder
	node.WriteString("gpus:\n")
	pid := uint32(10000)
	for g := range gpus {
		fmt.Fprintf(&node, "  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-%012d\n    memory_total_bytes: 85520809984\n    processes:\n", g)
		for range perGPU {
			pid++
			uid := fmt.Sprintf("%08x_0000_4000_8000_%012x", pid, pid)
			cg := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice/cri-containerd-" +
				fmt.Sprintf("%064x", 0x50a4000000+uint64(pid)) + ".scope\n"
			if err := e2eutil.WriteProc(procfs, pid, "train", cg); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&node, "      - {pid: %d, type: compute, used_memory_bytes: 1048576}\n", pid)
		}
	}
	if err := os.WriteFile(config, []byte(node.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := e2eutil.FreeAddr(t)
	// A soft limit of 256 under the hard 1,024, which the exporter raises.
	p := e2eutil.Start(t, exec.Command("prlimit", "--nofile=256:1024", "--", binary, "--web.listen-address="+addr,
		"--gpu.simulated-config="+config, "--path.procfs="+procfs, "--kubelet.pod-resources-endpoint="))
	e2eutil.WaitListening(t, p, addr, 30*time.Second)

	var identified int
	var kept string
	for range 3 { // the first reading opens the files that the next ones keep
		_, families := e2eutil.Scrape(t, addr)
		identified = 0
		for _, m := range families["gpu_process_memory_used_bytes"].GetMetric() {
			if e2eutil.Label(m, "pod_uid") != "" {
				identified++
			}
		}
		kept = ""
		for _, name := range []string{"gpu_pod_exporter_attribution_kept_files", "gpu_pod_exporter_attribution_kept_files_budget"} {
			for _, m := range families[name].GetMetric() {
				kept += fmt.Sprintf(" %s %.0f", name, e2eutil.Value(m))
			}
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.Pid))
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", p.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^Max open files +1024 +1024 `).Match(limits) {
		t.Errorf("the soft limit was not raised to the hard one:\n%s", limits)
	}

	// 100 new connections at once, each asking for /healthz.
	var answered atomic.Int32
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := c.Get("http://" + addr + "/healthz")
			if err != nil {
				firstErr.CompareAndSwap(nil, err.Error())
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				answered.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d GPU processes under a limit of 1,024 files: %d with their pod identity; %d files open; kept files:%s; "+
		"%d of 100 new connections answered (first error: %v)", gpus*perGPU, identified, len(fds), kept, answered.Load(),
		firstErr.Load())
	if identified != gpus*perGPU {
		t.Errorf("%d of %d processes have their pod identity", identified, gpus*perGPU)
	}
	if answered.Load() != 100 {
		t.Errorf("%d of 100 new connections answered", answered.Load())
	}
	if kept == "" {
		t.Error("no gpu_pod_exporter_attribution_kept_files")
	}
}
