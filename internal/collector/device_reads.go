package collector

import (
	"slices"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// What the rows of deviceFamilies share to read the snapshot's health, link and performance monitor values.

// boolValue is a 0/1 series value.
func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// clockEventMask is NVML's (and DCGM's) bit mask of the reasons holding the clocks down now: reason i of
// gpu.ClockEventReasons is bit i. Absent where the GPU reports no reasons.
func clockEventMask(d *gpu.Device) gpu.Value {
	if len(d.Health.ClockEvents) == 0 {
		return gpu.Value{}
	}
	var mask uint64
	for _, e := range d.Health.ClockEvents {
		if bit := slices.Index(gpu.ClockEventReasons, e.Reason); bit >= 0 && e.Active {
			mask |= 1 << bit
		}
	}
	return gpu.Known(float64(mask))
}

// violationField is DCGM's violation time of one policy, in nanoseconds.
func violationField(name, policy, cause string) dcgmField {
	return dcgmField{
		name: name, typ: counter, convert: toNanoseconds, help: "Throttling duration due to " + cause + " (in ns).",
		counters: []string{policy},
		value: func(d *gpu.Device) gpu.Value {
			for _, v := range d.Health.Violations {
				if v.Policy == policy {
					return gpu.Known(v.Seconds)
				}
			}
			return gpu.Value{}
		},
	}
}

// nvlinkErrors are the values of gpu_nvlink_errors_total's type label, in NVML's order, and how each is read.
var nvlinkErrors = []struct {
	typ  string
	read func(*gpu.NVLinkLink) gpu.Value
}{
	{"crc_flit", func(l *gpu.NVLinkLink) gpu.Value { return l.CRCFlitErrors }},
	{"crc_data", func(l *gpu.NVLinkLink) gpu.Value { return l.CRCDataErrors }},
	{"replay", func(l *gpu.NVLinkLink) gpu.Value { return l.ReplayErrors }},
	{"recovery", func(l *gpu.NVLinkLink) gpu.Value { return l.RecoveryErrors }},
}

// nvlinkErrorTotal is one error counter (nvlinkErrors[i]) summed over the GPU's links; absent where a link's count
// is unknown, as a total without it would be too low, and where the GPU has no links.
func nvlinkErrorTotal(d *gpu.Device, i int) gpu.Value {
	if len(d.NVLink.Links) == 0 {
		return gpu.Value{}
	}
	sum := gpu.Known(0)
	for j := range d.NVLink.Links {
		v := nvlinkErrors[i].read(&d.NVLink.Links[j])
		sum = gpu.Value{V: sum.V + v.V, Valid: sum.Valid && v.Valid}
	}
	return sum
}

// nvlinkErrorField is DCGM's total of one error counter over the GPU's links: gpu_nvlink_errors_total's type i.
func nvlinkErrorField(name, help string, i int) dcgmField {
	return dcgmField{name: name, typ: counter, help: help, value: func(d *gpu.Device) gpu.Value { return nvlinkErrorTotal(d, i) }}
}

// Readings of the performance monitor (gpu.Profiling).
var (
	graphicsEngineActive = func(p *gpu.Profiling) gpu.Value { return p.GraphicsEngineActive }
	smActive             = func(p *gpu.Profiling) gpu.Value { return p.SMActive }
	smOccupancy          = func(p *gpu.Profiling) gpu.Value { return p.SMOccupancy }
	tensorActive         = func(p *gpu.Profiling) gpu.Value { return p.TensorActive }
	fp64Active           = func(p *gpu.Profiling) gpu.Value { return p.FP64Active }
	fp32Active           = func(p *gpu.Profiling) gpu.Value { return p.FP32Active }
	fp16Active           = func(p *gpu.Profiling) gpu.Value { return p.FP16Active }
	dramActive           = func(p *gpu.Profiling) gpu.Value { return p.DRAMActive }
	pcieTX               = func(p *gpu.Profiling) gpu.Value { return p.PCIeTXBytesPerSecond }
	pcieRX               = func(p *gpu.Profiling) gpu.Value { return p.PCIeRXBytesPerSecond }
	nvlinkTX             = func(p *gpu.Profiling) gpu.Value { return p.NVLinkTXBytesPerSecond }
	nvlinkRX             = func(p *gpu.Profiling) gpu.Value { return p.NVLinkRXBytesPerSecond }
)

// pipes are the values of the pipe label of gpu_pipe_active_ratio and gpu_mig_pipe_active_ratio.
var pipes = []struct {
	name string
	read func(*gpu.Profiling) gpu.Value
}{{"tensor", tensorActive}, {"fp64", fp64Active}, {"fp32", fp32Active}, {"fp16", fp16Active}}

// profiled reads a performance monitor reading; absent where there is none (before Hopper, or on the first reading).
func profiled(p *gpu.Profiling, read func(*gpu.Profiling) gpu.Value) gpu.Value {
	if p == nil {
		return gpu.Value{}
	}
	return read(p)
}

const (
	monitorHelp    = ", between the last two readings (performance monitor, Hopper and newer)."
	migMonitorHelp = ", between the last two readings; once per GPU instance."
)

// profilingField is a DCGM profiling field, written where the performance monitor has a reading (never a stand-in
// where it has none): per GPU, and per GPU instance in MIG mode. A ratio is each entity's own (whole: the GPU's
// series keeps the GPU's value); a rate adds up over the GPU instances (the GPU's series keeps the rest).
func profilingField(name string, typ metricType, help string, read func(*gpu.Profiling) gpu.Value, ratio bool) dcgmField {
	return dcgmField{
		name: name, typ: typ, help: help, gpuKeepsWhole: ratio,
		value:    func(d *gpu.Device) gpu.Value { return profiled(d.Profiling, read) },
		instance: func(m *gpu.MIGInstance) gpu.Value { return profiled(m.Profiling, read) },
	}
}

// migProfilingFamily is a performance monitor ratio of MIG GPU instances.
func migProfilingFamily(f families.Family, help string, read func(*gpu.Profiling) gpu.Value) deviceFamily {
	return deviceFamily{
		Family: f, typ: gauge, sources: fromNVML | fromSimulated, help: help + migMonitorHelp, labels: migLabels,
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, m := range d.MIG {
				s.addMIG(profiled(m.Profiling, read), m)
			}
		},
	}
}
