package collector

import (
	"slices"
	"strconv"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// deviceFamily is one family of per-GPU series (per MIG instance for some), and all that the exporter says about
// it. The series, the --compat=dcgm fields and the check of docs/reference.md's GPU and MIG tables all read
// deviceFamilies: a family is added as a row there, its value as a field of gpu.Device that the sources fill.
type deviceFamily struct {
	name string
	typ  metricType
	// unit is the base unit the name ends with, before _total: "bytes", "ratio", "celsius". Empty for a count, a
	// state or an info family.
	unit string
	help string
	// labels are the family's labels besides gpu and uuid.
	labels []string
	// sources are the GPU sources that fill the family where the hardware has it.
	sources source
	// value reads a family without labels; an absent value writes no series. Each row has value or series.
	value func(d *gpu.Device) gpu.Value
	// series writes the series of a family with labels (or one that needs more than the device) through s.add.
	series func(s *deviceSeries, r *reading.Reading, d *gpu.Device)
	// dcgm are the fields of dcgm-exporter written from the family under --compat=dcgm.
	dcgm []dcgmField
}

// metricType is a family's Prometheus type.
type metricType int

const (
	gauge metricType = iota
	counter
)

func (t metricType) String() string {
	if t == counter {
		return "counter"
	}
	return "gauge"
}

// write adds one series of type t to the batch.
func (t metricType) write(b *batch, d *desc, v float64, labels []string) {
	if t == counter {
		b.counter(d, v, labels...)
	} else {
		b.gauge(d, v, labels...)
	}
}

// source is a set of GPU sources (gpu.Source), by their names: nvml, nvidia-smi, simulated.
type source uint8

const (
	fromNVML source = 1 << iota
	fromNvidiaSMI
	fromSimulated
	fromAll = fromNVML | fromNvidiaSMI | fromSimulated
)

// deviceFamilies are the device families, in the order of docs/reference.md's tables (GPUs, then MIG instances).
var deviceFamilies = []deviceFamily{
	{
		name: "gpu_info", typ: gauge, sources: fromAll,
		help:   "GPU identity; always 1. simulated=\"true\" when the data does not come from real hardware.",
		labels: []string{"name", "pci_bus_id", "driver_version", "cuda_version", "mig_mode", "simulated"},
		series: func(s *deviceSeries, r *reading.Reading, d *gpu.Device) {
			snap := r.Snapshot
			s.add(1, d.Name, d.PCIBusID, snap.DriverVersion, snap.CUDAVersion, string(d.MIGMode), strconv.FormatBool(snap.Simulated))
		},
	},
	{
		name: "gpu_memory_total_bytes", typ: gauge, unit: "bytes", sources: fromAll,
		help:  "Total framebuffer memory of the GPU.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryTotalBytes },
	},
	{
		name: "gpu_memory_used_bytes", typ: gauge, unit: "bytes", sources: fromAll,
		help: "Framebuffer memory allocated by processes and the driver, without the memory the driver reserves for " +
			"itself (gpu_memory_reserved_bytes), which drivers before R510 count in.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryUsedBytes },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_FB_USED", typ: gauge, convert: toMiB, help: "Framebuffer memory used (in MiB).",
			share:    func(_ *gpu.Device, p *gpu.Process) gpu.Value { return p.UsedMemoryBytes },
			instance: func(m *gpu.MIGInstance) gpu.Value { return m.MemoryUsedBytes },
		}},
	},
	{
		name: "gpu_memory_free_bytes", typ: gauge, unit: "bytes", sources: fromAll,
		help:  "Framebuffer memory not in use.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryFreeBytes },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_FB_FREE", typ: gauge, convert: toMiB, help: "Framebuffer memory free (in MiB).",
			instance: func(m *gpu.MIGInstance) gpu.Value {
				return gpu.Value{V: m.MemoryTotalBytes.V - m.MemoryUsedBytes.V, Valid: m.MemoryTotalBytes.Valid && m.MemoryUsedBytes.Valid}
			},
		}},
	},
	{
		name: "gpu_memory_reserved_bytes", typ: gauge, unit: "bytes", sources: fromAll,
		help: "Framebuffer memory the driver and firmware reserve for themselves; used + free + reserved = total. " +
			"Absent with drivers before R510.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryReservedBytes },
	},
	{
		name: "gpu_utilization_ratio", typ: gauge, unit: "ratio", sources: fromAll,
		help:  "Fraction of the last sample period in which a kernel ran on the GPU.",
		value: func(d *gpu.Device) gpu.Value { return d.UtilizationRatio },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_GPU_UTIL", typ: gauge, convert: toPercent, help: "GPU utilization (in %).",
			share:     func(_ *gpu.Device, p *gpu.Process) gpu.Value { return p.SMUtilizationRatio },
			shareHelp: " A pod's share is its SM utilization.",
		}},
	},
	{
		name: "gpu_memory_utilization_ratio", typ: gauge, unit: "ratio", sources: fromAll,
		help:  "Fraction of the last sample period in which device memory was read or written.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryUtilizationRatio },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_MEM_COPY_UTIL", typ: gauge, convert: toPercent, help: "Memory utilization (in %).",
			share: func(_ *gpu.Device, p *gpu.Process) gpu.Value { return p.MemoryUtilizationRatio },
		}},
	},
	{
		name: "gpu_encoder_utilization_ratio", typ: gauge, unit: "ratio", sources: fromAll,
		help:  "Video encoder utilization.",
		value: func(d *gpu.Device) gpu.Value { return d.EncoderUtilizationRatio },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_ENC_UTIL", typ: gauge, convert: toPercent, help: "Encoder utilization (in %).",
			share: func(_ *gpu.Device, p *gpu.Process) gpu.Value { return p.EncoderUtilizationRatio },
		}},
	},
	{
		name: "gpu_decoder_utilization_ratio", typ: gauge, unit: "ratio", sources: fromAll,
		help:  "Video decoder utilization.",
		value: func(d *gpu.Device) gpu.Value { return d.DecoderUtilizationRatio },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_DEC_UTIL", typ: gauge, convert: toPercent, help: "Decoder utilization (in %).",
			share: func(_ *gpu.Device, p *gpu.Process) gpu.Value { return p.DecoderUtilizationRatio },
		}},
	},
	{
		name: "gpu_temperature_celsius", typ: gauge, unit: "celsius", sources: fromAll,
		help:  "GPU core temperature.",
		value: func(d *gpu.Device) gpu.Value { return d.TemperatureCelsius },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_GPU_TEMP", typ: gauge, help: "GPU temperature (in C)."}},
	},
	{
		name: "gpu_power_usage_watts", typ: gauge, unit: "watts", sources: fromAll,
		help:  "Power drawn by the GPU board.",
		value: func(d *gpu.Device) gpu.Value { return d.PowerUsageWatts },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_POWER_USAGE", typ: gauge, help: "Power draw (in W).",
			// Power is not measured per process: a process's part is the GPU's power times its SM utilization
			// (the fraction of the sample period it ran), so that an idle GPU's draw stays with the GPU.
			share: func(d *gpu.Device, p *gpu.Process) gpu.Value {
				if !d.PowerUsageWatts.Valid || !p.SMUtilizationRatio.Valid {
					return gpu.Value{}
				}
				return gpu.Known(d.PowerUsageWatts.V * p.SMUtilizationRatio.V)
			},
			shareHelp: " A pod's share is the power times its SM utilization.",
		}},
	},
	{
		name: "gpu_power_limit_watts", typ: gauge, unit: "watts", sources: fromAll,
		help:  "Power limit enforced on the GPU board.",
		value: func(d *gpu.Device) gpu.Value { return d.PowerLimitWatts },
	},
	{
		name: "gpu_energy_consumption_joules_total", typ: counter, unit: "joules", sources: fromAll,
		help:  "Energy consumed by the GPU since the driver was loaded.",
		value: func(d *gpu.Device) gpu.Value { return d.EnergyJoules },
		// Energy would add up across pods too, but a counter split by shares that change would go backwards: it
		// stays on the GPU's series, whose value alone is the GPU's.
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", typ: counter, convert: toMillijoules,
			help: "Total energy consumption since boot (in mJ).",
		}},
	},
	{
		name: "gpu_clock_hertz", typ: gauge, unit: "hertz", sources: fromAll,
		help:   "Current clock frequency, by clock domain.",
		labels: []string{"clock"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, c := range d.Clocks {
				s.add(c.Hertz, c.Name)
			}
		},
		dcgm: []dcgmField{
			{
				name: "DCGM_FI_DEV_SM_CLOCK", typ: gauge, convert: toMHz, help: "SM clock frequency (in MHz).",
				value: func(d *gpu.Device) gpu.Value { return clock(d, "sm") },
			},
			{
				name: "DCGM_FI_DEV_MEM_CLOCK", typ: gauge, convert: toMHz, help: "Memory clock frequency (in MHz).",
				value: func(d *gpu.Device) gpu.Value { return clock(d, "memory") },
			},
		},
	},
	{
		name: "gpu_fan_speed_ratio", typ: gauge, unit: "ratio", sources: fromAll,
		help:  "Fan speed as a fraction of its maximum.",
		value: func(d *gpu.Device) gpu.Value { return d.FanSpeedRatio },
	},
	{
		name: "gpu_performance_state", typ: gauge, sources: fromAll,
		help:  "Performance state: 0 (P0, maximum performance) to 15 (P15, minimum).",
		value: func(d *gpu.Device) gpu.Value { return d.PerformanceState },
	},
	{
		name: "gpu_ecc_errors_total", typ: counter, sources: fromAll,
		help: "ECC errors over the GPU's lifetime (the aggregate counts kept in its InfoROM, across driver reloads " +
			"and reboots), by type (corrected, uncorrected).",
		labels: []string{"type"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, e := range d.ECCErrors {
				s.add(e.Count, e.Type)
			}
		},
	},
	{
		name: "gpu_xid_errors_total", typ: counter, sources: fromNVML | fromSimulated,
		help:   "XID errors reported by the driver since the exporter started, by XID code.",
		labels: []string{"xid"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, x := range d.XIDErrors {
				s.add(float64(x.Count), strconv.FormatUint(x.XID, 10))
			}
		},
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_XID_ERRORS", typ: gauge,
			help: "Value of the last XID error encountered (here: the highest XID seen since the exporter started).",
			value: func(d *gpu.Device) gpu.Value {
				var last gpu.Value
				for _, x := range d.XIDErrors {
					last = gpu.Known(max(last.V, float64(x.XID)))
				}
				return last
			},
		}},
	},
	{
		name: "gpu_processes", typ: gauge, sources: fromAll,
		help:   "Processes running on the GPU, by type.",
		labels: []string{"type"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			if !d.ProcessesListed {
				return
			}
			var counts [len(processTypes)]int
			for _, p := range d.Processes {
				if t := slices.Index(processTypes[:], p.Type); t >= 0 {
					counts[t]++
				}
			}
			for t, typ := range processTypes {
				s.add(float64(counts[t]), typ)
			}
		},
	},
	{
		name: "gpu_workloads", typ: gauge, sources: fromAll,
		help: "Distinct workloads (pod container, container, Slurm job or service; one identity of " +
			"gpu_workload_processes) with processes on the GPU, MIG instances included. Absent when the process " +
			"list could not be read.",
		series: func(s *deviceSeries, r *reading.Reading, d *gpu.Device) {
			if !d.ProcessesListed {
				return
			}
			s.add(float64(s.workloads(r, d)))
		},
	},
	{
		name: "gpu_mig_info", typ: gauge, sources: fromAll,
		help:   "MIG instance on a GPU in MIG mode; always 1.",
		labels: append(migLabels, "mig_profile"),
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, m := range d.MIG {
				s.add(1, m.UUID, itoa(m.GPUInstance), itoa(m.ComputeInstance), m.Profile)
			}
		},
	},
	{
		name: "gpu_mig_memory_total_bytes", typ: gauge, unit: "bytes", sources: fromAll,
		help: "Framebuffer memory of the MIG GPU instance, which its compute instances share: reported once per GPU " +
			"instance, on one of its MIG devices.",
		labels: migLabels,
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, m := range d.MIG {
				s.addMIG(m.MemoryTotalBytes, m)
			}
		},
	},
	{
		name: "gpu_mig_memory_used_bytes", typ: gauge, unit: "bytes", sources: fromAll,
		help: "Framebuffer memory in use on the MIG GPU instance, reported once per GPU instance, on one of its MIG " +
			"devices.",
		labels: migLabels,
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, m := range d.MIG {
				s.addMIG(m.MemoryUsedBytes, m)
			}
		},
	},
}

// migLabels are the labels of a MIG instance's series.
var migLabels = []string{"mig_uuid", "gpu_instance", "compute_instance"}

// processTypes are the values of gpu_processes' type label.
var processTypes = [...]string{gpu.ProcessCompute, gpu.ProcessGraphics, gpu.ProcessComputeAndGraphics, gpu.ProcessMPS}

// clock is the device's frequency of one clock domain.
func clock(d *gpu.Device, name string) gpu.Value {
	var v gpu.Value
	for _, c := range d.Clocks {
		if c.Name == name {
			v = gpu.Known(c.Hertz)
		}
	}
	return v
}

var gpuLabels = []string{"gpu", "uuid"}

func gpuDesc(name, help string, extra ...string) *desc {
	return newDesc(name, help, append(append([]string{}, gpuLabels...), extra...))
}

// deviceMetrics write deviceFamilies.
type deviceMetrics struct {
	byRow []*desc // the desc of each row of deviceFamilies
}

func newDeviceMetrics() *deviceMetrics {
	m := &deviceMetrics{}
	for _, f := range deviceFamilies {
		m.byRow = append(m.byRow, gpuDesc(f.name, f.help, f.labels...))
	}
	return m
}

func (m *deviceMetrics) descs() []*desc { return m.byRow }

func (m *deviceMetrics) update(b *batch, r *reading.Reading) {
	s := &deviceSeries{b: b, values: make([]string, 2, 16)}
	for i := range r.Snapshot.Devices {
		d := &r.Snapshot.Devices[i]
		s.values[0], s.values[1] = itoa(d.Index), d.UUID
		for j := range deviceFamilies {
			f := &deviceFamilies[j]
			s.desc, s.typ = m.byRow[j], f.typ
			if f.value != nil {
				if v := f.value(d); v.Valid {
					s.add(v.V)
				}
				continue
			}
			f.series(s, r, d)
		}
	}
}

// deviceSeries writes the series of one device family on one GPU.
type deviceSeries struct {
	b      *batch
	desc   *desc
	typ    metricType
	values []string // gpu, uuid, then the family's labels
	// distinct is the set that workloads counts in, kept from one GPU to the next: a set made per GPU doubled the
	// cost of all device families on a node with thousands of processes.
	distinct map[attribution.WorkloadKey]struct{}
}

// add writes one series: v, with the values of the family's labels.
func (s *deviceSeries) add(v float64, labels ...string) {
	s.values = append(s.values[:2], labels...)
	s.typ.write(s.b, s.desc, v, s.values)
}

// workloads counts the distinct workloads of the GPU's processes.
func (s *deviceSeries) workloads(r *reading.Reading, d *gpu.Device) int {
	if s.distinct == nil {
		s.distinct = make(map[attribution.WorkloadKey]struct{})
	}
	clear(s.distinct)
	for _, p := range d.Processes {
		s.distinct[r.Owner(p).Identity.Key()] = struct{}{}
	}
	return len(s.distinct)
}

// addMIG writes one series of a MIG instance, when v is known.
func (s *deviceSeries) addMIG(v gpu.Value, m gpu.MIGInstance) {
	if v.Valid {
		s.add(v.V, m.UUID, itoa(m.GPUInstance), itoa(m.ComputeInstance))
	}
}

// Family is a family as docs/reference.md's metric tables describe it.
type Family struct {
	Name, Type string
	// Labels are the labels besides gpu and uuid.
	Labels []string
	// DCGM are the dcgm-exporter fields written from the family under --compat=dcgm (docs/compat.md).
	DCGM []string
}

// DeviceFamilies lists the device families (docs/reference.md's GPUs and MIG instances), in the order of the docs.
func DeviceFamilies() []Family {
	var fs []Family
	for _, f := range deviceFamilies {
		doc := Family{Name: f.name, Type: f.typ.String(), Labels: slices.Clone(f.labels)}
		for _, d := range f.dcgm {
			doc.DCGM = append(doc.DCGM, d.name)
		}
		fs = append(fs, doc)
	}
	return fs
}
