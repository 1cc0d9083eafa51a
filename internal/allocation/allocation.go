// Package allocation joins the kubelet's GPU allocations (device plugin and DRA) to what runs on the GPUs: who
// holds each GPU or MIG device, who holds one and runs nothing on it, and who runs on one that no allocation gives
// their pod. Allocations and processes are matched by namespace and pod name, the only identity the PodResources
// API gives. The metrics (internal/collector) and `top` both show the Signals of one Join, so that they cannot
// disagree.
package allocation

import (
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// Source gives the kubelet's latest GPU allocations; ok is false when they are not known (no kubelet, kubelet
// down), which is not the same as no allocations.
type Source interface {
	Allocations() (allocs kubelet.Allocations, ok bool)
}

// Signals is what the allocations say about one reading.
type Signals struct {
	// Known is false when the allocations could not be read (no kubelet, kubelet down): nothing below means
	// anything then. Join always sets it.
	Known bool
	// Allocations are the allocations that name a device of the reading, once each: the time-sliced replicas of
	// one GPU given to one container are one.
	Allocations []Allocation
	// Unrequested is each Kubernetes container's use of a GPU or MIG device that none of its pod's allocations
	// covers, once per container and device. Pods with an allocation that names no device of the reading are left
	// out: that device may be the very one.
	Unrequested []Use
	// Unmapped counts the allocated device IDs and DRA device names that match no GPU or MIG device of the
	// reading (an unknown ID format, a GPU that could not be read, a MIG device whose placement is unknown).
	Unmapped int
}

// Device is a whole GPU, or one MIG instance of it.
type Device struct {
	GPU  int    // the GPU's index
	UUID string // the GPU's UUID, also for a MIG instance
	// GPUInstance and ComputeInstance place a MIG instance; both are -1 for a whole GPU.
	GPUInstance, ComputeInstance int
}

// IsMIG reports whether the device is a MIG instance.
func (d Device) IsMIG() bool { return d.GPUInstance >= 0 }

// Allocation is one container's allocation of one GPU or MIG device, and whether it runs anything there.
type Allocation struct {
	Device
	Namespace, Pod, Container string
	// Resource is the device plugin's resource (nvidia.com/gpu, nvidia.com/mig-1g.10gb), or the DRA driver.
	Resource string
	// DeviceID is the device as the device plugin, or the DRA driver (its device name), named it.
	DeviceID string
	// Claim is the ResourceClaim that gave the device; nil for device plugin allocations.
	Claim *kubelet.Claim
	// Processes counts the pod's processes on the device, and those of Kubernetes processes whose pod is not named
	// yet (a runtime lookup still pending): they might be the pod's, and calling a busy GPU idle is the worse
	// mistake. -1 when the GPU's process list could not be read; 0 is an idle allocation.
	Processes int
}

// Use is one Kubernetes container running on a GPU or MIG device that no allocation gives its pod.
type Use struct {
	Device
	Namespace, Pod, Container string
}

// Join joins allocations to a reading.
func Join(allocs kubelet.Allocations, r *reading.Reading) Signals {
	s := Signals{Known: true}
	ds := indexDevices(r.Snapshot)
	held := make(map[podKey][]target) // what each pod was allocated
	unknown := make(map[podKey]bool)  // pods with an allocation that matched no device
	seen := make(map[allocKey]bool)   // time-sliced replicas of one GPU to one container are one allocation
	for _, a := range allocs.Items {
		pk := podKey{a.Namespace, a.Pod}
		t, ok := ds.resolve(a.Device)
		if !ok {
			s.Unmapped++
			unknown[pk] = true
			continue
		}
		held[pk] = append(held[pk], t)
		key := allocKey{t.dev.Index, t.gi, t.ci, a.Namespace, a.Pod, a.Container, a.Resource, kubelet.Claim{}}
		if a.Claim != nil {
			key.claim = *a.Claim
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		processes := -1
		if t.dev.ProcessesListed {
			processes = podProcesses(r, t, pk)
		}
		s.Allocations = append(s.Allocations, Allocation{Device: t.device(), Namespace: a.Namespace, Pod: a.Pod,
			Container: a.Container, Resource: a.Resource, DeviceID: a.DeviceID, Claim: a.Claim, Processes: processes})
	}
	s.Unrequested = unrequested(r, held, unknown)
	return s
}

type podKey struct{ namespace, pod string }

type allocKey struct {
	gpu, gi, ci                         int
	namespace, pod, container, resource string
	claim                               kubelet.Claim
}

// target is the device an allocation resolves to: a whole GPU, or one MIG instance of it.
type target struct {
	dev    *gpu.Device
	gi, ci int // -1 for the whole GPU
}

func (t target) isMIG() bool { return t.gi >= 0 }

func (t target) device() Device {
	return Device{GPU: t.dev.Index, UUID: t.dev.UUID, GPUInstance: t.gi, ComputeInstance: t.ci}
}

// covers reports whether a process on t.dev runs on the target. A process on a GPU in MIG mode that the source did
// not place in an instance is counted for every instance rather than called unrequested.
func (t target) covers(p *gpu.Process) bool {
	return !t.isMIG() || !p.MIG || p.GPUInstance == t.gi && p.ComputeInstance == t.ci
}

// devices indexes one snapshot's GPUs and MIG instances by the names device plugins and DRA drivers use. Indices
// and minor numbers are NVIDIA's names (its device plugin's index IDs, its DRA driver's gpu-<minor>): only NVIDIA's
// GPUs are found by them, since on a mixed node an AMD or Intel GPU's index or DRM minor can be the same number.
type devices struct {
	byUUID  map[string]target
	byIndex map[int]*gpu.Device    // NVIDIA's GPUs
	byMinor map[int]*gpu.Device    // NVIDIA's GPUs
	byPCI   map[string]*gpu.Device // AMD's device plugin, in the kernel's form of the address
	byCard  map[string]*gpu.Device // Intel's device plugin
}

func indexDevices(snap *gpu.Snapshot) devices {
	ds := devices{byUUID: make(map[string]target), byIndex: make(map[int]*gpu.Device), byMinor: make(map[int]*gpu.Device),
		byPCI: make(map[string]*gpu.Device), byCard: make(map[string]*gpu.Device)}
	for i := range snap.Devices {
		d := &snap.Devices[i]
		ds.byUUID[d.UUID] = target{dev: d, gi: -1, ci: -1}
		if d.Vendor == gpu.VendorNVIDIA {
			ds.byIndex[d.Index] = d
			if d.MinorNumber.Valid {
				ds.byMinor[int(d.MinorNumber.V)] = d
			}
		}
		if pci, ok := gpu.ParsePCIBusID(d.PCIBusID); ok {
			ds.byPCI[pci] = d
		}
		if d.DRMCard != "" {
			ds.byCard[d.DRMCard] = d
		}
		for _, mig := range d.MIG {
			ds.byUUID[mig.UUID] = target{dev: d, gi: mig.GPUInstance, ci: mig.ComputeInstance}
		}
	}
	return ds
}

// resolve finds the device an allocated device ID names.
func (ds devices) resolve(ref kubelet.DeviceRef) (target, bool) {
	switch {
	case ref.PCIBusID != "":
		d, ok := ds.byPCI[ref.PCIBusID]
		return target{dev: d, gi: -1, ci: -1}, ok
	case ref.DRMCard != "":
		d, ok := ds.byCard[ref.DRMCard]
		return target{dev: d, gi: -1, ci: -1}, ok
	case ref.Minor >= 0:
		d, ok := ds.byMinor[ref.Minor]
		if !ok {
			return target{}, false
		}
		if ref.MIG == nil {
			return target{dev: d, gi: -1, ci: -1}, true
		}
		return resolvePlacement(d, *ref.MIG)
	case ref.UUID != "":
		t, ok := ds.byUUID[ref.UUID]
		if ok && ref.GPUInstance >= 0 {
			t.gi, t.ci = ref.GPUInstance, ref.ComputeInstance
		}
		return t, ok
	case ref.Index >= 0:
		d, ok := ds.byIndex[ref.Index]
		if !ok {
			return target{}, false
		}
		if ref.MIGIndex < 0 {
			return target{dev: d, gi: -1, ci: -1}, true
		}
		// The NVIDIA device plugin's index IDs number MIG devices in NVML's enumeration order, which is the
		// order sources list them in.
		if ref.MIGIndex >= len(d.MIG) {
			return target{}, false
		}
		mig := d.MIG[ref.MIGIndex]
		return target{dev: d, gi: mig.GPUInstance, ci: mig.ComputeInstance}, true
	}
	return target{}, false
}

// resolvePlacement finds the MIG instance of d that a DRA device name places: by the GPU instance's profile ID and
// memory slices where the source read them, else by the profile name. Exactly one instance must match; a GPU
// instance split into several compute instances, or two instances of one profile without placements, stay unmapped
// rather than guessed.
func resolvePlacement(d *gpu.Device, want kubelet.MIGPlacement) (target, bool) {
	found, n := target{}, 0
	for _, mig := range d.MIG {
		var match bool
		if p := mig.Placement; p != nil {
			match = p.ProfileID == want.ProfileID && p.Start == want.Start && (want.Size == 0 || p.Size == want.Size)
		} else {
			match = want.Profile != "" && kubelet.DRAProfile(mig.Profile) == want.Profile
		}
		if match {
			found, n = target{dev: d, gi: mig.GPUInstance, ci: mig.ComputeInstance}, n+1
		}
	}
	return found, n == 1
}

// podProcesses counts the pod's processes on the target, and those of Kubernetes processes whose pod is not named
// yet (see Allocation.Processes).
func podProcesses(r *reading.Reading, t target, pk podKey) int {
	n := 0
	for i := range t.dev.Processes {
		p := &t.dev.Processes[i]
		if !t.covers(p) {
			continue
		}
		id := r.Owner(*p).Identity
		if id.Namespace == pk.namespace && id.Pod == pk.pod || id.IsKubernetes() && id.Pod == "" {
			n++
		}
	}
	return n
}

// unrequested lists each container of a named pod with processes on a GPU or MIG instance that none of its pod's
// allocations covers, leaving out the pods in unknown (see Signals.Unrequested).
func unrequested(r *reading.Reading, held map[podKey][]target, unknown map[podKey]bool) []Use {
	type useKey struct {
		gpu, gi, ci               int
		namespace, pod, container string
	}
	var uses []Use
	seen := make(map[useKey]bool)
	for i := range r.Snapshot.Devices {
		d := &r.Snapshot.Devices[i]
		for j := range d.Processes {
			p := &d.Processes[j]
			id := r.Owner(*p).Identity
			pk := podKey{id.Namespace, id.Pod}
			if id.Pod == "" || id.Namespace == "" || unknown[pk] || allocated(held[pk], d, p) {
				continue
			}
			gi, ci := -1, -1
			if p.MIG {
				gi, ci = p.GPUInstance, p.ComputeInstance
			}
			key := useKey{d.Index, gi, ci, id.Namespace, id.Pod, id.Container}
			if seen[key] {
				continue
			}
			seen[key] = true
			uses = append(uses, Use{Device: Device{GPU: d.Index, UUID: d.UUID, GPUInstance: gi, ComputeInstance: ci},
				Namespace: id.Namespace, Pod: id.Pod, Container: id.Container})
		}
	}
	return uses
}

func allocated(held []target, d *gpu.Device, p *gpu.Process) bool {
	for _, t := range held {
		if t.dev == d && t.covers(p) {
			return true
		}
	}
	return false
}
