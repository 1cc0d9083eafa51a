//go:build soak

package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet/fake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// The exporter's caps (docs/reference.md, "Limits").
const (
	maxLabelValueBytes = 1024
	maxAllocations     = 16384
)

// TestSoakMegabytePodNames runs the exporter on a node whose two GPU processes are in pods named with 1 MB each,
// alike but for their last byte, as a trusted source (the CRI, a simulated node) may name them. Each label value
// must be cut to the cap with a visible mark, the two pods must stay two series, and the response stay small.
func TestSoakMegabytePodNames(t *testing.T) {
	binary, err := e2eutil.BuildBinary(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", 1<<20-1)
	var node strings.Builder
	node.WriteString("gpus:\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60\n    memory_total_bytes: 85520809984\n    processes:\n")
	for i, last := range []string{"x", "y"} {
		fmt.Fprintf(&node, "      - {pid: %d, type: compute, used_memory_bytes: 1048576, sm_utilization_ratio: 0.5, "+
			"identity: {namespace: ml, pod: %s%s, container: c, pod_uid: %08x-a12c-413e-8625-f5c431a14770}}\n",
			1000+i, long, last, i)
	}
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfg, []byte(node.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	e := e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+cfg, "--path.procfs="+t.TempDir(),
		"--kubelet.pod-resources-endpoint=")
	body, families := e2eutil.Scrape(t, e.Addr)
	for range 4 {
		body, families = e2eutil.Scrape(t, e.Addr)
	}
	rss := scrapeState(t, e.Addr).rss
	t.Logf("two pods named with 1 MB: response %.2f MB, RSS %.1f MB, peak RSS %.1f MB", float64(len(body))/1e6, rss/1e6,
		peakRSS(t, e.Pid)/1e6)
	pods := map[string]bool{}
	for _, m := range families["gpu_process_memory_used_bytes"].GetMetric() {
		pod := e2eutil.Label(m, "pod")
		pods[pod] = true
		if len(pod) > maxLabelValueBytes || !strings.Contains(pod, "[truncated") {
			t.Errorf("pod label of %d bytes (%.40q...%q), want at most %d with a truncation mark", len(pod), pod,
				pod[max(0, len(pod)-40):], maxLabelValueBytes)
		}
	}
	if len(pods) != 2 {
		t.Errorf("%d distinct pod labels on process series, want 2: two pods that differ only past the cap must stay two series", len(pods))
	}
	if len(body) > 1<<20 {
		t.Errorf("response of %d bytes, want under 1 MiB", len(body))
	}
}

// TestSoakHundredThousandAllocations runs the exporter against a kubelet that lists 100,000 GPU allocations (time-
// sliced replicas of one GPU, each to a pod of its own). The exporter must read no more than its cap of them, say
// how many it left out, and keep its memory bounded.
func TestSoakHundredThousandAllocations(t *testing.T) {
	binary, err := e2eutil.BuildBinary(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const gpu = "GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60"
	const n = 100000
	devices := make([]fake.Device, n)
	for i := range devices {
		devices[i] = fake.Device{Namespace: "ml", Pod: fmt.Sprintf("notebook-%d", i), Container: "notebook",
			Resource: "nvidia.com/gpu", IDs: []string{fmt.Sprintf("%s::%d", gpu, i)}}
	}
	sock := filepath.Join(testkit.SocketDir(t), "kubelet.sock")
	srv, err := fake.Start(sock, devices, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	cfg := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(cfg, []byte("gpus:\n  - uuid: "+gpu+"\n    memory_total_bytes: 85520809984\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+cfg, "--path.procfs="+t.TempDir(),
		"--kubelet.pod-resources-endpoint=unix://"+sock, "--kubelet.refresh-interval=2s")
	var body string
	testkit.WaitFor(t, time.Minute, "the allocations", func() bool {
		b, fams, err := e2eutil.TryScrape(e.Addr)
		body = b
		return err == nil && len(fams["gpu_allocation_info"].GetMetric()) > 0
	})
	// A few refreshes and scrapes, as a node's first minute would have.
	for range 5 {
		body, _ = e2eutil.Scrape(t, e.Addr)
		time.Sleep(2 * time.Second)
	}
	body, families := e2eutil.Scrape(t, e.Addr)
	state := scrapeState(t, e.Addr)
	allocated := len(families["gpu_allocation_info"].GetMetric())
	dropped := "absent"
	if mf := families["gpu_pod_exporter_kubelet_allocations_dropped"]; mf != nil && len(mf.GetMetric()) == 1 {
		dropped = fmt.Sprint(e2eutil.Value(mf.GetMetric()[0]))
	}
	t.Logf("%d allocations listed: %d gpu_allocation_info series, %s dropped; response %.1f MB, RSS %.1f MB, peak RSS "+
		"%.1f MB, heap in use %.1f MB", n, allocated, dropped, float64(len(body))/1e6, state.rss/1e6,
		peakRSS(t, e.Pid)/1e6, state.heap/1e6)
	if allocated > maxAllocations {
		t.Errorf("%d gpu_allocation_info series, want at most %d", allocated, maxAllocations)
	}
	if want := fmt.Sprint(n - maxAllocations); dropped != want {
		t.Errorf("gpu_pod_exporter_kubelet_allocations_dropped %s, want %s", dropped, want)
	}
	if peak := peakRSS(t, e.Pid); peak > 256<<20 {
		t.Errorf("peak RSS %.1f MB, want under the chart's memory limit of 256 MiB", peak/1e6)
	}
}
