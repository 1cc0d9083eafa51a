package collector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/accounting"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/scrape"
)

// accountingMetrics say who pays for each GPU: its power split among its workloads, and per-workload counters of
// energy, GPU time and memory-time (internal/accounting, docs/accounting.md). The ledger accounts each reading
// once, however many scrapes share it.
type accountingMetrics struct {
	labels                                  podLabels
	ledger                                  *accounting.Ledger
	power, energy, smSeconds, memorySeconds *prometheus.Desc
	unattributedPower, unattributedEnergy   *prometheus.Desc
}

func newAccountingMetrics(labels podLabels) *accountingMetrics {
	names := labels.labelNames(workloadIdentityLabels, "gpu", "uuid")
	desc := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, names, nil) }
	return &accountingMetrics{
		labels: labels,
		ledger: accounting.New(),
		power: desc("gpu_workload_power_watts", "The workload's share of the GPU's board power: by SM utilization share "+
			"when the GPU reports per-process utilization, else by memory share (MIG: across all instances)."),
		energy: desc("gpu_workload_energy_joules_total", "The workload's share of the GPU's energy since it arrived on the "+
			"GPU; with gpu_unattributed_energy_joules_total it adds up to the board's energy."),
		smSeconds: desc("gpu_workload_sm_seconds_total", "SM utilization of the workload integrated over time, in "+
			"GPU-seconds (GPU-hours / 3600)."),
		memorySeconds: desc("gpu_workload_memory_byte_seconds_total", "GPU memory held by the workload integrated over "+
			"time, in byte-seconds."),
		unattributedPower: gpuDesc("gpu_unattributed_power_watts", "The GPU's board power that no workload's share "+
			"covers: all of it on an idle GPU."),
		unattributedEnergy: gpuDesc("gpu_unattributed_energy_joules_total", "The GPU's energy that went to no workload "+
			"since the exporter started: idle time, intervals a workload arrived in, readings without a process list."),
	}
}

func (m *accountingMetrics) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.power, m.energy, m.smSeconds, m.memorySeconds, m.unattributedPower, m.unattributedEnergy} {
		ch <- d
	}
}

func (m *accountingMetrics) update(ch chan<- prometheus.Metric, r *scrape.Result) {
	m.ledger.Observe(r)
	values := make([]string, 0, 16)
	m.ledger.Each(func(g *accounting.GPU) {
		idx := itoa(g.Index)
		if g.UnattributedPowerWatts.Valid {
			gauge(ch, m.unattributedPower, g.UnattributedPowerWatts.V, idx, g.UUID)
		}
		counter(ch, m.unattributedEnergy, g.UnattributedEnergyJoules, idx, g.UUID)
		for _, w := range g.Workloads {
			values = m.labels.appendWorkloadIdentity(append(values[:0], idx, g.UUID), &w.Identity)
			if w.PowerWatts.Valid {
				gauge(ch, m.power, w.PowerWatts.V, values...)
			}
			counter(ch, m.energy, w.EnergyJoules, values...)
			if w.SMSeconds.Valid {
				counter(ch, m.smSeconds, w.SMSeconds.V, values...)
			}
			if w.MemoryByteSeconds.Valid {
				counter(ch, m.memorySeconds, w.MemoryByteSeconds.V, values...)
			}
		}
	})
}
