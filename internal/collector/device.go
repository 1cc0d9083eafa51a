package collector

import (
	"strconv"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// deviceMetrics are the per-GPU series.
type deviceMetrics struct {
	info, memTotal, memUsed, memFree, memReserved *desc
	util, memUtil, encUtil, decUtil               *desc
	temp, power, powerLimit, energy, fan, pstate  *desc
	clock, ecc, xid, processes                    *desc
}

var gpuLabels = []string{"gpu", "uuid"}

func gpuDesc(name, help string, extra ...string) *desc {
	return newDesc(name, help, append(append([]string{}, gpuLabels...), extra...))
}

func newDeviceMetrics() *deviceMetrics {
	return &deviceMetrics{
		info: gpuDesc("gpu_info", "GPU identity; always 1. simulated=\"true\" when the data does not come from real hardware.",
			"name", "pci_bus_id", "driver_version", "cuda_version", "mig_mode", "simulated"),
		memTotal: gpuDesc("gpu_memory_total_bytes", "Total framebuffer memory of the GPU."),
		memUsed: gpuDesc("gpu_memory_used_bytes", "Framebuffer memory allocated by processes and the driver, without "+
			"the memory the driver reserves for itself (gpu_memory_reserved_bytes), which drivers before R510 count in."),
		memFree: gpuDesc("gpu_memory_free_bytes", "Framebuffer memory not in use."),
		memReserved: gpuDesc("gpu_memory_reserved_bytes", "Framebuffer memory the driver and firmware reserve for "+
			"themselves; used + free + reserved = total. Absent with drivers before R510."),
		util:       gpuDesc("gpu_utilization_ratio", "Fraction of the last sample period in which a kernel ran on the GPU."),
		memUtil:    gpuDesc("gpu_memory_utilization_ratio", "Fraction of the last sample period in which device memory was read or written."),
		encUtil:    gpuDesc("gpu_encoder_utilization_ratio", "Video encoder utilization."),
		decUtil:    gpuDesc("gpu_decoder_utilization_ratio", "Video decoder utilization."),
		temp:       gpuDesc("gpu_temperature_celsius", "GPU core temperature."),
		power:      gpuDesc("gpu_power_usage_watts", "Power drawn by the GPU board."),
		powerLimit: gpuDesc("gpu_power_limit_watts", "Power limit enforced on the GPU board."),
		energy:     gpuDesc("gpu_energy_consumption_joules_total", "Energy consumed by the GPU since the driver was loaded."),
		fan:        gpuDesc("gpu_fan_speed_ratio", "Fan speed as a fraction of its maximum."),
		pstate:     gpuDesc("gpu_performance_state", "Performance state: 0 (P0, maximum performance) to 15 (P15, minimum)."),
		clock:      gpuDesc("gpu_clock_hertz", "Current clock frequency, by clock domain.", "clock"),
		ecc: gpuDesc("gpu_ecc_errors_total", "ECC errors over the GPU's lifetime (the aggregate counts kept in its "+
			"InfoROM, across driver reloads and reboots), by type (corrected, uncorrected).", "type"),
		xid:       gpuDesc("gpu_xid_errors_total", "XID errors reported by the driver since the exporter started, by XID code.", "xid"),
		processes: gpuDesc("gpu_processes", "Processes running on the GPU, by type.", "type"),
	}
}

func (m *deviceMetrics) descs() []*desc {
	return []*desc{m.info, m.memTotal, m.memUsed, m.memFree, m.memReserved, m.util, m.memUtil, m.encUtil,
		m.decUtil, m.temp, m.power, m.powerLimit, m.energy, m.fan, m.pstate, m.clock, m.ecc, m.xid, m.processes}
}

var processTypes = []string{gpu.ProcessCompute, gpu.ProcessGraphics, gpu.ProcessComputeAndGraphics, gpu.ProcessMPS}

func (m *deviceMetrics) update(b *batch, r *reading.Reading) {
	snap := r.Snapshot
	for i := range snap.Devices {
		d := &snap.Devices[i]
		idx := itoa(d.Index)
		b.gauge(m.info, 1, idx, d.UUID, d.Name, d.PCIBusID, snap.DriverVersion, snap.CUDAVersion, string(d.MIGMode),
			strconv.FormatBool(snap.Simulated))
		optional := func(desc *desc, v gpu.Value) {
			if v.Valid {
				b.gauge(desc, v.V, idx, d.UUID)
			}
		}
		optional(m.memTotal, d.MemoryTotalBytes)
		optional(m.memUsed, d.MemoryUsedBytes)
		optional(m.memFree, d.MemoryFreeBytes)
		optional(m.memReserved, d.MemoryReservedBytes)
		optional(m.util, d.UtilizationRatio)
		optional(m.memUtil, d.MemoryUtilizationRatio)
		optional(m.encUtil, d.EncoderUtilizationRatio)
		optional(m.decUtil, d.DecoderUtilizationRatio)
		optional(m.temp, d.TemperatureCelsius)
		optional(m.power, d.PowerUsageWatts)
		optional(m.powerLimit, d.PowerLimitWatts)
		optional(m.fan, d.FanSpeedRatio)
		optional(m.pstate, d.PerformanceState)
		if d.EnergyJoules.Valid {
			b.counter(m.energy, d.EnergyJoules.V, idx, d.UUID)
		}
		for _, c := range d.Clocks {
			b.gauge(m.clock, c.Hertz, idx, d.UUID, c.Name)
		}
		for _, e := range d.ECCErrors {
			b.counter(m.ecc, e.Count, idx, d.UUID, e.Type)
		}
		for _, x := range d.XIDErrors {
			b.counter(m.xid, float64(x.Count), idx, d.UUID, strconv.FormatUint(x.XID, 10))
		}
		if d.ProcessesListed {
			var counts [4]int
			for _, p := range d.Processes {
				for t, name := range processTypes {
					if p.Type == name {
						counts[t]++
					}
				}
			}
			for t, name := range processTypes {
				b.gauge(m.processes, float64(counts[t]), idx, d.UUID, name)
			}
		}
	}
}

// migMetrics are the per-MIG-instance series.
type migMetrics struct {
	info, memTotal, memUsed *desc
}

func newMIGMetrics() *migMetrics {
	labels := []string{"mig_uuid", "gpu_instance", "compute_instance"}
	return &migMetrics{
		info: gpuDesc("gpu_mig_info", "MIG instance on a GPU in MIG mode; always 1.", append(labels, "mig_profile")...),
		memTotal: gpuDesc("gpu_mig_memory_total_bytes", "Framebuffer memory of the MIG GPU instance, which its compute "+
			"instances share: reported once per GPU instance, on one of its MIG devices.", labels...),
		memUsed: gpuDesc("gpu_mig_memory_used_bytes", "Framebuffer memory in use on the MIG GPU instance, reported once "+
			"per GPU instance, on one of its MIG devices.", labels...),
	}
}

func (m *migMetrics) descs() []*desc { return []*desc{m.info, m.memTotal, m.memUsed} }

func (m *migMetrics) update(b *batch, r *reading.Reading) {
	for i := range r.Snapshot.Devices {
		d := &r.Snapshot.Devices[i]
		idx := itoa(d.Index)
		for _, mig := range d.MIG {
			gi, ci := itoa(mig.GPUInstance), itoa(mig.ComputeInstance)
			b.gauge(m.info, 1, idx, d.UUID, mig.UUID, gi, ci, mig.Profile)
			if mig.MemoryTotalBytes.Valid {
				b.gauge(m.memTotal, mig.MemoryTotalBytes.V, idx, d.UUID, mig.UUID, gi, ci)
			}
			if mig.MemoryUsedBytes.Valid {
				b.gauge(m.memUsed, mig.MemoryUsedBytes.V, idx, d.UUID, mig.UUID, gi, ci)
			}
		}
	}
}
