//go:build e2e

// Package allocation runs the real binary on a simulated node against a real gRPC PodResources v1 server on a unix
// socket, and checks the allocation series and signals end to end: unrequested use, idle allocations, and a
// kubelet that goes away and comes back. rules_test.go (no build tag) checks the Prometheus rules with promtool.
package allocation

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet/fake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

var binary string

func TestMain(m *testing.M) { e2eutil.Main(m, &binary) }

const (
	gpu0 = "GPU-11111111-1111-1111-1111-111111111111"
	gpu1 = "GPU-22222222-2222-2222-2222-222222222222"
	gpu2 = "GPU-33333333-3333-3333-3333-333333333333"
)

// node: pod ml/train runs on GPU 0 and GPU 1 but is allocated GPU 0 only; GPU 2 is allocated to ml/idle and has
// no process. Identities are preset, as for PIDs that do not exist on this host.
const node = `
driver_version: "580.95.05"
cuda_version: "13.0"
gpus:
  - uuid: ` + gpu0 + `
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
    processes:
      - pid: 4242
        name: python3
        type: compute
        used_memory_bytes: 1073741824
        identity: {namespace: ml, pod: train-0, container: trainer, pod_uid: 0d9a1c4e-3b2f-4a5d-8e7f-1a2b3c4d5e6f}
  - uuid: ` + gpu1 + `
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
    processes:
      - pid: 4243
        name: python3
        type: compute
        used_memory_bytes: 2147483648
        identity: {namespace: ml, pod: train-0, container: trainer, pod_uid: 0d9a1c4e-3b2f-4a5d-8e7f-1a2b3c4d5e6f}
  - uuid: ` + gpu2 + `
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
`

var allocations = []fake.Device{
	{Namespace: "ml", Pod: "train-0", Container: "trainer", Resource: "nvidia.com/gpu", IDs: []string{gpu0}},
	// Index-style ID, as the device plugin writes with deviceIDStrategy=index.
	{Namespace: "ml", Pod: "idle-0", Container: "notebook", Resource: "nvidia.com/gpu", IDs: []string{"2"}},
}

func TestAllocationSignalsAndKubeletOutage(t *testing.T) {
	dir := testkit.SocketDir(t)
	sock := filepath.Join(dir, "kubelet.sock")
	cfg := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(cfg, []byte(node), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := fake.Start(sock, allocations, map[string][]string{"nvidia.com/gpu": {gpu0, gpu1, gpu2}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			srv.Stop()
		}
	}()
	exp := e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+cfg, "--kubelet.pod-resources-endpoint=unix://"+sock,
		"--kubelet.refresh-interval=100ms")
	addr := exp.Addr

	// Allocations arrive with the first refresh.
	var fams map[string]*dto.MetricFamily
	// kubelet_up and the allocation series are gathered one after the other, so a scrape during the first refresh
	// can have the one without the other. The unmapped-devices gauge is written only with the allocations.
	waitFor(t, "kubelet_up 1 and the allocations read", func() bool {
		fams = scrape(t, addr)
		return values(fams, "gpu_pod_exporter_kubelet_up", nil) == "1" &&
			values(fams, "gpu_pod_exporter_kubelet_unmapped_devices", nil) != ""
	})

	// train-0 uses GPU 1 without a request; its use of GPU 0 is allocated. Nothing else is unrequested.
	if got := series(fams, "gpu_unrequested_use"); got != `gpu="1",namespace="ml",pod="train-0",container="trainer" 1` {
		t.Errorf("gpu_unrequested_use:\n%s\nwant only GPU 1 for ml/train-0", got)
	}
	// idle-0 holds GPU 2 (by index) with no process; train-0 holds GPU 0 and runs there.
	if got := values(fams, "gpu_allocation_processes", map[string]string{"pod": "idle-0", "gpu": "2", "uuid": gpu2, "container": "notebook", "resource": "nvidia.com/gpu"}); got != "0" {
		t.Errorf("gpu_allocation_processes for idle-0 on GPU 2 = %q, want 0 (allocated and idle)", got)
	}
	if got := values(fams, "gpu_allocation_processes", map[string]string{"pod": "train-0", "gpu": "0", "uuid": gpu0}); got != "1" {
		t.Errorf("gpu_allocation_processes for train-0 on GPU 0 = %q, want 1", got)
	}
	if got := len(fams["gpu_allocation_info"].GetMetric()); got != 2 {
		t.Errorf("%d gpu_allocation_info series, want 2", got)
	}
	if got := values(fams, "gpu_workloads", map[string]string{"gpu": "1"}); got != "1" {
		t.Errorf("gpu_workloads on GPU 1 = %q, want 1", got)
	}
	if got := values(fams, "gpu_pod_exporter_kubelet_allocatable_devices", map[string]string{"resource": "nvidia.com/gpu"}); got != "3" {
		t.Errorf("allocatable nvidia.com/gpu = %q, want 3", got)
	}

	// The kubelet goes away: allocation series and the signal vanish, the self-metric says so, the GPUs are
	// still served, and the log says it once however many refreshes fail.
	srv.Stop()
	stopped = true
	waitFor(t, "kubelet_up 0 after the kubelet stopped", func() bool {
		fams = scrape(t, addr)
		return values(fams, "gpu_pod_exporter_kubelet_up", nil) == "0"
	})
	// The scrape that first saw kubelet_up 0 may have read the allocations just before the failed refresh (the
	// collectors of one scrape run concurrently); every scrape after it sees the kubelet down.
	fams = scrape(t, addr)
	for _, name := range []string{"gpu_allocation_info", "gpu_allocation_processes", "gpu_unrequested_use"} {
		if n := len(fams[name].GetMetric()); n != 0 {
			t.Errorf("%d %s series with the kubelet down, want none", n, name)
		}
	}
	if n := len(fams["gpu_info"].GetMetric()); n != 3 {
		t.Errorf("%d gpu_info series with the kubelet down, want 3", n)
	}
	if n := len(fams["gpu_workload_memory_used_bytes"].GetMetric()); n != 2 {
		t.Errorf("%d gpu_workload_memory_used_bytes series with the kubelet down, want 2", n)
	}
	if got := values(fams, "gpu_pod_exporter_source_up", nil); got != "1" {
		t.Errorf("source_up = %q with the kubelet down, want 1", got)
	}
	errorsAt := func() float64 {
		var v float64
		fmt.Sscan(values(scrape(t, addr), "gpu_pod_exporter_kubelet_errors_total", map[string]string{"call": "list"}), &v)
		return v
	}
	base := errorsAt()
	waitFor(t, "several failed refreshes", func() bool { return errorsAt() >= base+5 })
	log := exp.Output()
	if up, down := strings.Count(log, "reading GPU allocations from the kubelet"), strings.Count(log, "kubelet PodResources API unavailable"); up != 1 || down != 1 {
		t.Errorf("kubelet logged up %d and unavailable %d times, want once each:\n%s", up, down, log)
	}

	// It comes back on the same socket, as a restarted kubelet does.
	srv, err = fake.Start(sock, allocations, nil)
	if err != nil {
		t.Fatal(err)
	}
	stopped = false
	waitFor(t, "allocations after the kubelet restarted", func() bool {
		return len(scrape(t, addr)["gpu_unrequested_use"].GetMetric()) == 1
	})
}

// Without the socket at all (not a Kubernetes node) the exporter serves everything else and says the source is
// unavailable.
func TestNoKubeletSocket(t *testing.T) {
	dir := testkit.SocketDir(t)
	cfg := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(cfg, []byte(node), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+cfg, "--kubelet.pod-resources-endpoint="+filepath.Join(dir, "absent.sock")).Addr
	var fams map[string]*dto.MetricFamily
	waitFor(t, "kubelet_up 0", func() bool {
		fams = scrape(t, addr)
		return values(fams, "gpu_pod_exporter_kubelet_up", nil) == "0"
	})
	if n := len(fams["gpu_info"].GetMetric()); n != 3 {
		t.Errorf("%d gpu_info series without a kubelet, want 3", n)
	}
	if n := len(fams["gpu_allocation_info"].GetMetric()) + len(fams["gpu_unrequested_use"].GetMetric()); n != 0 {
		t.Errorf("%d allocation series without a kubelet, want none", n)
	}
}

// scrape parses the exporter's /metrics.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	_, fams := e2eutil.Scrape(t, addr)
	return fams
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, 20*time.Second, what, cond)
}

// values returns the values of the family's series that carry all of want, space-separated.
func values(fams map[string]*dto.MetricFamily, name string, want map[string]string) string {
	var out []string
	for _, m := range fams[name].GetMetric() {
		if matches(m, want) {
			out = append(out, fmt.Sprint(e2eutil.Value(m)))
		}
	}
	return strings.Join(out, " ")
}

// series renders a family's series as `gpu=…,namespace=…,pod=…,container=… value`, one a line.
func series(fams map[string]*dto.MetricFamily, name string) string {
	var out []string
	for _, m := range fams[name].GetMetric() {
		out = append(out, fmt.Sprintf("gpu=%q,namespace=%q,pod=%q,container=%q %v",
			e2eutil.Label(m, "gpu"), e2eutil.Label(m, "namespace"), e2eutil.Label(m, "pod"), e2eutil.Label(m, "container"), e2eutil.Value(m)))
	}
	return strings.Join(out, "\n")
}

func matches(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		if e2eutil.Label(m, k) != v {
			return false
		}
	}
	return true
}
