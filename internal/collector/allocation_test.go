package collector

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
)

// fixedAllocations is an allocation.Source with fixed content.
type fixedAllocations struct {
	items []kubelet.Allocation
	ok    bool
}

func (f fixedAllocations) Allocations() (kubelet.Allocations, bool) {
	return kubelet.Allocations{Items: f.items}, f.ok
}

func alloc(ns, pod, ctr, resource, id string) kubelet.Allocation {
	return kubelet.Allocation{Namespace: ns, Pod: pod, Container: ctr, Resource: resource, DeviceID: id, Device: kubelet.ParseDeviceID(id)}
}

func podOwner(ns, pod, ctr string) attribution.Owner {
	return attribution.Owner{Name: "python", Identity: attribution.Identity{Namespace: ns, Pod: pod, Container: ctr, PodUID: pod + "-uid"}}
}

// allocationNode is a node with the shapes allocations take: whole GPUs, time-sliced replicas, MIG devices,
// index-style IDs, an unreadable process list, and pods using GPUs they were not given.
func allocationNode() (*gpu.Snapshot, fixedOwners, []kubelet.Allocation) {
	proc := func(pid uint32) gpu.Process { return gpu.Process{PID: pid, Type: gpu.ProcessCompute} }
	migProc := func(pid uint32, gi, ci int) gpu.Process {
		return gpu.Process{PID: pid, Type: gpu.ProcessCompute, MIG: true, GPUInstance: gi, ComputeInstance: ci}
	}
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		// GPU 0: time-sliced; train holds two replicas and runs, share holds one and runs nothing.
		{Index: 0, UUID: "GPU-0", Vendor: gpu.VendorNVIDIA, ProcessesListed: true, Processes: []gpu.Process{proc(1)}},
		// GPU 1: train also runs here without a request; idx holds it by index; a host process and a pod whose
		// names are not known yet.
		{Index: 1, UUID: "GPU-1", Vendor: gpu.VendorNVIDIA, ProcessesListed: true, Processes: []gpu.Process{proc(2), proc(3), proc(6), proc(7)}},
		// GPU 2: allocated to idle, nothing runs.
		{Index: 2, UUID: "GPU-2", Vendor: gpu.VendorNVIDIA, ProcessesListed: true},
		// GPU 3: MIG; infer holds instance 1/0 and also runs on 2/0.
		{Index: 3, UUID: "GPU-3", Vendor: gpu.VendorNVIDIA, MIGMode: "enabled", ProcessesListed: true,
			MIG:       []gpu.MIGInstance{{UUID: "MIG-a", GPUInstance: 1, ComputeInstance: 0}, {UUID: "MIG-b", GPUInstance: 2, ComputeInstance: 0}},
			Processes: []gpu.Process{migProc(4, 1, 0), migProc(5, 2, 0)}},
		// GPU 4: its process list could not be read: allocated, but idleness unknown.
		{Index: 4, UUID: "GPU-4", Vendor: gpu.VendorNVIDIA, ProcessesListed: false},
	}}
	owners := fixedOwners{
		1: podOwner("ml", "train", "trainer"),
		2: podOwner("ml", "train", "trainer"),
		3: {Name: "Xorg", Identity: attribution.Identity{SystemdUnit: "display.service"}},
		4: podOwner("ml", "infer", "server"),
		5: podOwner("ml", "infer", "server"),
		6: podOwner("ml", "weird", "w"),
		7: {Name: "python", Identity: attribution.Identity{PodUID: "unnamed-uid", ContainerID: "abc"}},
	}
	allocs := []kubelet.Allocation{
		alloc("ml", "train", "trainer", "nvidia.com/gpu", "GPU-0::0"),
		alloc("ml", "train", "trainer", "nvidia.com/gpu", "GPU-0::1"),
		alloc("ml", "share", "s", "nvidia.com/gpu", "GPU-0::2"),
		alloc("ml", "idx", "c", "nvidia.com/gpu", "1"),
		alloc("ml", "idle", "c", "nvidia.com/gpu", "GPU-2"),
		alloc("ml", "infer", "server", "nvidia.com/mig-1g.10gb", "MIG-a"),
		alloc("ml", "blind", "c", "nvidia.com/gpu", "GPU-4"),
		// weird holds a device that this node's reading does not have: its use of GPU 1 may be that device.
		alloc("ml", "weird", "w", "nvidia.com/gpu", "GPU-gone"),
	}
	return snap, owners, allocs
}

func TestAllocationsAndSignals(t *testing.T) {
	snap, owners, allocs := allocationNode()
	reg := registry(t, fixedSource{snap}, owners, Options{Allocations: fixedAllocations{allocs, true}})
	want := `
# HELP gpu_allocation_info GPU or MIG device that the kubelet allocated to the container (PodResources API), through a device plugin or a DRA ResourceClaim; always 1. gpu_instance and compute_instance are empty unless the device is a MIG instance; resource is the device plugin resource or the DRA driver; the dra_* labels are empty for device plugin allocations.
# TYPE gpu_allocation_info gauge
gpu_allocation_info{compute_instance="",container="c",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="1",gpu_instance="",namespace="ml",pod="idx",resource="nvidia.com/gpu",uuid="GPU-1"} 1
gpu_allocation_info{compute_instance="",container="c",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="2",gpu_instance="",namespace="ml",pod="idle",resource="nvidia.com/gpu",uuid="GPU-2"} 1
gpu_allocation_info{compute_instance="",container="c",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="4",gpu_instance="",namespace="ml",pod="blind",resource="nvidia.com/gpu",uuid="GPU-4"} 1
gpu_allocation_info{compute_instance="",container="s",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="0",gpu_instance="",namespace="ml",pod="share",resource="nvidia.com/gpu",uuid="GPU-0"} 1
gpu_allocation_info{compute_instance="",container="trainer",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="0",gpu_instance="",namespace="ml",pod="train",resource="nvidia.com/gpu",uuid="GPU-0"} 1
gpu_allocation_info{compute_instance="0",container="server",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="3",gpu_instance="1",namespace="ml",pod="infer",resource="nvidia.com/mig-1g.10gb",uuid="GPU-3"} 1
# HELP gpu_allocation_processes Processes of the allocated pod on the allocated GPU or MIG device; 0 means allocated and idle. Processes of pods whose names are not known yet count for every allocation of their GPU.
# TYPE gpu_allocation_processes gauge
gpu_allocation_processes{compute_instance="",container="c",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="1",gpu_instance="",namespace="ml",pod="idx",resource="nvidia.com/gpu",uuid="GPU-1"} 1
gpu_allocation_processes{compute_instance="",container="c",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="2",gpu_instance="",namespace="ml",pod="idle",resource="nvidia.com/gpu",uuid="GPU-2"} 0
gpu_allocation_processes{compute_instance="",container="s",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="0",gpu_instance="",namespace="ml",pod="share",resource="nvidia.com/gpu",uuid="GPU-0"} 0
gpu_allocation_processes{compute_instance="",container="trainer",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="0",gpu_instance="",namespace="ml",pod="train",resource="nvidia.com/gpu",uuid="GPU-0"} 1
gpu_allocation_processes{compute_instance="0",container="server",dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name="",gpu="3",gpu_instance="1",namespace="ml",pod="infer",resource="nvidia.com/mig-1g.10gb",uuid="GPU-3"} 1
# HELP gpu_unrequested_use 1 for a Kubernetes container with processes on a GPU or MIG device that no kubelet allocation gives its pod (NVIDIA_VISIBLE_DEVICES=all, privileged pods). Only while the kubelet's allocations are known.
# TYPE gpu_unrequested_use gauge
gpu_unrequested_use{compute_instance="",container="trainer",gpu="1",gpu_instance="",namespace="ml",pod="train",uuid="GPU-1"} 1
gpu_unrequested_use{compute_instance="0",container="server",gpu="3",gpu_instance="2",namespace="ml",pod="infer",uuid="GPU-3"} 1
# HELP gpu_pod_exporter_kubelet_unmapped_devices Allocated GPU device IDs and DRA device names that match no GPU or MIG device of the current reading (unknown ID format, a GPU that could not be read, a MIG device whose placement is unknown). Their pods get no gpu_unrequested_use series.
# TYPE gpu_pod_exporter_kubelet_unmapped_devices gauge
gpu_pod_exporter_kubelet_unmapped_devices 1
# HELP gpu_workloads Distinct workloads (pod container, container, Slurm job or service; one identity of gpu_workload_processes) with processes on the GPU, MIG instances included. Absent when the process list could not be read.
# TYPE gpu_workloads gauge
gpu_workloads{gpu="0",uuid="GPU-0"} 1
gpu_workloads{gpu="1",uuid="GPU-1"} 4
gpu_workloads{gpu="2",uuid="GPU-2"} 0
gpu_workloads{gpu="3",uuid="GPU-3"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_allocation_info", "gpu_allocation_processes",
		"gpu_unrequested_use", "gpu_pod_exporter_kubelet_unmapped_devices", "gpu_workloads"); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// Without allocation data nothing is said about allocations or unrequested use, and the rest is unaffected.
func TestAllocationsUnavailable(t *testing.T) {
	snap, owners, allocs := allocationNode()
	for name, opts := range map[string]Options{
		"kubelet down": {Allocations: fixedAllocations{allocs, false}},
		"no kubelet":   {},
	} {
		reg := registry(t, fixedSource{snap}, owners, opts)
		for family, want := range map[string]int{
			"gpu_allocation_info": 0, "gpu_allocation_processes": 0, "gpu_unrequested_use": 0,
			"gpu_pod_exporter_kubelet_unmapped_devices": 0, "gpu_workloads": 4, "gpu_workload_processes": 6,
		} {
			if got, err := testutil.GatherAndCount(reg, family); err != nil || got != want {
				t.Errorf("%s: %s: %d series (err %v), want %d", name, family, got, err, want)
			}
		}
	}
}

// A node whose pods hold no GPUs: every Kubernetes process is unrequested use, other workloads are not.
func TestNoAllocationsMeansEveryPodIsUnrequested(t *testing.T) {
	snap, owners, _ := allocationNode()
	reg := registry(t, fixedSource{snap}, owners, Options{Allocations: fixedAllocations{nil, true}})
	// train on GPU 0 and 1, infer on two MIG instances, weird on GPU 1; not Xorg, not the unnamed pod.
	if got, _ := testutil.GatherAndCount(reg, "gpu_unrequested_use"); got != 5 {
		t.Errorf("gpu_unrequested_use: %d series, want 5", got)
	}
}

// draAlloc is an allocation as the kubelet package reads it from a DRA claim of NVIDIA's driver.
func draAlloc(ns, pod, ctr, claim, device string) kubelet.Allocation {
	ref, _ := kubelet.ParseDRADeviceName(device)
	return kubelet.Allocation{Namespace: ns, Pod: pod, Container: ctr, Resource: kubelet.NVIDIADRADriver, DeviceID: device,
		Device: ref, Claim: &kubelet.Claim{Name: claim, Namespace: ns, Pool: "node-a"}}
}

// A node whose GPUs are allocated through DRA, next to a device plugin GPU. Device names are those of NVIDIA's DRA
// driver (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin deviceinfo.go, mig.go: gpu-<minor>,
// gpu-<minor>-mig-<profile>-<profileID>-<start>), and minor numbers differ from indices as they may on real nodes.
func TestDRAAllocationsAndSignals(t *testing.T) {
	proc := func(pid uint32) gpu.Process { return gpu.Process{PID: pid, Type: gpu.ProcessCompute} }
	migProc := func(pid uint32, gi, ci int) gpu.Process {
		return gpu.Process{PID: pid, Type: gpu.ProcessCompute, MIG: true, GPUInstance: gi, ComputeInstance: ci}
	}
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		// GPU 0 (minor 1): device plugin, busy.
		{Index: 0, UUID: "GPU-0", Vendor: gpu.VendorNVIDIA, MinorNumber: gpu.Known(1), ProcessesListed: true, Processes: []gpu.Process{proc(1), proc(6)}},
		// GPU 1 (minor 0): a DRA whole GPU, busy; train also runs on GPU 0 without a request.
		{Index: 1, UUID: "GPU-1", Vendor: gpu.VendorNVIDIA, MinorNumber: gpu.Known(0), ProcessesListed: true, Processes: []gpu.Process{proc(2)}},
		// GPU 2 (minor 2): MIG; infer's claim holds the instance at slice 6 (GI 5) and it also runs on GI 3.
		{Index: 2, UUID: "GPU-2", Vendor: gpu.VendorNVIDIA, MinorNumber: gpu.Known(2), MIGMode: "enabled", ProcessesListed: true,
			MIG: []gpu.MIGInstance{
				{UUID: "MIG-c", GPUInstance: 3, ComputeInstance: 0, Profile: "1g.10gb", Placement: &gpu.MIGPlacement{ProfileID: 19, Start: 4, Size: 1}},
				{UUID: "MIG-d", GPUInstance: 5, ComputeInstance: 0, Profile: "1g.10gb", Placement: &gpu.MIGPlacement{ProfileID: 19, Start: 6, Size: 1}},
			},
			Processes: []gpu.Process{migProc(3, 5, 0), migProc(4, 3, 0)}},
		// GPU 3 (minor 3): one claim shared by web-0 (busy) and web-1 (idle), time-sliced by the claim's config.
		{Index: 3, UUID: "GPU-3", Vendor: gpu.VendorNVIDIA, MinorNumber: gpu.Known(3), ProcessesListed: true, Processes: []gpu.Process{proc(5)}},
	}}
	owners := fixedOwners{
		1: podOwner("ml", "dp", "c"),
		2: podOwner("ml", "train", "trainer"),
		3: podOwner("ml", "infer", "server"),
		4: podOwner("ml", "infer", "server"),
		5: podOwner("ml", "web-0", "app"),
		6: podOwner("ml", "train", "trainer"),
	}
	allocs := []kubelet.Allocation{
		alloc("ml", "dp", "c", "nvidia.com/gpu", "GPU-0"),
		draAlloc("ml", "train", "trainer", "train-gpu", "gpu-0"),
		draAlloc("ml", "infer", "server", "infer-mig", "gpu-2-mig-1g10gb-19-6"),
		draAlloc("ml", "web-0", "app", "shared-gpu", "gpu-3"),
		draAlloc("ml", "web-1", "app", "shared-gpu", "gpu-3"),
		// No GPU has minor 9: unmapped, and ghost's use is not called unrequested.
		draAlloc("ml", "ghost", "g", "ghost-gpu", "gpu-9"),
	}
	reg := registry(t, fixedSource{snap}, owners, Options{Allocations: fixedAllocations{allocs, true}})
	const dp = `dra_claim_name="",dra_claim_namespace="",dra_device_name="",dra_driver_name="",dra_pool_name=""`
	want := `
# HELP gpu_allocation_info GPU or MIG device that the kubelet allocated to the container (PodResources API), through a device plugin or a DRA ResourceClaim; always 1. gpu_instance and compute_instance are empty unless the device is a MIG instance; resource is the device plugin resource or the DRA driver; the dra_* labels are empty for device plugin allocations.
# TYPE gpu_allocation_info gauge
gpu_allocation_info{compute_instance="",container="app",dra_claim_name="shared-gpu",dra_claim_namespace="ml",dra_device_name="gpu-3",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-a",gpu="3",gpu_instance="",namespace="ml",pod="web-0",resource="gpu.nvidia.com",uuid="GPU-3"} 1
gpu_allocation_info{compute_instance="",container="app",dra_claim_name="shared-gpu",dra_claim_namespace="ml",dra_device_name="gpu-3",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-a",gpu="3",gpu_instance="",namespace="ml",pod="web-1",resource="gpu.nvidia.com",uuid="GPU-3"} 1
gpu_allocation_info{compute_instance="",container="c",` + dp + `,gpu="0",gpu_instance="",namespace="ml",pod="dp",resource="nvidia.com/gpu",uuid="GPU-0"} 1
gpu_allocation_info{compute_instance="",container="trainer",dra_claim_name="train-gpu",dra_claim_namespace="ml",dra_device_name="gpu-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-a",gpu="1",gpu_instance="",namespace="ml",pod="train",resource="gpu.nvidia.com",uuid="GPU-1"} 1
gpu_allocation_info{compute_instance="0",container="server",dra_claim_name="infer-mig",dra_claim_namespace="ml",dra_device_name="gpu-2-mig-1g10gb-19-6",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-a",gpu="2",gpu_instance="5",namespace="ml",pod="infer",resource="gpu.nvidia.com",uuid="GPU-2"} 1
# HELP gpu_allocation_processes Processes of the allocated pod on the allocated GPU or MIG device; 0 means allocated and idle. Processes of pods whose names are not known yet count for every allocation of their GPU.
# TYPE gpu_allocation_processes gauge
gpu_allocation_processes{compute_instance="",container="app",dra_claim_name="shared-gpu",dra_claim_namespace="ml",dra_device_name="gpu-3",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-a",gpu="3",gpu_instance="",namespace="ml",pod="web-0",resource="gpu.nvidia.com",uuid="GPU-3"} 1
gpu_allocation_processes{compute_instance="",container="app",dra_claim_name="shared-gpu",dra_claim_namespace="ml",dra_device_name="gpu-3",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-a",gpu="3",gpu_instance="",namespace="ml",pod="web-1",resource="gpu.nvidia.com",uuid="GPU-3"} 0
gpu_allocation_processes{compute_instance="",container="c",` + dp + `,gpu="0",gpu_instance="",namespace="ml",pod="dp",resource="nvidia.com/gpu",uuid="GPU-0"} 1
gpu_allocation_processes{compute_instance="",container="trainer",dra_claim_name="train-gpu",dra_claim_namespace="ml",dra_device_name="gpu-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-a",gpu="1",gpu_instance="",namespace="ml",pod="train",resource="gpu.nvidia.com",uuid="GPU-1"} 1
gpu_allocation_processes{compute_instance="0",container="server",dra_claim_name="infer-mig",dra_claim_namespace="ml",dra_device_name="gpu-2-mig-1g10gb-19-6",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-a",gpu="2",gpu_instance="5",namespace="ml",pod="infer",resource="gpu.nvidia.com",uuid="GPU-2"} 1
# HELP gpu_pod_exporter_kubelet_unmapped_devices Allocated GPU device IDs and DRA device names that match no GPU or MIG device of the current reading (unknown ID format, a GPU that could not be read, a MIG device whose placement is unknown). Their pods get no gpu_unrequested_use series.
# TYPE gpu_pod_exporter_kubelet_unmapped_devices gauge
gpu_pod_exporter_kubelet_unmapped_devices 1
# HELP gpu_unrequested_use 1 for a Kubernetes container with processes on a GPU or MIG device that no kubelet allocation gives its pod (NVIDIA_VISIBLE_DEVICES=all, privileged pods). Only while the kubelet's allocations are known.
# TYPE gpu_unrequested_use gauge
gpu_unrequested_use{compute_instance="",container="trainer",gpu="0",gpu_instance="",namespace="ml",pod="train",uuid="GPU-0"} 1
gpu_unrequested_use{compute_instance="0",container="server",gpu="2",gpu_instance="3",namespace="ml",pod="infer",uuid="GPU-2"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_allocation_info", "gpu_allocation_processes",
		"gpu_unrequested_use", "gpu_pod_exporter_kubelet_unmapped_devices"); err != nil {
		t.Error(err)
	}
}
