package kubelet_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet/fake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

var fixture = []fake.Device{
	{Namespace: "ml", Pod: "train-0", Container: "trainer", Resource: "nvidia.com/gpu", IDs: []string{"GPU-aaaa", "GPU-bbbb::3"}},
	{Namespace: "ml", Pod: "train-0", Container: "sidecar", Resource: "cpu-ish.example.com/thing", IDs: []string{"x"}},
	{Namespace: "ml", Pod: "infer-0", Container: "server", Resource: "nvidia.com/mig-1g.10gb", IDs: []string{"MIG-cccc"}},
	{Namespace: "other", Pod: "p", Container: "c", Resource: "example.com/fpga", IDs: []string{"fpga0"}},
}

func TestRefreshReadsGPUResourcesOnly(t *testing.T) {
	sock := filepath.Join(testkit.SocketDir(t), "kubelet.sock")
	srv, err := fake.Start(sock, fixture, map[string][]string{
		"nvidia.com/gpu": {"GPU-aaaa", "GPU-bbbb::0", "GPU-bbbb::1"}, "example.com/fpga": {"fpga0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	c, err := kubelet.New(kubelet.Config{Endpoint: "unix://" + sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.Allocations(); ok {
		t.Fatal("allocations available before the first refresh")
	}
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, ok := c.Allocations()
	if !ok {
		t.Fatal("allocations unavailable after a successful refresh")
	}
	var lines []string
	for _, a := range got.Items {
		lines = append(lines, strings.Join([]string{a.Namespace, a.Pod, a.Container, a.Resource, a.DeviceID, a.Device.UUID}, " "))
	}
	want := []string{
		"ml train-0 trainer nvidia.com/gpu GPU-aaaa GPU-aaaa",
		"ml train-0 trainer nvidia.com/gpu GPU-bbbb::3 GPU-bbbb",
		"ml infer-0 server nvidia.com/mig-1g.10gb MIG-cccc MIG-cccc",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("allocations:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP gpu_pod_exporter_kubelet_allocatable_devices Devices of each GPU resource that the kubelet can allocate on this node (GetAllocatableResources).
# TYPE gpu_pod_exporter_kubelet_allocatable_devices gauge
gpu_pod_exporter_kubelet_allocatable_devices{resource="nvidia.com/gpu"} 3
# HELP gpu_pod_exporter_kubelet_up 1 if the last read of the kubelet PodResources API succeeded, 0 if it failed (no socket, kubelet down); allocation series are absent while 0.
# TYPE gpu_pod_exporter_kubelet_up gauge
gpu_pod_exporter_kubelet_up 1
`), "gpu_pod_exporter_kubelet_up", "gpu_pod_exporter_kubelet_allocatable_devices"); err != nil {
		t.Error(err)
	}
}

func TestConfiguredResourceGlobs(t *testing.T) {
	sock := filepath.Join(testkit.SocketDir(t), "kubelet.sock")
	srv, err := fake.Start(sock, fixture, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	c, err := kubelet.New(kubelet.Config{Endpoint: sock, Resources: []string{"example.com/*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, _ := c.Allocations()
	if len(got.Items) != 1 || got.Items[0].DeviceID != "fpga0" {
		t.Errorf("with resources example.com/*: got %+v, want only fpga0", got.Items)
	}
	if _, err := kubelet.New(kubelet.Config{Endpoint: sock, Resources: []string{"nvidia.com/["}}); err == nil {
		t.Error("a malformed glob was accepted")
	}
	if _, err := kubelet.New(kubelet.Config{Endpoint: "tcp://10.0.0.1:10250"}); err == nil {
		t.Error("a non-unix endpoint was accepted")
	}
}

// The kubelet going away, coming back, and a socket that was never there: allocations are unavailable while it is
// down, each state change is logged once, and the background loop recovers by itself.
func TestKubeletDownAndBack(t *testing.T) {
	sock := filepath.Join(testkit.SocketDir(t), "kubelet.sock")
	logs := &testkit.SyncBuffer{}
	c, err := kubelet.New(kubelet.Config{
		Endpoint: sock, Interval: 20 * time.Millisecond, Timeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// No socket: unavailable, one log line however many refreshes.
	testkit.WaitFor(t, 10*time.Second, "refreshes without a socket", func() bool {
		return strings.Count(logs.String(), "\n") >= 1 && listErrors(t, c) >= 5
	})
	if _, ok := c.Allocations(); ok {
		t.Fatal("allocations available without a socket")
	}
	if n := strings.Count(logs.String(), "no kubelet PodResources socket"); n != 1 {
		t.Errorf("missing socket logged %d times, want once:\n%s", n, logs.String())
	}

	srv, err := fake.Start(sock, fixture, nil)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "allocations after the kubelet started", func() bool { _, ok := c.Allocations(); return ok })
	if up := gaugeValue(t, c, "gpu_pod_exporter_kubelet_up"); up != 1 {
		t.Errorf("kubelet_up = %v with the kubelet answering", up)
	}

	srv.Stop()
	testkit.WaitFor(t, 10*time.Second, "allocations to become unavailable", func() bool { _, ok := c.Allocations(); return !ok })
	if up := gaugeValue(t, c, "gpu_pod_exporter_kubelet_up"); up != 0 {
		t.Errorf("kubelet_up = %v with the kubelet gone", up)
	}
	if got, _ := c.Allocations(); len(got.Items) != 0 {
		t.Errorf("stale allocations kept while unavailable: %+v", got.Items)
	}
	// Comes back on the same path, as a restarted kubelet does.
	srv, err = fake.Start(sock, fixture, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	testkit.WaitFor(t, 10*time.Second, "allocations after the kubelet restarted", func() bool { _, ok := c.Allocations(); return ok })
	// Let a few more refreshes happen: a steady state must not log.
	calls := srv.ListCalls()
	testkit.WaitFor(t, 10*time.Second, "more refreshes", func() bool { return srv.ListCalls() >= calls+5 })
	log := logs.String()
	if n := strings.Count(log, "reading GPU allocations from the kubelet"); n != 2 {
		t.Errorf("recovery logged %d times, want 2 (start, restart):\n%s", n, log)
	}
	if n := strings.Count(log, "\n"); n != 4 {
		t.Errorf("want 4 log lines (no socket, up, down, up), got %d:\n%s", n, log)
	}
}

// A kubelet that stops fails one way, then another: its connection drops, then its socket goes. That is one outage,
// logged once.
func TestOutageLoggedOnceWhateverItsCause(t *testing.T) {
	sock := filepath.Join(testkit.SocketDir(t), "kubelet.sock")
	logs := &testkit.SyncBuffer{}
	c, err := kubelet.New(kubelet.Config{Endpoint: sock, Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv, err := fake.Start(sock, fixture, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	// Something that is not the kubelet's socket is still at its path: a failure other than a missing socket.
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Refresh(context.Background()); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("refresh with a file at the socket's path: %v, want a failure other than a missing socket", err)
	}
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if err := c.Refresh(context.Background()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("refresh without a socket: %v, want a missing socket", err)
	}
	if n := strings.Count(logs.String(), "kubelet PodResources API unavailable"); n != 1 {
		t.Errorf("one outage logged %d times, want once:\n%s", n, logs.String())
	}
}

func listErrors(t *testing.T, c *kubelet.Client) float64 {
	t.Helper()
	return metricValue(t, c, "gpu_pod_exporter_kubelet_errors_total", `call="list"`)
}

func gaugeValue(t *testing.T, c *kubelet.Client, name string) float64 {
	t.Helper()
	return metricValue(t, c, name, "")
}

// metricValue reads one series of the client's self-metrics from its text exposition.
func metricValue(t *testing.T, c *kubelet.Client, name, labels string) float64 {
	t.Helper()
	out, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, name) && strings.Contains(line, labels) {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v); err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no %s{%s} in\n%s", name, labels, out)
	return 0
}

// DRA claims of the shapes NVIDIA's DRA driver allocates (device names from k8s-dra-driver-gpu
// cmd/gpu-kubelet-plugin/deviceinfo.go and mig.go, CanonicalName), next to a device plugin GPU in the same pod:
// a whole GPU, a MIG device, a claim shared by two pods, another driver's device, a passthrough GPU and a name of
// no known form.
func TestRefreshReadsDRAClaims(t *testing.T) {
	sock := filepath.Join(testkit.SocketDir(t), "kubelet.sock")
	shared := &fake.Claim{Name: "shared-gpu", Namespace: "ml", Pool: "node-a", UID: "6f1d2c3b-0000-4000-8000-000000000001"}
	srv, err := fake.Start(sock, []fake.Device{
		{Namespace: "ml", Pod: "train-0", Container: "trainer", Resource: "nvidia.com/gpu", IDs: []string{"GPU-aaaa"}},
		{Namespace: "ml", Pod: "train-0", Container: "trainer", Resource: "gpu.nvidia.com", IDs: []string{"gpu-1"},
			Claim: &fake.Claim{Name: "train-0-gpu-x7k2p", Namespace: "ml", Pool: "node-a"}},
		{Namespace: "ml", Pod: "infer-0", Container: "server", Resource: "gpu.nvidia.com", IDs: []string{"gpu-2-mig-1g10gb-19-6"},
			Claim: &fake.Claim{Name: "infer-0-mig-4bq9z", Namespace: "ml", Pool: "node-a"}},
		{Namespace: "ml", Pod: "web-0", Container: "app", Resource: "gpu.nvidia.com", IDs: []string{"gpu-3"}, Claim: shared},
		{Namespace: "ml", Pod: "web-1", Container: "app", Resource: "gpu.nvidia.com", IDs: []string{"gpu-3"}, Claim: shared},
		{Namespace: "net", Pod: "router", Container: "r", Resource: "dra.net", IDs: []string{"eth1"},
			Claim: &fake.Claim{Name: "nic", Namespace: "net", Pool: "node-a"}},
		{Namespace: "vm", Pod: "virt-launcher", Container: "compute", Resource: "gpu.nvidia.com", IDs: []string{"gpu-vfio-0"},
			Claim: &fake.Claim{Name: "passthrough", Namespace: "vm", Pool: "node-a"}},
		{Namespace: "ml", Pod: "odd", Container: "c", Resource: "gpu.nvidia.com", IDs: []string{"gpu-0-mig-something"},
			Claim: &fake.Claim{Name: "odd", Namespace: "ml", Pool: "node-a"}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	c, err := kubelet.New(kubelet.Config{Endpoint: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, _ := c.Allocations()
	var lines []string
	for _, a := range got.Items {
		line := strings.Join([]string{a.Namespace, a.Pod, a.Container, a.Resource, a.DeviceID}, " ")
		if a.Claim != nil {
			line += fmt.Sprintf(" claim=%s/%s pool=%s minor=%d", a.Claim.Namespace, a.Claim.Name, a.Claim.Pool, a.Device.Minor)
		}
		if a.Device.MIG != nil {
			line += fmt.Sprintf(" mig=%+v", *a.Device.MIG)
		}
		lines = append(lines, line)
	}
	want := []string{
		"ml train-0 trainer nvidia.com/gpu GPU-aaaa",
		"ml train-0 trainer gpu.nvidia.com gpu-1 claim=ml/train-0-gpu-x7k2p pool=node-a minor=1",
		"ml infer-0 server gpu.nvidia.com gpu-2-mig-1g10gb-19-6 claim=ml/infer-0-mig-4bq9z pool=node-a minor=2 mig={Profile:1g10gb ProfileID:19 Start:6 Size:0}",
		"ml web-0 app gpu.nvidia.com gpu-3 claim=ml/shared-gpu pool=node-a minor=3",
		"ml web-1 app gpu.nvidia.com gpu-3 claim=ml/shared-gpu pool=node-a minor=3",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("allocations:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	for reason, want := range map[string]float64{"other_driver": 1, "vfio": 1, "unknown_name": 1} {
		if got := metricValue(t, c, "gpu_pod_exporter_kubelet_dra_devices_ignored", `reason="`+reason+`"`); got != want {
			t.Errorf("dra_devices_ignored{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	// Gone with the kubelet, like the allocations.
	srv.Stop()
	if err := c.Refresh(context.Background()); err == nil {
		t.Fatal("refresh succeeded with the kubelet gone")
	}
	if n := testutil.CollectAndCount(c, "gpu_pod_exporter_kubelet_dra_devices_ignored"); n != 0 {
		t.Errorf("dra_devices_ignored: %d series with the kubelet down, want none", n)
	}
}

// A kubelet that lists 100,000 GPU allocations, as one gone wrong might: the client reads MaxAllocations of them,
// the first listed, says how many it left out, and logs it once while it lasts and once when it ends.
func TestAllocationsAreCapped(t *testing.T) {
	const n = 100000
	many := make([]fake.Device, n)
	for i := range many {
		many[i] = fake.Device{Namespace: "ml", Pod: fmt.Sprintf("notebook-%d", i), Container: "notebook",
			Resource: "nvidia.com/gpu", IDs: []string{fmt.Sprintf("GPU-aaaa::%d", i)}}
	}
	sock := filepath.Join(testkit.SocketDir(t), "kubelet.sock")
	srv, err := fake.Start(sock, many, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	logs := &testkit.SyncBuffer{}
	c, err := kubelet.New(kubelet.Config{Endpoint: sock, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 2 {
		if err := c.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		got, _ := c.Allocations()
		if len(got.Items) != kubelet.MaxAllocations || got.Items[len(got.Items)-1].Pod != fmt.Sprintf("notebook-%d", kubelet.MaxAllocations-1) {
			t.Fatalf("%d allocations read, want the first %d", len(got.Items), kubelet.MaxAllocations)
		}
		if got := gaugeValue(t, c, "gpu_pod_exporter_kubelet_allocations_dropped"); got != n-kubelet.MaxAllocations {
			t.Errorf("gpu_pod_exporter_kubelet_allocations_dropped %v, want %d", got, n-kubelet.MaxAllocations)
		}
	}
	srv.Set(many[:10])
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Allocations(); len(got.Items) != 10 {
		t.Errorf("%d allocations read, want 10", len(got.Items))
	}
	if got := gaugeValue(t, c, "gpu_pod_exporter_kubelet_allocations_dropped"); got != 0 {
		t.Errorf("gpu_pod_exporter_kubelet_allocations_dropped %v, want 0", got)
	}
	if over, under := strings.Count(logs.String(), "more GPU allocations than the exporter reads"),
		strings.Count(logs.String(), "within the limit again"); over != 1 || under != 1 {
		t.Errorf("logged the cap %d times and its end %d times, want once each:\n%s", over, under, logs)
	}
}
