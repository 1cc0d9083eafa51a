package collector

import (
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// sharingMetrics say how many workloads share each GPU: time-slicing, MPS and pods that see GPUs they did not
// request all show up as more than one. It needs no kubelet.
type sharingMetrics struct {
	workloads *desc
}

func newSharingMetrics() *sharingMetrics {
	return &sharingMetrics{workloads: gpuDesc("gpu_workloads",
		"Distinct workloads (pod container, container, Slurm job or service; one identity of gpu_workload_processes) "+
			"with processes on the GPU, MIG instances included. Absent when the process list could not be read.")}
}

func (m *sharingMetrics) descs() []*desc { return []*desc{m.workloads} }

func (m *sharingMetrics) update(b *batch, r *reading.Reading) {
	distinct := make(map[attribution.WorkloadKey]struct{})
	for i := range r.Snapshot.Devices {
		d := &r.Snapshot.Devices[i]
		if !d.ProcessesListed {
			continue
		}
		clear(distinct)
		for _, p := range d.Processes {
			distinct[r.Owner(p).Identity.Key()] = struct{}{}
		}
		b.gauge(m.workloads, float64(len(distinct)), itoa(d.Index), d.UUID)
	}
}
