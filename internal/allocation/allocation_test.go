package allocation

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// resolved names the device a reference resolves to as "gpu/gi/ci" (empty for a whole GPU), or "unmapped".
func resolved(ds devices, ref kubelet.DeviceRef) string {
	t, ok := ds.resolve(ref)
	if !ok {
		return "unmapped"
	}
	s := strconv.Itoa(t.dev.Index) + "/"
	if t.isMIG() {
		return s + strconv.Itoa(t.gi) + "/" + strconv.Itoa(t.ci)
	}
	return s + "/"
}

func TestResolveDeviceIDs(t *testing.T) {
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-0", Vendor: gpu.VendorNVIDIA},
		{Index: 1, UUID: "GPU-1", Vendor: gpu.VendorNVIDIA, MIG: []gpu.MIGInstance{{UUID: "MIG-x", GPUInstance: 3, ComputeInstance: 0}, {UUID: "MIG-y", GPUInstance: 5, ComputeInstance: 1}}},
	}}
	ds := indexDevices(snap)
	for id, want := range map[string]string{
		"GPU-0": "0//", "GPU-0::4": "0//", "0": "0//", "nvidia1": "1//", "MIG-y": "1/5/1", "1:0": "1/3/0",
		"MIG-GPU-1/7/2": "1/7/2", "MIG-y::2": "1/5/1",
		"GPU-9": "unmapped", "2": "unmapped", "1:2": "unmapped", "0:0": "unmapped", "weird": "unmapped",
	} {
		if got := resolved(ds, kubelet.ParseDeviceID(id)); got != want {
			t.Errorf("%s resolves to %s, want %s", id, got, want)
		}
	}
}

// AMD's device plugin names GPUs by PCI address, whatever form the source writes it in; Intel's by DRM card. On a
// node with both, NVIDIA's names resolve as before: a minor number or an index never matches a DRM card.
func TestResolveAMDAndIntelDeviceIDs(t *testing.T) {
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-n0", Vendor: gpu.VendorNVIDIA, PCIBusID: "00000000:18:00.0", MinorNumber: gpu.Known(0)},
		{Index: 1, UUID: "GPU-2c5ab07d91e3f640", PCIBusID: "0000:26:00.0", Vendor: gpu.VendorAMD, DRMCard: "card1", MinorNumber: gpu.Known(1)},
		{Index: 2, UUID: "PCI-0000:83:00.0", PCIBusID: "0000:83:00.0", Vendor: gpu.VendorIntel, DRMCard: "card2", MinorNumber: gpu.Known(2)},
	}}
	ds := indexDevices(snap)
	for id, want := range map[string]string{
		"0000:26:00.0": "1//", "0000:18:00.0": "0//", "0000:83:00.0": "2//", "card2-0": "2//", "card2-3": "2//",
		"card1-0": "1//", "0000:27:00.0": "unmapped", "card0-0": "unmapped", "amdgpu_xcp_30": "unmapped",
	} {
		if got := resolved(ds, kubelet.ParseDeviceID(id)); got != want {
			t.Errorf("%s resolves to %s, want %s", id, got, want)
		}
	}
}

// NVIDIA's minor numbers are /dev/nvidiaN's; an AMD or Intel GPU's DRM card has a minor number of its own, which can
// be the same N. On a mixed node, NVIDIA's names (a DRA driver's gpu-N, a device plugin's index) resolve to NVIDIA
// GPUs only.
func TestNVIDIANamesResolveToNVIDIAGPUsOnly(t *testing.T) {
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-n0", Vendor: gpu.VendorNVIDIA, MinorNumber: gpu.Known(0)},
		{Index: 1, UUID: "GPU-n1", Vendor: gpu.VendorNVIDIA, MinorNumber: gpu.Known(1)},
		{Index: 2, UUID: "GPU-2c5ab07d91e3f640", PCIBusID: "0000:26:00.0", Vendor: gpu.VendorAMD, DRMCard: "card1", MinorNumber: gpu.Known(1)},
		{Index: 3, UUID: "PCI-0000:83:00.0", PCIBusID: "0000:83:00.0", Vendor: gpu.VendorIntel, DRMCard: "card2", MinorNumber: gpu.Known(2)},
	}}
	ds := indexDevices(snap)
	for name, want := range map[string]string{"gpu-0": "0//", "gpu-1": "1//", "gpu-2": "unmapped"} {
		ref, _ := kubelet.ParseDRADeviceName(name)
		if got := resolved(ds, ref); got != want {
			t.Errorf("DRA device %s resolves to %s, want %s", name, got, want)
		}
	}
	for id, want := range map[string]string{"1": "1//", "nvidia1": "1//", "2": "unmapped", "3": "unmapped", "card1-0": "2//"} {
		if got := resolved(ds, kubelet.ParseDeviceID(id)); got != want {
			t.Errorf("device ID %s resolves to %s, want %s", id, got, want)
		}
	}
}

// DRA device names resolve through the minor number, and MIG devices through their placement, or their profile
// where the source has no placement and the profile is unique on the GPU. Nothing else is guessed.
func TestResolveDRADeviceNames(t *testing.T) {
	p := func(id, start, size int) *gpu.MIGPlacement {
		return &gpu.MIGPlacement{ProfileID: id, Start: start, Size: size}
	}
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-0", Vendor: gpu.VendorNVIDIA, MinorNumber: gpu.Known(2)},
		{Index: 1, UUID: "GPU-1", Vendor: gpu.VendorNVIDIA}, // minor unknown
		// With placements (NVML as a privileged user).
		{Index: 2, UUID: "GPU-2", Vendor: gpu.VendorNVIDIA, MinorNumber: gpu.Known(0), MIG: []gpu.MIGInstance{
			{UUID: "MIG-a", GPUInstance: 7, ComputeInstance: 0, Profile: "1g.10gb", Placement: p(19, 0, 1)},
			{UUID: "MIG-b", GPUInstance: 8, ComputeInstance: 0, Profile: "1g.10gb", Placement: p(19, 1, 1)},
			{UUID: "MIG-c", GPUInstance: 1, ComputeInstance: 0, Profile: "3g.40gb", Placement: p(9, 4, 4)},
			// One GPU instance split into two compute instances: its placement names neither alone.
			{UUID: "MIG-d", GPUInstance: 2, ComputeInstance: 0, Profile: "1c.2g.20gb", Placement: p(14, 2, 2)},
			{UUID: "MIG-e", GPUInstance: 2, ComputeInstance: 1, Profile: "1c.2g.20gb", Placement: p(14, 2, 2)},
		}},
		// Without placements (nvidia-smi, or NVML unprivileged): by profile, when it is unique.
		{Index: 3, UUID: "GPU-3", Vendor: gpu.VendorNVIDIA, MinorNumber: gpu.Known(1), MIG: []gpu.MIGInstance{
			{UUID: "MIG-f", GPUInstance: 3, ComputeInstance: 0, Profile: "3g.40gb"},
			{UUID: "MIG-g", GPUInstance: 9, ComputeInstance: 0, Profile: "1g.10gb"},
			{UUID: "MIG-h", GPUInstance: 10, ComputeInstance: 0, Profile: "1g.10gb"},
			{UUID: "MIG-i", GPUInstance: 11, ComputeInstance: 0, Profile: "1g.10gb+me"},
		}},
	}}
	ds := indexDevices(snap)
	for name, want := range map[string]string{
		"gpu-2": "0//", "gpu-0": "2//", "gpu-1": "3//",
		"gpu-0-mig-1g10gb-19-1": "2/8/0", "gpu-0-mig-19-1-1": "2/8/0", "gpu-0-mig-3g40gb-9-4": "2/1/0",
		"gpu-0-mig-9-4-4":      "2/1/0",
		"gpu-1-mig-3g40gb-9-4": "3/3/0", "gpu-1-mig-1g10gb-me-20-6": "3/11/0",
		// Unknown minor, no such placement, a size that differs, a split GPU instance, a profile twice, no
		// placement and no profile (older names on nvidia-smi).
		"gpu-5": "unmapped", "gpu-0-mig-1g10gb-19-2": "unmapped", "gpu-0-mig-9-4-3": "unmapped",
		"gpu-0-mig-1c2g20gb-14-2": "unmapped", "gpu-1-mig-1g10gb-19-0": "unmapped", "gpu-1-mig-9-4-4": "unmapped",
	} {
		ref, _ := kubelet.ParseDRADeviceName(name)
		if got := resolved(ds, ref); got != want {
			t.Errorf("%s resolves to %s, want %s", name, got, want)
		}
	}
}

func kubeOwner(ns, pod, ctr string) attribution.Owner {
	return attribution.Owner{Identity: attribution.Identity{Namespace: ns, Pod: pod, Container: ctr, PodUID: pod + "-uid"}}
}

func deviceAlloc(ns, pod, ctr, id string) kubelet.Allocation {
	return kubelet.Allocation{Namespace: ns, Pod: pod, Container: ctr, Resource: "nvidia.com/gpu", DeviceID: id,
		Device: kubelet.ParseDeviceID(id)}
}

func (a Allocation) String() string {
	return fmt.Sprintf("%d/%d/%d %s/%s/%s=%d", a.GPU, a.GPUInstance, a.ComputeInstance, a.Namespace, a.Pod, a.Container, a.Processes)
}

func (u Use) String() string {
	return fmt.Sprintf("%d/%d/%d %s/%s/%s", u.GPU, u.GPUInstance, u.ComputeInstance, u.Namespace, u.Pod, u.Container)
}

// Join says who holds each device and whether they run on it, and who runs where nothing was allocated to them.
func TestJoin(t *testing.T) {
	proc := func(pid uint32) gpu.Process { return gpu.Process{PID: pid, Type: gpu.ProcessCompute} }
	migProc := func(pid uint32, gi, ci int) gpu.Process {
		return gpu.Process{PID: pid, Type: gpu.ProcessCompute, MIG: true, GPUInstance: gi, ComputeInstance: ci}
	}
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		// train holds two time-sliced replicas and runs; a pod whose names a runtime has not given yet may be train's.
		{Index: 0, UUID: "GPU-0", Vendor: gpu.VendorNVIDIA, ProcessesListed: true, Processes: []gpu.Process{proc(1), proc(2)}},
		// idle holds it and runs nothing; train runs here twice without a request, and so do a service and ghost,
		// whose allocation names a GPU this reading does not have.
		{Index: 1, UUID: "GPU-1", Vendor: gpu.VendorNVIDIA, ProcessesListed: true, Processes: []gpu.Process{proc(3), proc(4), proc(5), proc(6)}},
		// Its process list could not be read: whether blind runs here is unknown.
		{Index: 2, UUID: "GPU-2", Vendor: gpu.VendorNVIDIA, ProcessesListed: false},
		// MIG: infer holds 1/0 and runs there, on 2/0 without a request, and once where the source did not say.
		{Index: 3, UUID: "GPU-3", Vendor: gpu.VendorNVIDIA, MIGMode: gpu.MIGEnabled, ProcessesListed: true,
			MIG:       []gpu.MIGInstance{{UUID: "MIG-a", GPUInstance: 1, ComputeInstance: 0}, {UUID: "MIG-b", GPUInstance: 2, ComputeInstance: 0}},
			Processes: []gpu.Process{migProc(7, 1, 0), migProc(8, 2, 0), proc(9)}},
	}}
	owners := map[uint32]attribution.Owner{
		1: kubeOwner("ml", "train", "trainer"),
		2: {Identity: attribution.Identity{PodUID: "pending-uid", ContainerID: "abc"}},
		3: kubeOwner("ml", "train", "trainer"),
		4: kubeOwner("ml", "train", "trainer"),
		5: {Identity: attribution.Identity{SystemdUnit: "display.service"}},
		6: kubeOwner("ml", "ghost", "g"),
		7: kubeOwner("ml", "infer", "server"),
		8: kubeOwner("ml", "infer", "server"),
		9: kubeOwner("ml", "infer", "server"),
	}
	r := &reading.Reading{Snapshot: snap, Owners: owners}
	allocs := kubelet.Allocations{Items: []kubelet.Allocation{
		deviceAlloc("ml", "train", "trainer", "GPU-0::0"),
		deviceAlloc("ml", "train", "trainer", "GPU-0::1"),
		deviceAlloc("ml", "idle", "c", "1"),
		deviceAlloc("ml", "blind", "c", "GPU-2"),
		deviceAlloc("ml", "infer", "server", "MIG-a"),
		deviceAlloc("ml", "ghost", "g", "GPU-gone"),
	}}

	s := Join(allocs, r)
	if !s.Known || s.Unmapped != 1 {
		t.Errorf("known %v, %d unmapped, want known and 1", s.Known, s.Unmapped)
	}
	if got := fmt.Sprint(s.Allocations); got != "[0/-1/-1 ml/train/trainer=2 1/-1/-1 ml/idle/c=0 2/-1/-1 ml/blind/c=-1 3/1/0 ml/infer/server=2]" {
		t.Errorf("allocations: %s", got)
	}
	if got := fmt.Sprint(s.Unrequested); got != "[1/-1/-1 ml/train/trainer 3/2/0 ml/infer/server]" {
		t.Errorf("unrequested use: %s", got)
	}

	// With no allocations, every named pod's use is unrequested; no pod holds anything.
	s = Join(kubelet.Allocations{}, r)
	if !s.Known || len(s.Allocations) != 0 || s.Unmapped != 0 {
		t.Errorf("no allocations: %+v", s)
	}
	if got := fmt.Sprint(s.Unrequested); got != "[0/-1/-1 ml/train/trainer 1/-1/-1 ml/train/trainer 1/-1/-1 ml/ghost/g 3/1/0 ml/infer/server 3/2/0 ml/infer/server 3/-1/-1 ml/infer/server]" {
		t.Errorf("unrequested use without allocations: %s", got)
	}
}
