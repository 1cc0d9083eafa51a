//go:build e2e

package allocation

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet/fake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// draNode: GPUs whose minor numbers are not their indices, as on real nodes, and a GPU in MIG mode whose GPU
// instances sit where an H100 puts them.
//
//	GPU 0 (minor 1): device plugin, ml/dp-0, busy.
//	GPU 1 (minor 0): DRA claim of ml/train-0, busy; train-0 also runs on GPU 3, which no allocation gives it.
//	GPU 2 (minor 2): MIG; DRA claim of ml/infer-0 for the 1g.10gb at slice 6, busy; the 3g.40gb is unallocated.
//	GPU 3 (minor 3): one DRA claim shared by ml/web-0 (busy) and ml/web-1 (idle).
//	GPU 4 (minor 4): device plugin, ml/idle-0, idle.
//	GPU 5 (minor 5): DRA claim of ml/idle-dra-0, idle.
const draNode = `
driver_version: "580.95.05"
cuda_version: "13.0"
gpus:
  - uuid: GPU-d0000000-0000-4000-8000-000000000000
    memory_total_bytes: 85520809984
    minor_number: 1
    processes:
      - {pid: 5001, type: compute, identity: {namespace: ml, pod: dp-0, container: c}}
  - uuid: GPU-d0000001-0000-4000-8000-000000000001
    memory_total_bytes: 85520809984
    minor_number: 0
    processes:
      - {pid: 5002, type: compute, identity: {namespace: ml, pod: train-0, container: trainer}}
  - uuid: GPU-d0000002-0000-4000-8000-000000000002
    memory_total_bytes: 85520809984
    minor_number: 2
    mig_mode: enabled
    mig_instances:
      - {uuid: MIG-d0000002-0000-4000-8000-000000000001, gpu_instance: 1, compute_instance: 0, profile: 3g.40gb, placement: {profile_id: 9, start: 0, size: 4}}
      - {uuid: MIG-d0000002-0000-4000-8000-000000000002, gpu_instance: 13, compute_instance: 0, profile: 1g.10gb, placement: {profile_id: 19, start: 6, size: 1}}
    processes:
      - {pid: 5003, type: compute, gpu_instance: 13, compute_instance: 0, identity: {namespace: ml, pod: infer-0, container: server}}
  - uuid: GPU-d0000003-0000-4000-8000-000000000003
    memory_total_bytes: 85520809984
    minor_number: 3
    processes:
      - {pid: 5004, type: compute, identity: {namespace: ml, pod: web-0, container: app}}
      - {pid: 5005, type: compute, identity: {namespace: ml, pod: train-0, container: trainer}}
  - uuid: GPU-d0000004-0000-4000-8000-000000000004
    memory_total_bytes: 85520809984
    minor_number: 4
  - uuid: GPU-d0000005-0000-4000-8000-000000000005
    memory_total_bytes: 85520809984
    minor_number: 5
`

// The device names are those NVIDIA's DRA driver writes (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin: deviceinfo.go
// gpu-<minor>, mig.go gpu-<minor>-mig-<profile>-<profile id>-<placement start>, gpu-vfio-<n>).
func draAllocations() []fake.Device {
	claim := func(name string) *fake.Claim { return &fake.Claim{Name: name, Namespace: "ml", Pool: "node-a"} }
	shared := claim("web-shared")
	return []fake.Device{
		{Namespace: "ml", Pod: "dp-0", Container: "c", Resource: "nvidia.com/gpu", IDs: []string{"GPU-d0000000-0000-4000-8000-000000000000"}},
		{Namespace: "ml", Pod: "idle-0", Container: "c", Resource: "nvidia.com/gpu", IDs: []string{"GPU-d0000004-0000-4000-8000-000000000004"}},
		{Namespace: "ml", Pod: "train-0", Container: "trainer", Resource: "gpu.nvidia.com", IDs: []string{"gpu-0"}, Claim: claim("train-0-gpu")},
		{Namespace: "ml", Pod: "infer-0", Container: "server", Resource: "gpu.nvidia.com", IDs: []string{"gpu-2-mig-1g10gb-19-6"}, Claim: claim("infer-0-mig")},
		{Namespace: "ml", Pod: "web-0", Container: "app", Resource: "gpu.nvidia.com", IDs: []string{"gpu-3"}, Claim: shared},
		{Namespace: "ml", Pod: "web-1", Container: "app", Resource: "gpu.nvidia.com", IDs: []string{"gpu-3"}, Claim: shared},
		{Namespace: "ml", Pod: "idle-dra-0", Container: "c", Resource: "gpu.nvidia.com", IDs: []string{"gpu-5"}, Claim: claim("idle-dra-gpu")},
		// Ignored, and counted: another driver's device, a GPU passed through to a VM, a name of no known form.
		{Namespace: "net", Pod: "router-0", Container: "r", Resource: "dra.example.com", IDs: []string{"nic-0"}, Claim: claim("nic")},
		{Namespace: "vm", Pod: "virt-launcher-0", Container: "compute", Resource: "gpu.nvidia.com", IDs: []string{"gpu-vfio-0"}, Claim: claim("vfio")},
		{Namespace: "ml", Pod: "odd-0", Container: "c", Resource: "gpu.nvidia.com", IDs: []string{"gpu-0-mig-something"}, Claim: claim("odd")},
	}
}

// DRA and device plugin allocations together, through the real binary and a real gRPC PodResources server: the
// allocation series carry dcgm-exporter's dra_* labels, and unrequested use and idle allocations come out the
// same for both kinds.
func TestDRAAllocationSignals(t *testing.T) {
	dir := testkit.SocketDir(t)
	sock := filepath.Join(dir, "kubelet.sock")
	cfg := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(cfg, []byte(draNode), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := fake.Start(sock, draAllocations(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	addr := e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+cfg, "--kubelet.pod-resources-endpoint=unix://"+sock,
		"--kubelet.refresh-interval=100ms").Addr

	var fams map[string]*dto.MetricFamily
	// kubelet_up and the allocation series are gathered one after the other, so a scrape during the first refresh
	// can have the one without the other. The unmapped-devices gauge is written only with the allocations.
	waitFor(t, "kubelet_up 1 and the allocations read", func() bool {
		fams = scrape(t, addr)
		return values(fams, "gpu_pod_exporter_kubelet_up", nil) == "1" &&
			values(fams, "gpu_pod_exporter_kubelet_unmapped_devices", nil) != ""
	})

	var allocs []string
	for _, m := range fams["gpu_allocation_processes"].GetMetric() {
		l := func(n string) string { return e2eutil.Label(m, n) }
		allocs = append(allocs, strings.Join([]string{"GPU " + l("gpu") + "/" + l("gpu_instance"), l("pod"), l("resource"),
			"claim=" + l("dra_claim_namespace") + "/" + l("dra_claim_name"), "driver=" + l("dra_driver_name"),
			"pool=" + l("dra_pool_name"), "device=" + l("dra_device_name"), "processes=" + values(fams, "gpu_allocation_processes",
				map[string]string{"pod": l("pod"), "gpu": l("gpu")})}, " "))
	}
	slices.Sort(allocs)
	want := []string{
		"GPU 0/ dp-0 nvidia.com/gpu claim=/ driver= pool= device= processes=1",
		"GPU 1/ train-0 gpu.nvidia.com claim=ml/train-0-gpu driver=gpu.nvidia.com pool=node-a device=gpu-0 processes=1",
		"GPU 2/13 infer-0 gpu.nvidia.com claim=ml/infer-0-mig driver=gpu.nvidia.com pool=node-a device=gpu-2-mig-1g10gb-19-6 processes=1",
		"GPU 3/ web-0 gpu.nvidia.com claim=ml/web-shared driver=gpu.nvidia.com pool=node-a device=gpu-3 processes=1",
		"GPU 3/ web-1 gpu.nvidia.com claim=ml/web-shared driver=gpu.nvidia.com pool=node-a device=gpu-3 processes=0",
		"GPU 4/ idle-0 nvidia.com/gpu claim=/ driver= pool= device= processes=0",
		"GPU 5/ idle-dra-0 gpu.nvidia.com claim=ml/idle-dra-gpu driver=gpu.nvidia.com pool=node-a device=gpu-5 processes=0",
	}
	if strings.Join(allocs, "\n") != strings.Join(want, "\n") {
		t.Errorf("allocations:\n%s\nwant:\n%s", strings.Join(allocs, "\n"), strings.Join(want, "\n"))
	}
	if n := len(fams["gpu_allocation_info"].GetMetric()); n != len(want) {
		t.Errorf("%d gpu_allocation_info series, want %d", n, len(want))
	}
	// train-0 holds GPU 1 through its claim and also runs on GPU 3, which only web-0 and web-1 share.
	if got := series(fams, "gpu_unrequested_use"); got != `gpu="3",namespace="ml",pod="train-0",container="trainer" 1` {
		t.Errorf("gpu_unrequested_use:\n%s\nwant only GPU 3 for ml/train-0", got)
	}
	for reason, want := range map[string]string{"other_driver": "1", "vfio": "1", "unknown_name": "1"} {
		if got := values(fams, "gpu_pod_exporter_kubelet_dra_devices_ignored", map[string]string{"reason": reason}); got != want {
			t.Errorf("dra_devices_ignored{reason=%q} = %q, want %s", reason, got, want)
		}
	}
	if got := values(fams, "gpu_pod_exporter_kubelet_unmapped_devices", nil); got != "0" {
		t.Errorf("unmapped devices = %q, want 0", got)
	}

	// The claim moves to a GPU this node does not have: the allocation is unmapped, and train-0's use is no longer
	// called unrequested, since the unmapped device may be the very GPU it runs on.
	next := draAllocations()
	next[2].IDs = []string{"gpu-9"}
	srv.Set(next)
	waitFor(t, "the unmapped DRA device", func() bool {
		fams = scrape(t, addr)
		return values(fams, "gpu_pod_exporter_kubelet_unmapped_devices", nil) == "1"
	})
	if n := len(fams["gpu_unrequested_use"].GetMetric()); n != 0 {
		t.Errorf("%d gpu_unrequested_use series with train-0's claim unmapped, want none", n)
	}
}
