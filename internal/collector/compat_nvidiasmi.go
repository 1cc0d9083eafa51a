package collector

import (
	"strconv"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// nvidiasmiMetrics is --compat=nvidiasmi: the per-process series of the nvidia-smi exporter
// (kristophjunge/docker-prometheus-nvidiasmi and its forks), with the pod_name label that dashboards built on it
// add, so that a panel such as sum(nvidiasmi_process_used_memory_bytes{uuid=~"GPU-$gpu"}) by (pod_name) keeps
// working. See docs/compat.md.
type nvidiasmiMetrics struct {
	memory *series.Desc
}

func newNvidiasmiMetrics() *nvidiasmiMetrics {
	return &nvidiasmiMetrics{
		memory: series.NewDesc("nvidiasmi_process_used_memory_bytes",
			"GPU memory used by the process on this GPU, as the nvidia-smi exporter writes it (--compat=nvidiasmi); pod_name is the owning pod.",
			[]string{"id", "uuid", "name", "process_pid", "process_name", "process_type", "pod_name"}),
	}
}

func (m *nvidiasmiMetrics) descs() []*series.Desc { return []*series.Desc{m.memory} }

// smiProcess is one process on one GPU. On a GPU in MIG mode the same PID can be listed once per MIG instance it
// uses; the original has no instance label, so those entries are summed into one series instead of colliding.
type smiProcess struct {
	p      gpu.Process
	pod    string
	memory gpu.Value
}

func (m *nvidiasmiMetrics) update(b *series.Batch, r *reading.Reading) {
	for i := range r.Snapshot.Devices {
		d := &r.Snapshot.Devices[i]
		if d.Vendor != gpu.VendorNVIDIA { // nvidia-smi lists NVIDIA's GPUs alone
			continue
		}
		var order []uint32
		byPID := make(map[uint32]*smiProcess)
		for _, p := range d.Processes {
			sp, ok := byPID[p.PID]
			if !ok {
				sp = &smiProcess{p: p, pod: r.Owner(p).Identity.Pod}
				byPID[p.PID] = sp
				order = append(order, p.PID)
			}
			addValue(&sp.memory, p.UsedMemoryBytes)
		}
		for _, pid := range order {
			sp := byPID[pid]
			// The original writes 0 for N/A; we leave the series out, as everywhere else.
			if !sp.memory.Valid {
				continue
			}
			name := sp.p.Name
			if name == "" {
				name = r.Owner(sp.p).Name
			}
			b.Gauge(m.memory, sp.memory.V, d.PCIBusID, d.UUID, d.Name, strconv.FormatUint(uint64(pid), 10), processName(name),
				smiProcessType(sp.p.Type), sp.pod)
		}
	}
}

// smiProcessType writes a process type as nvidia-smi's <type> element does: C, G, C+G, and M+C for an MPS client.
func smiProcessType(t string) string {
	switch t {
	case gpu.ProcessCompute:
		return "C"
	case gpu.ProcessGraphics:
		return "G"
	case gpu.ProcessComputeAndGraphics:
		return "C+G"
	case gpu.ProcessMPS:
		return "M+C"
	}
	return t
}
