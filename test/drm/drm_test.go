//go:build e2e

// Package drm runs the real binary on fake AMD and Intel nodes (internal/gpu/drm/drmfake: sysfs, the DRM parts of
// procfs, KFD, written in the kernel's layout) with --gpu.source=drm, and on a mixed node with --gpu.source=auto
// and a fake nvidia-smi: every family the kernel gives, per-process memory and engine use, per-pod attribution
// (cgroups plus a CRI that names the pods), and the allocation signals from AMD's and Intel's device plugin IDs
// through a real PodResources server.
package drm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet/fake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

var binary string

func TestMain(m *testing.M) { e2eutil.Main(m, &binary) }

// pod is a Kubernetes container whose processes the fake node runs.
type pod struct {
	namespace, name, container string
	uid, containerID           string
}

func newPod(namespace, name, container string, n int) pod {
	return pod{namespace: namespace, name: name, container: container,
		uid: fmt.Sprintf("4d1c9a2e-7b3f-4e58-9a06-%012d", n), containerID: fmt.Sprintf("%064x", 0xd1c0ffee00+n)}
}

// cgroup is the pod container's /proc/<pid>/cgroup on a cgroup v1 hybrid node with the systemd driver, as the
// kubelet and containerd make it.
func (p pod) cgroup() string {
	uid := strings.ReplaceAll(p.uid, "-", "_")
	scope := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice/cri-containerd-" + p.containerID + ".scope"
	var b strings.Builder
	for i, ctl := range []string{"memory", "cpu,cpuacct", "devices", "pids"} {
		fmt.Fprintf(&b, "%d:%s:%s\n", 5-i, ctl, scope)
	}
	b.WriteString("1:name=systemd:" + scope + "\n0::/\n")
	return b.String()
}

// cri is a container runtime that names the pods' containers, as containerd does from the kubelet's labels.
type cri struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	pods map[string]pod // by container ID
}

func (c *cri) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "containerd", RuntimeVersion: "1.7.24"}, nil
}

func (c *cri) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	p, ok := c.pods[r.GetContainerId()]
	if !ok {
		return nil, errNotFound
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{
		Id: p.containerID, Metadata: &runtimeapi.ContainerMetadata{Name: p.container},
		Labels: map[string]string{"io.kubernetes.pod.name": p.name, "io.kubernetes.pod.namespace": p.namespace,
			"io.kubernetes.pod.uid": p.uid, "io.kubernetes.container.name": p.container},
	}}, nil
}

func (c *cri) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	uid := r.GetFilter().GetLabelSelector()["io.kubernetes.pod.uid"]
	for _, p := range c.pods {
		if p.uid == uid {
			return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{
				Id: "sandbox-" + p.uid, Metadata: &runtimeapi.PodSandboxMetadata{Name: p.name, Namespace: p.namespace, Uid: p.uid},
			}}}, nil
		}
	}
	return &runtimeapi.ListPodSandboxResponse{}, nil
}

var errNotFound = grpcNotFound()

// node is a written fake node, the runtime and kubelet that go with it, and the exporter reading it.
type node struct {
	dir, sysfs, procfs string
	sock               string // the fake kubelet's PodResources socket
	cri                string
	kubelet            *fake.Server
}

// writeNode writes n, each process's comm, stat and cgroup (its pod's, or a system service's), and serves a CRI
// that names the pods and a kubelet with the allocations.
func writeNode(t *testing.T, n *drmfake.Node, comms map[uint32]string, pods map[uint32]pod, allocs []fake.Device) *node {
	t.Helper()
	dir := t.TempDir()
	sysfs, procfs, err := n.Write(dir)
	if errors.Is(err, drmfake.ErrNeedsRoot) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	byContainer := make(map[string]pod)
	for _, p := range n.Processes {
		cg := "0::/system.slice/cron.service\n"
		if pd, ok := pods[p.PID]; ok {
			cg = pd.cgroup()
			byContainer[pd.containerID] = pd
		}
		comm := comms[p.PID]
		if comm == "" {
			comm = "bash"
		}
		if err := e2eutil.WriteProc(procfs, p.PID, comm, cg); err != nil {
			t.Fatal(err)
		}
	}
	socks := testkit.SocketDir(t)
	nd := &node{dir: dir, sysfs: sysfs, procfs: procfs, sock: filepath.Join(socks, "kubelet.sock"),
		cri: filepath.Join(socks, "cri.sock")}
	testkit.ServeGRPC(t, nd.cri, func(s *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(s, &cri{pods: byContainer}) })
	nd.kubelet, err = fake.Start(nd.sock, allocs, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nd.kubelet.Stop)
	return nd
}

// start runs the exporter on the node with the source's flags.
func (n *node) start(t *testing.T, args ...string) string {
	t.Helper()
	return e2eutil.StartExporter(t, binary, append([]string{"--path.sysfs=" + n.sysfs, "--path.procfs=" + n.procfs,
		"--runtime.endpoint=unix://" + n.cri, "--docker.host=unix://" + filepath.Join(n.dir, "no-docker.sock"),
		"--podman.host=unix://" + filepath.Join(n.dir, "no-podman.sock"),
		"--kubelet.pod-resources-endpoint=unix://" + n.sock, "--kubelet.refresh-interval=100ms"}, args...)...).Addr
}

// series finds the series of a family whose labels include want, and returns their values.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) []float64 {
	var out []float64
	for _, m := range fams[name].GetMetric() {
		ok := true
		for k, v := range want {
			if e2eutil.Label(m, k) != v {
				ok = false
			}
		}
		if ok {
			out = append(out, e2eutil.Value(m))
		}
	}
	return out
}

// one is the value of the one series of a family with these labels.
func one(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	t.Helper()
	vs := series(fams, name, want)
	if len(vs) != 1 {
		t.Errorf("%s%v: %d series, want 1", name, want, len(vs))
		return 0, false
	}
	return vs[0], true
}

func expect(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string, value float64) {
	t.Helper()
	if v, ok := one(t, fams, name, want); ok && v != value {
		t.Errorf("%s%v = %v, want %v", name, want, v, value)
	}
}

func gpuLabels(i int, uuid string) map[string]string {
	return map[string]string{"gpu": strconv.Itoa(i), "uuid": uuid}
}

// settled scrapes until the kubelet's allocations are read and every pod process is named.
func settled(t *testing.T, addr string, pods int) map[string]*dto.MetricFamily {
	t.Helper()
	var fams map[string]*dto.MetricFamily
	testkit.WaitFor(t, 30*time.Second, "the allocations and the pods' names", func() bool {
		_, f, err := e2eutil.TryScrape(addr)
		if err != nil {
			return false
		}
		fams = f
		named := 0
		for _, m := range f["gpu_process_memory_used_bytes"].GetMetric() {
			if e2eutil.Label(m, "pod") != "" {
				named++
			}
		}
		return len(series(f, "gpu_pod_exporter_kubelet_up", map[string]string{})) == 1 &&
			series(f, "gpu_pod_exporter_kubelet_up", nil)[0] == 1 && len(f["gpu_allocation_info"].GetMetric()) > 0 &&
			named >= pods
	})
	return fams
}

// The MI300X node, read with --gpu.source=drm: every family amdgpu gives, with the fixture's values; KFD's compute
// processes with their VRAM and their pods; a client two processes hold counted once; the video pod's decoder use
// from the second reading; an idle allocation and a use no allocation covers, from amd.com/gpu's PCI addresses.
func TestMI300XNode(t *testing.T) {
	mi := drmfake.NewMI300X()
	train := newPod("llm", "llama-pretrain-0", "trainer", 1)
	vllm := newPod("inference", "vllm-llama-70b-0", "vllm", 2)
	video := newPod("media", "video-ingest-7f9c4-kx2lp", "decoder", 3)
	eval := newPod("research", "eval-sweep-12", "eval", 4)
	pods := map[uint32]pod{4101: train, 4102: train, 4103: train, 4104: train, 4201: vllm, 4401: video, 4402: video, 4501: eval}
	comms := map[uint32]string{}
	for _, p := range mi.Processes {
		comms[p.PID] = p.Comm
	}
	pci := func(i int) string { return mi.GPUs[i].PCI }
	allocs := []fake.Device{
		{Namespace: "llm", Pod: "llama-pretrain-0", Container: "trainer", Resource: "amd.com/gpu", IDs: []string{pci(0), pci(1), pci(2), pci(3)}},
		{Namespace: "inference", Pod: "vllm-llama-70b-0", Container: "vllm", Resource: "amd.com/gpu", IDs: []string{pci(4)}},
		{Namespace: "research", Pod: "notebook-ines-0", Container: "notebook", Resource: "amd.com/gpu", IDs: []string{pci(5)}},
		{Namespace: "media", Pod: "video-ingest-7f9c4-kx2lp", Container: "decoder", Resource: "amd.com/gpu", IDs: []string{pci(6)}},
	}
	n := writeNode(t, mi.Node(false), comms, pods, allocs)
	addr := n.start(t, "--gpu.source=drm")
	fams := settled(t, addr, 7)

	if got := len(fams["gpu_info"].GetMetric()); got != 8 {
		t.Errorf("%d GPUs, want the 8 MI300X (not the BMC's display controller)", got)
	}
	for i, g := range mi.GPUs {
		l := gpuLabels(i, g.UUID)
		info := map[string]string{"gpu": strconv.Itoa(i), "uuid": g.UUID, "vendor": "amd", "name": drmfake.MI300XName,
			"pci_bus_id": g.PCI, "driver_version": drmfake.MI300XDriver, "cuda_version": "", "simulated": "false"}
		expect(t, fams, "gpu_info", info, 1)
		expect(t, fams, "gpu_memory_total_bytes", l, drmfake.MI300XVRAMTotal)
		expect(t, fams, "gpu_memory_used_bytes", l, float64(g.VRAMUsed))
		expect(t, fams, "gpu_memory_free_bytes", l, drmfake.MI300XVRAMTotal-float64(g.VRAMUsed))
		expect(t, fams, "gpu_utilization_ratio", l, float64(g.Busy)/100)
		expect(t, fams, "gpu_memory_utilization_ratio", l, float64(g.MemBusy)/100)
		expect(t, fams, "gpu_temperature_celsius", l, g.JunctionC)
		expect(t, fams, "gpu_memory_temperature_celsius", l, g.MemC)
		expect(t, fams, "gpu_power_usage_watts", l, g.PowerW)
		expect(t, fams, "gpu_power_limit_watts", l, drmfake.MI300XPowerCapW)
		expect(t, fams, "gpu_power_management_limit_watts", l, drmfake.MI300XPowerCapW)
		expect(t, fams, "gpu_clock_hertz", map[string]string{"gpu": strconv.Itoa(i), "clock": "graphics"}, float64(g.SclkMHz)*1e6)
		expect(t, fams, "gpu_clock_hertz", map[string]string{"gpu": strconv.Itoa(i), "clock": "memory"}, float64(g.MclkMHz)*1e6)
		expect(t, fams, "gpu_pcie_link_generation", l, 5)
		expect(t, fams, "gpu_pcie_link_max_generation", l, 5)
		expect(t, fams, "gpu_pcie_link_width", l, 16)
		expect(t, fams, "gpu_pcie_link_max_width", l, 16)
		expect(t, fams, "gpu_pcie_replays_total", l, 0)
	}
	// What amdgpu does not publish is absent, never 0.
	for _, name := range []string{"gpu_energy_consumption_joules_total", "gpu_fan_speed_ratio", "gpu_encoder_utilization_ratio",
		"gpu_ecc_errors_total", "gpu_performance_state", "gpu_memory_reserved_bytes"} {
		if n := len(fams[name].GetMetric()); n != 0 {
			t.Errorf("%d %s series on an AMD node, which has none", n, name)
		}
	}
	for _, p := range mi.Processes {
		if p.SharesWith != 0 {
			if vs := series(fams, "gpu_process_memory_used_bytes", map[string]string{"pid": strconv.Itoa(int(p.PID))}); len(vs) != 0 {
				t.Errorf("PID %d holds only PID %d's client, counted for %d once: %v", p.PID, p.SharesWith, p.SharesWith, vs)
			}
			continue
		}
		pd := pods[p.PID]
		want := map[string]string{"pid": strconv.Itoa(int(p.PID)), "gpu": strconv.Itoa(p.GPU), "process_name": p.Comm,
			"namespace": pd.namespace, "pod": pd.name, "container": pd.container, "pod_uid": pd.uid, "container_id": pd.containerID}
		expect(t, fams, "gpu_process_memory_used_bytes", want, float64(p.Memory))
	}
	expect(t, fams, "gpu_workload_memory_used_bytes", map[string]string{"gpu": "0", "pod": "llama-pretrain-0"}, float64(mi.Processes[0].Memory))
	expect(t, fams, "gpu_workloads", gpuLabels(5, mi.GPUs[5].UUID), 0)

	// The allocation signals: the notebook holds GPU 5 and runs nothing; eval-sweep-12 runs on GPU 7 without an
	// allocation; the trainer runs on each of its four.
	expect(t, fams, "gpu_allocation_processes", map[string]string{"gpu": "5", "pod": "notebook-ines-0", "resource": "amd.com/gpu"}, 0)
	for i := range 4 {
		expect(t, fams, "gpu_allocation_processes", map[string]string{"gpu": strconv.Itoa(i), "pod": "llama-pretrain-0"}, 1)
	}
	if got := series(fams, "gpu_unrequested_use", nil); len(got) != 1 {
		t.Errorf("%d gpu_unrequested_use series, want eval-sweep-12's on GPU 7 only", len(got))
	}
	expect(t, fams, "gpu_unrequested_use", map[string]string{"gpu": "7", "namespace": "research", "pod": "eval-sweep-12", "container": "eval"}, 1)
	expect(t, fams, "gpu_pod_exporter_kubelet_unmapped_devices", nil, 0)

	// Engine use from the second reading on: the decoder's busy time grows; ROCm's compute processes have none.
	if err := mi.Node(true).RewriteFDInfo(n.procfs); err != nil {
		t.Fatal(err)
	}
	decoder := map[string]string{"pid": "4401", "gpu": "6", "pod": video.name}
	testkit.WaitFor(t, 10*time.Second, "the video pod's decoder use", func() bool {
		_, f, err := e2eutil.TryScrape(addr)
		if err == nil {
			fams = f
		}
		vs := series(fams, "gpu_process_decoder_utilization_ratio", decoder)
		return len(vs) == 1 && vs[0] > 0
	})
	if v, _ := one(t, fams, "gpu_process_decoder_utilization_ratio", decoder); v > 1 {
		t.Errorf("decoder use %v above 1", v)
	}
	expect(t, fams, "gpu_process_sm_utilization_ratio", decoder, 0)
	expect(t, fams, "gpu_process_encoder_utilization_ratio", decoder, 0)
	if vs := series(fams, "gpu_process_sm_utilization_ratio", map[string]string{"pid": "4101"}); len(vs) != 0 {
		t.Errorf("a ROCm process has an SM utilization %v: KFD's work does not show in fdinfo, so it is unknown", vs)
	}
	expect(t, fams, "gpu_pod_exporter_source_up", map[string]string{"source": "drm"}, 1)
}

// The xe node, read with --gpu.source=drm: engine use as busy cycles over total cycles (exact, on the GPU's own
// clock), power from the energy counter's rate, and gpu.intel.com/xe's card IDs joined to the GPUs.
func TestXeNode(t *testing.T) {
	xe := drmfake.NewXe()
	compute := newPod("ml", "embedder-0", "embed", 11)
	media := newPod("media", "transcode-0", "gst", 12)
	other := newPod("ml", "reranker-0", "rerank", 13)
	pods := map[uint32]pod{5101: compute, 5201: media, 5202: media, 5301: other}
	comms := map[uint32]string{}
	for _, p := range xe.Processes {
		comms[p.PID] = p.Comm
	}
	allocs := []fake.Device{
		{Namespace: "ml", Pod: "embedder-0", Container: "embed", Resource: "gpu.intel.com/xe", IDs: []string{"card0-0"}},
		{Namespace: "media", Pod: "transcode-0", Container: "gst", Resource: "gpu.intel.com/xe", IDs: []string{"card1-0"}},
	}
	// The energy counters grow by a millisecond of each card's power: the exporter divides the growth by the real time
	// between its readings, which the test does not set, and a growth of seconds over a scrape's milliseconds would be
	// kilowatts, which it leaves out as implausible.
	const interval = 0.001
	n := writeNode(t, xe.Node(false, interval), comms, pods, allocs)
	addr := n.start(t, "--gpu.source=drm")
	fams := settled(t, addr, 4)
	for i, g := range xe.GPUs {
		l := gpuLabels(i, g.UUID)
		expect(t, fams, "gpu_info", map[string]string{"gpu": strconv.Itoa(i), "vendor": "intel", "name": "Intel GPU 8086:e20b",
			"pci_bus_id": g.PCI, "driver_version": drmfake.XeKernel}, 1)
		expect(t, fams, "gpu_memory_total_bytes", l, drmfake.XeVRAMTotal)
		expect(t, fams, "gpu_temperature_celsius", l, g.PkgC)
		expect(t, fams, "gpu_memory_temperature_celsius", l, g.VRAMC)
		expect(t, fams, "gpu_energy_consumption_joules_total", l, float64(g.EnergyJ))
		expect(t, fams, "gpu_power_limit_watts", l, g.PowerLimitW)
		expect(t, fams, "gpu_clock_hertz", map[string]string{"gpu": strconv.Itoa(i), "clock": "graphics"}, float64(g.FreqMHz)*1e6)
		expect(t, fams, "gpu_pcie_link_generation", l, 4)
		expect(t, fams, "gpu_pcie_link_width", l, 8)
	}
	for _, name := range []string{"gpu_memory_used_bytes", "gpu_utilization_ratio"} {
		if n := len(fams[name].GetMetric()); n != 0 {
			t.Errorf("%d %s series: xe publishes none", n, name)
		}
	}
	for _, p := range xe.Processes {
		expect(t, fams, "gpu_process_memory_used_bytes", map[string]string{"pid": strconv.Itoa(int(p.PID)),
			"gpu": strconv.Itoa(p.GPU), "pod": pods[p.PID].name}, float64(p.VRAM))
	}
	expect(t, fams, "gpu_unrequested_use", map[string]string{"gpu": "1", "pod": "reranker-0"}, 1)
	expect(t, fams, "gpu_allocation_processes", map[string]string{"gpu": "0", "pod": "embedder-0", "resource": "gpu.intel.com/xe"}, 1)

	second := xe.Node(true, interval)
	if err := second.RewriteFDInfo(n.procfs); err != nil {
		t.Fatal(err)
	}
	if err := second.RewriteHwmon(n.sysfs); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the engine use of every process", func() bool {
		_, f, err := e2eutil.TryScrape(addr)
		if err == nil {
			fams = f
		}
		return len(series(fams, "gpu_process_sm_utilization_ratio", nil)) == len(xe.Processes)
	})
	for _, p := range xe.Processes {
		l := map[string]string{"pid": strconv.Itoa(int(p.PID))}
		expect(t, fams, "gpu_process_sm_utilization_ratio", l, float64(p.CCSStep)/drmfake.XeTotalStep)
		expect(t, fams, "gpu_process_decoder_utilization_ratio", l, float64(p.VCSStep)/drmfake.XeTotalStep/drmfake.XeVCSCap)
		expect(t, fams, "gpu_process_encoder_utilization_ratio", l, float64(p.VCSStep)/drmfake.XeTotalStep/drmfake.XeVCSCap)
	}
	for i := range xe.GPUs {
		if v, ok := one(t, fams, "gpu_power_usage_watts", gpuLabels(i, xe.GPUs[i].UUID)); ok && v <= 0 {
			t.Errorf("GPU %d power %v from its energy counter", i, v)
		}
	}
}

// A node with NVIDIA GPUs (read with nvidia-smi) and AMD GPUs, with --gpu.source=auto: both vendors, each GPU
// once, NVIDIA's first; nvidia-drm's cards and a client of one are not read as GPUs of the DRM source. NVIDIA's DRA
// device names find NVIDIA's GPUs by their minor numbers, never an MI300X whose DRM card has the same minor.
func TestMixedNode(t *testing.T) {
	mi := drmfake.NewMI300X()
	node := mi.Node(false)
	node.GPUs = node.GPUs[:2]
	node.Processes = node.Processes[:2]
	// Four NVIDIA GPUs on the bus, with nvidia-drm's cards, and a process holding one of them.
	nv := []string{"0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0"}
	for i, a := range nv {
		node.OtherCards[20+i] = [2]string{"nvidia", a}
	}
	node.Processes = append(node.Processes, drmfake.Process{PID: 7100, DRM: []drmfake.File{{Minor: 20,
		FDInfo: "drm-driver:\tnvidia-drm\ndrm-client-id:\t3\ndrm-pdev:\t0000:01:00.0\n"}}})
	// The fixture's GPU 3 has minor number 1, as the first MI300X's card1 has; GPU 1 has 2, as card2.
	claim := func(name string) *fake.Claim { return &fake.Claim{Name: name, Namespace: "ml", Pool: "node-1"} }
	allocs := []fake.Device{
		{Namespace: "ml", Pod: "a", Container: "c", Resource: "gpu.nvidia.com", IDs: []string{"gpu-1"}, Claim: claim("a-gpu")},
		{Namespace: "ml", Pod: "b", Container: "c", Resource: "gpu.nvidia.com", IDs: []string{"gpu-2"}, Claim: claim("b-gpu")},
	}
	n := writeNode(t, node, nil, nil, allocs)
	fixture, err := filepath.Abs("../../internal/gpu/nvidiasmi/testdata/500farm__4-geforce-rtx-3090.xml")
	if err != nil {
		t.Fatal(err)
	}
	smi := filepath.Join(n.dir, "nvidia-smi")
	if err := os.WriteFile(smi, []byte("#!/bin/sh\nexec cat "+fixture+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	addr := n.start(t, "--nvidia-smi.path="+smi)
	var fams map[string]*dto.MetricFamily
	testkit.WaitFor(t, 20*time.Second, "a reading with the allocations", func() bool {
		_, f, err := e2eutil.TryScrape(addr)
		fams = f
		return err == nil && len(f["gpu_info"].GetMetric()) > 0 && len(f["gpu_allocation_info"].GetMetric()) > 0
	})
	expect(t, fams, "gpu_pod_exporter_source_up", map[string]string{"source": "nvidia-smi+drm"}, 1)
	for _, a := range []struct{ pod, device, gpu string }{{"a", "gpu-1", "3"}, {"b", "gpu-2", "1"}} {
		expect(t, fams, "gpu_allocation_info", map[string]string{"pod": a.pod, "dra_device_name": a.device, "gpu": a.gpu}, 1)
	}
	vendors := map[string][]string{}
	uuids := map[string]bool{}
	for _, m := range fams["gpu_info"].GetMetric() {
		v := e2eutil.Label(m, "vendor")
		vendors[v] = append(vendors[v], e2eutil.Label(m, "gpu"))
		if u := e2eutil.Label(m, "uuid"); uuids[u] {
			t.Errorf("GPU %s served twice", u)
		} else {
			uuids[u] = true
		}
	}
	if got := fmt.Sprint(vendors); got != "map[amd:[4 5] nvidia:[0 1 2 3]]" {
		t.Errorf("GPUs by vendor %s, want NVIDIA's 0-3 and the two MI300X as 4 and 5", got)
	}
	expect(t, fams, "gpu_info", map[string]string{"gpu": "4", "uuid": mi.GPUs[0].UUID, "driver_version": drmfake.MI300XDriver, "cuda_version": ""}, 1)
	for _, p := range mi.Processes[:2] {
		expect(t, fams, "gpu_process_memory_used_bytes", map[string]string{"pid": strconv.Itoa(int(p.PID)), "gpu": strconv.Itoa(4 + p.GPU)}, float64(p.Memory))
	}
	if vs := series(fams, "gpu_process_memory_used_bytes", map[string]string{"pid": "7100"}); len(vs) != 0 {
		t.Errorf("nvidia-drm's client read as a DRM source's process: %v", vs)
	}
}

func grpcNotFound() error { return status.Error(codes.NotFound, "no such container") }
