package collector

import (
	"hash/maphash"
	"strconv"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// AllocationSignals is what the allocation series (gpu_allocation_info, gpu_allocation_processes,
// gpu_unrequested_use) say about one reading, for views that are not Prometheus (top).
type AllocationSignals struct {
	// Known is false when the allocations could not be read (no kubelet, kubelet down): nothing below means
	// anything then.
	Known       bool
	Allocations []AllocationSignal
	Unrequested []AllocationSignal
}

// AllocationSignal is one series: a container's allocation of a GPU or MIG device, or its use of one it was not
// allocated. GPUInstance and ComputeInstance are -1 for a whole GPU.
type AllocationSignal struct {
	GPU, GPUInstance, ComputeInstance int
	Namespace, Pod, Container         string
	Resource                          string // empty for unrequested use
	// Processes of the pod on the device, -1 when the device's process list could not be read. 0 is an idle
	// allocation.
	Processes int
}

// ReadAllocationSignals joins the allocations with the reading exactly as the metrics do: it runs the same join
// and reads its series back, so that a view and /metrics can never disagree about who holds or misuses a GPU.
func ReadAllocationSignals(source AllocationSource, r *reading.Reading) AllocationSignals {
	m := newAllocationMetrics(source)
	b := newBatch(carried{}, maphash.MakeSeed())
	m.update(b, r)
	var s AllocationSignals
	processes := make(map[AllocationSignal]int)
	// A series that could not be written (a label that is not UTF-8) is left out, as on /metrics.
	for _, f := range b.families {
		for _, series := range f.series {
			l := make(map[string]string, len(f.desc.labels))
			for i, name := range f.desc.labels {
				l[name] = b.values(f, series)[i]
			}
			sig := AllocationSignal{
				GPU: number(l["gpu"]), GPUInstance: number(l["gpu_instance"]), ComputeInstance: number(l["compute_instance"]),
				Namespace: l["namespace"], Pod: l["pod"], Container: l["container"], Resource: l["resource"], Processes: -1,
			}
			switch f.desc {
			case m.unmapped:
				s.Known = true // written on every reading whose allocations are known, even with none
			case m.info:
				s.Allocations = append(s.Allocations, sig)
			case m.processes:
				processes[sig] = int(series.metric.GetGauge().GetValue())
			case m.unrequested:
				s.Unrequested = append(s.Unrequested, sig)
			}
		}
	}
	for i, a := range s.Allocations {
		if n, ok := processes[a]; ok {
			s.Allocations[i].Processes = n
		}
	}
	return s
}

// number parses an index label; empty (no MIG instance) is -1.
func number(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}
