package collector

import (
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/accounting"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// accountingMetrics say who pays for each GPU: its power split among its workloads, and per-workload counters of
// energy, GPU time and memory-time (internal/accounting, docs/accounting.md). The ledger accounts each reading
// once, however many scrapes share it.
type accountingMetrics struct {
	labels                                  podLabels
	ledger                                  *accounting.Ledger
	power, energy, smSeconds, memorySeconds *series.Desc
	unattributedPower, unattributedEnergy   *series.Desc
}

func newAccountingMetrics(labels podLabels) *accountingMetrics {
	names := labels.labelNames(attribution.OnWorkloads, "gpu", "uuid")
	family := func(name, help string) *series.Desc { return series.NewDesc(name, help, names) }
	return &accountingMetrics{
		labels: labels,
		ledger: accounting.New(),
		power: family("gpu_workload_power_watts", "The workload's share of the GPU's board power: by SM utilization share "+
			"when the GPU reports per-process utilization, else by memory share (MIG: across all instances)."),
		energy: family("gpu_workload_energy_joules_total", "The workload's share of the GPU's energy since it arrived on the "+
			"GPU; with gpu_unattributed_energy_joules_total it adds up to the board's energy."),
		smSeconds: family("gpu_workload_sm_seconds_total", "SM utilization of the workload integrated over time, in "+
			"GPU-seconds (GPU-hours / 3600)."),
		memorySeconds: family("gpu_workload_memory_byte_seconds_total", "GPU memory held by the workload integrated over "+
			"time, in byte-seconds."),
		unattributedPower: gpuDesc("gpu_unattributed_power_watts", "The GPU's board power that no workload's share "+
			"covers: all of it on an idle GPU."),
		unattributedEnergy: gpuDesc("gpu_unattributed_energy_joules_total", "The GPU's energy that went to no workload "+
			"since the exporter started: idle time, intervals a workload arrived in, readings without a process list."),
	}
}

func (m *accountingMetrics) descs() []*series.Desc {
	return []*series.Desc{m.power, m.energy, m.smSeconds, m.memorySeconds, m.unattributedPower, m.unattributedEnergy}
}

func (m *accountingMetrics) update(b *series.Batch, r *reading.Reading) {
	m.ledger.Observe(r)
	values := make([]string, 0, 16)
	m.ledger.Each(func(g *accounting.GPU) {
		idx := itoa(g.Index)
		if g.UnattributedPowerWatts.Valid {
			b.Gauge(m.unattributedPower, g.UnattributedPowerWatts.V, idx, g.UUID)
		}
		b.Counter(m.unattributedEnergy, g.UnattributedEnergyJoules, idx, g.UUID)
		for _, w := range g.Workloads {
			values = m.labels.appendIdentity(append(values[:0], idx, g.UUID), attribution.OnWorkloads, &w.Identity)
			if w.PowerWatts.Valid {
				b.Gauge(m.power, w.PowerWatts.V, values...)
			}
			b.Counter(m.energy, w.EnergyJoules, values...)
			if w.SMSeconds.Valid {
				b.Counter(m.smSeconds, w.SMSeconds.V, values...)
			}
			if w.MemoryByteSeconds.Valid {
				b.Counter(m.memorySeconds, w.MemoryByteSeconds.V, values...)
			}
		}
	})
}
