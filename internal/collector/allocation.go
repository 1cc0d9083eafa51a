package collector

import (
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// AllocationSource gives the kubelet's latest GPU allocations; ok is false when they are not known (no kubelet,
// kubelet down), which is not the same as no allocations.
type AllocationSource interface {
	Allocations() (allocs kubelet.Allocations, ok bool)
}

// allocationMetrics join the kubelet's allocations with the processes actually on each GPU: who holds a GPU, who
// holds one and leaves it idle, and who uses one that was never allocated to them. Allocations and processes are
// matched by namespace and pod name, the only identity the PodResources API gives.
type allocationMetrics struct {
	source                       AllocationSource
	info, processes, unrequested *desc
	unmapped                     *desc
}

// The dra_* labels are dcgm-exporter's, so that queries over its DRA series carry over; they are empty for device
// plugin allocations.
var allocationLabels = []string{"gpu", "uuid", "gpu_instance", "compute_instance", "namespace", "pod", "container", "resource",
	"dra_claim_name", "dra_claim_namespace", "dra_driver_name", "dra_pool_name", "dra_device_name"}

func newAllocationMetrics(source AllocationSource) *allocationMetrics {
	return &allocationMetrics{
		source: source,
		info: newDesc("gpu_allocation_info",
			"GPU or MIG device that the kubelet allocated to the container (PodResources API), through a device plugin "+
				"or a DRA ResourceClaim; always 1. gpu_instance and compute_instance are empty unless the device is a MIG "+
				"instance; resource is the device plugin resource or the DRA driver; the dra_* labels are empty for "+
				"device plugin allocations.",
			allocationLabels),
		processes: newDesc("gpu_allocation_processes",
			"Processes of the allocated pod on the allocated GPU or MIG device; 0 means allocated and idle. "+
				"Processes of pods whose names are not known yet count for every allocation of their GPU.",
			allocationLabels),
		unrequested: newDesc("gpu_unrequested_use",
			"1 for a Kubernetes container with processes on a GPU or MIG device that no kubelet allocation gives its pod "+
				"(NVIDIA_VISIBLE_DEVICES=all, privileged pods). Only while the kubelet's allocations are known.",
			[]string{"gpu", "uuid", "gpu_instance", "compute_instance", "namespace", "pod", "container"}),
		unmapped: newDesc("gpu_pod_exporter_kubelet_unmapped_devices",
			"Allocated GPU device IDs and DRA device names that match no GPU or MIG device of the current reading (unknown "+
				"ID format, a GPU that could not be read, a MIG device whose placement is unknown). Their pods get no "+
				"gpu_unrequested_use series.",
			nil),
	}
}

func (m *allocationMetrics) descs() []*desc {
	return []*desc{m.info, m.processes, m.unrequested, m.unmapped}
}

// target is the device an allocation resolves to: a whole GPU, or one MIG instance of it.
type target struct {
	dev    *gpu.Device
	gi, ci int // -1 for the whole GPU
}

func (t target) isMIG() bool { return t.gi >= 0 }

// covers reports whether a process on t.dev runs on the target. A process on a GPU in MIG mode that the source did
// not place in an instance is counted for every instance rather than called unrequested.
func (t target) covers(p *gpu.Process) bool {
	return !t.isMIG() || !p.MIG || p.GPUInstance == t.gi && p.ComputeInstance == t.ci
}

func (t target) instanceLabels() (string, string) {
	if !t.isMIG() {
		return "", ""
	}
	return itoa(t.gi), itoa(t.ci)
}

// devices indexes one snapshot's GPUs and MIG instances by the names device plugins and DRA drivers use.
type devices struct {
	byUUID  map[string]target
	byIndex map[int]*gpu.Device
	byMinor map[int]*gpu.Device
}

func indexDevices(snap *gpu.Snapshot) devices {
	ds := devices{byUUID: make(map[string]target), byIndex: make(map[int]*gpu.Device), byMinor: make(map[int]*gpu.Device)}
	for i := range snap.Devices {
		d := &snap.Devices[i]
		ds.byUUID[d.UUID] = target{dev: d, gi: -1, ci: -1}
		ds.byIndex[d.Index] = d
		if d.MinorNumber.Valid {
			ds.byMinor[int(d.MinorNumber.V)] = d
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

type podKey struct{ namespace, pod string }

type allocKey struct {
	gpu, gi, ci                         int
	namespace, pod, container, resource string
	claim                               kubelet.Claim
}

func (m *allocationMetrics) update(b *batch, r *reading.Reading) {
	allocs, ok := m.source.Allocations()
	if !ok {
		return
	}
	ds := indexDevices(r.Snapshot)
	held := make(map[podKey][]target) // what each pod was allocated
	unknown := make(map[podKey]bool)  // pods with an allocation that matched no device
	seen := make(map[allocKey]bool)   // time-sliced replicas of one GPU to one container are one allocation
	unmapped := 0
	for _, a := range allocs.Items {
		pk := podKey{a.Namespace, a.Pod}
		t, ok := ds.resolve(a.Device)
		if !ok {
			unmapped++
			unknown[pk] = true
			continue
		}
		held[pk] = append(held[pk], t)
		key := allocKey{t.dev.Index, t.gi, t.ci, a.Namespace, a.Pod, a.Container, a.Resource, kubelet.Claim{}}
		var claimName, claimNamespace, driver, pool, device string
		if c := a.Claim; c != nil {
			key.claim = *c
			claimName, claimNamespace, driver, pool, device = c.Name, c.Namespace, a.Resource, c.Pool, a.DeviceID
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		gi, ci := t.instanceLabels()
		values := []string{itoa(t.dev.Index), t.dev.UUID, gi, ci, a.Namespace, a.Pod, a.Container, a.Resource,
			claimName, claimNamespace, driver, pool, device}
		b.gauge(m.info, 1, values...)
		if t.dev.ProcessesListed {
			b.gauge(m.processes, float64(m.podProcesses(r, t, pk)), values...)
		}
	}
	b.gauge(m.unmapped, float64(unmapped))
	m.updateUnrequested(b, r, held, unknown)
}

// podProcesses counts the pod's processes on the target, and those of Kubernetes processes whose pod is not named
// yet (a CRI lookup still pending): they might be the pod's, and calling a busy GPU idle is the worse mistake.
func (m *allocationMetrics) podProcesses(r *reading.Reading, t target, pk podKey) int {
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

// updateUnrequested writes gpu_unrequested_use for each container of a named pod with processes on a GPU or MIG
// instance that none of its pod's allocations covers. Pods with an allocation that could not be mapped are left
// out: the unmapped one may be the very device.
func (m *allocationMetrics) updateUnrequested(b *batch, r *reading.Reading, held map[podKey][]target, unknown map[podKey]bool) {
	type useKey struct {
		gpu, gi, ci               int
		namespace, pod, container string
	}
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
			gil, cil := target{gi: gi, ci: ci}.instanceLabels()
			b.gauge(m.unrequested, 1, itoa(d.Index), d.UUID, gil, cil, id.Namespace, id.Pod, id.Container)
		}
	}
}

func allocated(held []target, d *gpu.Device, p *gpu.Process) bool {
	for _, t := range held {
		if t.dev == d && t.covers(p) {
			return true
		}
	}
	return false
}
