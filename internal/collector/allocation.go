package collector

import (
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// allocationMetrics show what the kubelet's allocations say about each reading (internal/allocation): who holds a
// GPU, who holds one and leaves it idle, and who uses one that was never allocated to them.
type allocationMetrics struct {
	source                       allocation.Source
	info, processes, unrequested *series.Desc
	unmapped                     *series.Desc
}

// The dra_* labels are dcgm-exporter's, so that queries over its DRA series carry over; they are empty for device
// plugin allocations.
var allocationLabels = []string{"gpu", "uuid", "gpu_instance", "compute_instance", "namespace", "pod", "container", "resource",
	"dra_claim_name", "dra_claim_namespace", "dra_driver_name", "dra_pool_name", "dra_device_name"}

func newAllocationMetrics(source allocation.Source) *allocationMetrics {
	return &allocationMetrics{
		source: source,
		info: series.NewDesc(families.AllocationInfo.Name,
			"GPU or MIG device that the kubelet allocated to the container (PodResources API), through a device plugin "+
				"or a DRA ResourceClaim; always 1. gpu_instance and compute_instance are empty unless the device is a MIG "+
				"instance; resource is the device plugin resource or the DRA driver; the dra_* labels are empty for "+
				"device plugin allocations.",
			allocationLabels),
		processes: series.NewDesc(families.AllocationProcesses.Name,
			"Processes of the allocated pod on the allocated GPU or MIG device; 0 means allocated and idle. "+
				"Processes of pods whose names are not known yet count for every allocation of their GPU.",
			allocationLabels),
		unrequested: series.NewDesc(families.UnrequestedUse.Name,
			"1 for a Kubernetes container with processes on a GPU or MIG device that no kubelet allocation gives its pod "+
				"(NVIDIA_VISIBLE_DEVICES=all, privileged pods). Only while the kubelet's allocations are known.",
			[]string{"gpu", "uuid", "gpu_instance", "compute_instance", "namespace", "pod", "container"}),
		unmapped: series.NewDesc(families.UnmappedDevices.Name,
			"Allocated GPU device IDs and DRA device names that match no GPU or MIG device of the current reading (unknown "+
				"ID format, a GPU that could not be read, a MIG device whose placement is unknown). Their pods get no "+
				"gpu_unrequested_use series.",
			nil),
	}
}

func (m *allocationMetrics) descs() []*series.Desc {
	return []*series.Desc{m.info, m.processes, m.unrequested, m.unmapped}
}

func (m *allocationMetrics) update(b *series.Batch, r *reading.Reading) {
	allocs, ok := m.source.Allocations()
	if !ok {
		return
	}
	s := allocation.Join(allocs, r)
	for _, a := range s.Allocations {
		gi, ci := instanceLabels(a.Device)
		var claimName, claimNamespace, driver, pool, device string
		if c := a.Claim; c != nil {
			claimName, claimNamespace, driver, pool, device = c.Name, c.Namespace, a.Resource, c.Pool, a.DeviceID
		}
		values := []string{itoa(a.GPU), a.UUID, gi, ci, a.Namespace, a.Pod, a.Container, a.Resource,
			claimName, claimNamespace, driver, pool, device}
		b.Gauge(m.info, 1, values...)
		if a.Processes >= 0 {
			b.Gauge(m.processes, float64(a.Processes), values...)
		}
	}
	b.Gauge(m.unmapped, float64(s.Unmapped))
	for _, u := range s.Unrequested {
		gi, ci := instanceLabels(u.Device)
		b.Gauge(m.unrequested, 1, itoa(u.GPU), u.UUID, gi, ci, u.Namespace, u.Pod, u.Container)
	}
}

// instanceLabels are a device's gpu_instance and compute_instance: empty for a whole GPU.
func instanceLabels(d allocation.Device) (string, string) {
	if !d.IsMIG() {
		return "", ""
	}
	return itoa(d.GPUInstance), itoa(d.ComputeInstance)
}
