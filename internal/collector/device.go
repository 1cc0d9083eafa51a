package collector

import (
	"slices"
	"strconv"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// deviceFamily is one family of per-GPU series (per MIG instance for some), and all that the exporter says about
// it. The series, the --compat=dcgm fields and the check of docs/reference.md's GPU and MIG tables all read
// deviceFamilies: a family is added as a row there, its value as a field of gpu.Device that the sources fill.
type deviceFamily struct {
	// Family is the family's name, unit and range (internal/families): a value outside the range is a driver's
	// "not available" (0xFFFFFFFF, 2^64-1) or garbage, and is left out (see plausible).
	families.Family
	typ  metricType
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
func (t metricType) write(b *series.Batch, d *series.Desc, v float64, labels []string) {
	if t == counter {
		b.Counter(d, v, labels...)
	} else {
		b.Gauge(d, v, labels...)
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
		Family: families.GPUInfo, typ: gauge, sources: fromAll,
		help: "GPU identity; always 1. vendor is nvidia, amd or intel; simulated=\"true\" when the data does not come " +
			"from real hardware.",
		labels: []string{"name", "vendor", "pci_bus_id", "driver_version", "cuda_version", "mig_mode", "simulated"},
		series: func(s *deviceSeries, r *reading.Reading, d *gpu.Device) {
			snap := r.Snapshot
			driver, cuda := snap.DriverVersion, snap.CUDAVersion
			if d.DriverVersion != "" { // a node whose GPUs have drivers of their own: CUDA is NVIDIA's only
				driver, cuda = d.DriverVersion, ""
				if d.Vendor == gpu.VendorNVIDIA {
					cuda = snap.CUDAVersion
				}
			}
			s.add(1, d.Name, d.Vendor, d.PCIBusID, driver, cuda, string(d.MIGMode), strconv.FormatBool(snap.Simulated))
		},
	},
	{
		Family: families.MemoryTotal, typ: gauge, sources: fromAll,
		help:  "Total framebuffer memory of the GPU.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryTotalBytes },
	},
	{
		Family: families.MemoryUsed, typ: gauge, sources: fromAll,
		help: "Framebuffer memory allocated by processes and the driver, without the memory the driver reserves for " +
			"itself (gpu_memory_reserved_bytes), which drivers before R510 count in.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryUsedBytes },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_FB_USED", typ: gauge, convert: toMiB, help: "Framebuffer memory used (in MiB).",
			share:     func(_ *gpu.Device, p *gpu.Process) gpu.Value { return p.UsedMemoryBytes },
			shareHelp: " A pod's share is its processes' memory.",
			instance:  func(m *gpu.MIGInstance) gpu.Value { return m.MemoryUsedBytes },
		}},
	},
	{
		Family: families.MemoryFree, typ: gauge, sources: fromAll,
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
		Family: families.MemoryReserved, typ: gauge, sources: fromAll,
		help: "Framebuffer memory the driver and firmware reserve for themselves; used + free + reserved = total. " +
			"Absent with drivers before R510.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryReservedBytes },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_FB_RESERVED", typ: gauge, convert: toMiB, help: "Framebuffer memory reserved (in MiB)."}},
	},
	{
		Family: families.Utilization, typ: gauge, sources: fromAll,
		help:  "Fraction of the last sample period in which a kernel ran on the GPU.",
		value: func(d *gpu.Device) gpu.Value { return d.UtilizationRatio },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_GPU_UTIL", typ: gauge, convert: toPercent, help: "GPU utilization (in %).",
			busy: smActivity, shareHelp: smShareHelp,
		}},
	},
	{
		Family: families.MemoryUtilization, typ: gauge, sources: fromAll,
		help:  "Fraction of the last sample period in which device memory was read or written.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryUtilizationRatio },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_MEM_COPY_UTIL", typ: gauge, convert: toPercent, help: "Memory utilization (in %).",
			busy: memoryActivity, shareHelp: " A pod's share is its part of the memory's busy time, by its processes' memory utilization.",
		}},
	},
	{
		Family: families.EncoderUtilization, typ: gauge, sources: fromAll,
		help:  "Video encoder utilization.",
		value: func(d *gpu.Device) gpu.Value { return d.EncoderUtilizationRatio },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_ENC_UTIL", typ: gauge, convert: toPercent, help: "Encoder utilization (in %).",
			busy: encoderActivity, shareHelp: " A pod's share is its part of the encoder's busy time, by its processes' encoder utilization.",
		}},
	},
	{
		Family: families.DecoderUtilization, typ: gauge, sources: fromAll,
		help:  "Video decoder utilization.",
		value: func(d *gpu.Device) gpu.Value { return d.DecoderUtilizationRatio },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_DEC_UTIL", typ: gauge, convert: toPercent, help: "Decoder utilization (in %).",
			busy: decoderActivity, shareHelp: " A pod's share is its part of the decoder's busy time, by its processes' decoder utilization.",
		}},
	},
	{
		Family: families.Temperature, typ: gauge, sources: fromAll,
		help:  "GPU core temperature.",
		value: func(d *gpu.Device) gpu.Value { return d.TemperatureCelsius },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_GPU_TEMP", typ: gauge, help: "GPU temperature (in C)."}},
	},
	{
		Family: families.MemoryTemperature, typ: gauge, sources: fromAll,
		help:  "Temperature of the GPU's memory; GPUs with HBM only.",
		value: func(d *gpu.Device) gpu.Value { return d.MemoryTemperatureCelsius },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_MEMORY_TEMP", typ: gauge, help: "Memory temperature (in C)."}},
	},
	{
		Family: families.Power, typ: gauge, sources: fromAll,
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
		Family: families.PowerLimit, typ: gauge, sources: fromAll,
		help: "Power limit enforced on the GPU board: the lowest of the limits that apply (gpu_power_management_limit_watts, " +
			"and others the driver sets).",
		value: func(d *gpu.Device) gpu.Value { return d.PowerLimitWatts },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", typ: gauge, help: "Effective power limit that the driver enforces (in W)."}},
	},
	{
		Family: families.PowerManagementLimit, typ: gauge, sources: fromAll,
		help: "Power limit set by the administrator (nvidia-smi -pl) or the default; the enforced gpu_power_limit_watts " +
			"can be lower.",
		value: func(d *gpu.Device) gpu.Value { return d.PowerManagementLimitWatts },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_POWER_MGMT_LIMIT", typ: gauge, help: "Power management limit (in W)."}},
	},
	{
		Family: families.Energy, typ: counter, sources: fromAll,
		help:  "Energy consumed by the GPU since the driver was loaded.",
		value: func(d *gpu.Device) gpu.Value { return d.EnergyJoules },
		// Energy would add up across pods too, but a counter split by shares that change would go backwards: it
		// stays on the GPU's series, whose value alone is the GPU's.
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", typ: counter, convert: toMillijoules,
			help: "Total energy consumption since boot (in mJ).", counters: []string{""},
		}},
	},
	{
		Family: families.Clock, typ: gauge, sources: fromAll,
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
		Family: families.ClockEventActive, typ: gauge, sources: fromAll,
		help:   "1 while a reason holds the GPU's clocks down, 0 while it does not; one series per reason the GPU reports.",
		labels: []string{"reason"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, e := range d.Health.ClockEvents {
				s.add(boolValue(e.Active), e.Reason)
			}
		},
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", typ: gauge, help: "Current clock event reasons (bit mask).",
			value: clockEventMask,
		}},
	},
	{
		Family: families.ClockViolation, typ: counter, sources: fromAll,
		help:   "Time a policy held the GPU's clocks below the requested clocks since the driver loaded, by policy.",
		labels: []string{"policy"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, v := range d.Health.Violations {
				s.add(v.Seconds, v.Policy)
			}
		},
		dcgm: []dcgmField{
			violationField("DCGM_FI_DEV_POWER_VIOLATION", "power", "power constraints"),
			violationField("DCGM_FI_DEV_THERMAL_VIOLATION", "thermal", "thermal constraints"),
			violationField("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "sync_boost", "sync-boost constraints"),
			violationField("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "board_limit", "board limit constraints"),
			violationField("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "low_utilization", "low utilization"),
			violationField("DCGM_FI_DEV_RELIABILITY_VIOLATION", "reliability", "reliability constraints"),
		},
	},
	{
		Family: families.FanSpeed, typ: gauge, sources: fromAll,
		help:  "Fan speed as a fraction of its maximum.",
		value: func(d *gpu.Device) gpu.Value { return d.FanSpeedRatio },
	},
	{
		Family: families.PerformanceState, typ: gauge, sources: fromAll,
		help:  "Performance state: 0 (P0, maximum performance) to 15 (P15, minimum).",
		value: func(d *gpu.Device) gpu.Value { return d.PerformanceState },
	},
	{
		Family: families.ECCErrors, typ: counter, sources: fromAll,
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
		Family: families.RemappedRows, typ: counter, sources: fromAll,
		help:   "Memory rows the GPU replaced with spare rows over its lifetime, by the kind of error that caused them.",
		labels: []string{"cause"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			s.addValue(d.Health.CorrectableRemappedRows, "correctable_error")
			s.addValue(d.Health.UncorrectableRemappedRows, "uncorrectable_error")
		},
		dcgm: []dcgmField{
			{
				name: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", typ: counter, help: "Number of remapped rows for uncorrectable errors",
				value: func(d *gpu.Device) gpu.Value { return d.Health.UncorrectableRemappedRows },
			},
			{
				name: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", typ: counter, help: "Number of remapped rows for correctable errors",
				value: func(d *gpu.Device) gpu.Value { return d.Health.CorrectableRemappedRows },
			},
		},
	},
	{
		Family: families.RowRemapPending, typ: gauge, sources: fromAll,
		help:  "1 when a row remap waits for the next GPU reset to take effect, else 0.",
		value: func(d *gpu.Device) gpu.Value { return d.Health.RemapPending },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_ROW_REMAP_PENDING", typ: gauge, help: "Whether remapping of rows is pending"}},
	},
	{
		Family: families.RowRemapFailure, typ: gauge, sources: fromAll,
		help:  "1 when a row could not be remapped (the GPU has no spare row left there and should be replaced), else 0.",
		value: func(d *gpu.Device) gpu.Value { return d.Health.RemapFailure },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_ROW_REMAP_FAILURE", typ: gauge, help: "Whether remapping of rows has failed"}},
	},
	{
		Family: families.RetiredPages, typ: counter, sources: fromNVML | fromNvidiaSMI,
		help: "Framebuffer pages the GPU retired over its lifetime (before Ampere), by cause (single_bit_ecc: " +
			"repeated corrected errors, double_bit_ecc).",
		labels: []string{"cause"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			s.addValue(d.Health.RetiredPagesSingleBit, "single_bit_ecc")
			s.addValue(d.Health.RetiredPagesDoubleBit, "double_bit_ecc")
		},
		dcgm: []dcgmField{
			{
				name: "DCGM_FI_DEV_RETIRED_SBE", typ: counter, help: "Total number of retired pages due to single-bit errors.",
				value: func(d *gpu.Device) gpu.Value { return d.Health.RetiredPagesSingleBit },
			},
			{
				name: "DCGM_FI_DEV_RETIRED_DBE", typ: counter, help: "Total number of retired pages due to double-bit errors.",
				value: func(d *gpu.Device) gpu.Value { return d.Health.RetiredPagesDoubleBit },
			},
		},
	},
	{
		Family: families.RetiredPagesPending, typ: gauge, sources: fromNVML | fromNvidiaSMI,
		help:  "1 when a page retirement waits for the next driver reload or reboot, else 0.",
		value: func(d *gpu.Device) gpu.Value { return d.Health.RetirementPending },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_RETIRED_PENDING", typ: counter,
			help: "Total number of pages pending retirement (here: 1 when a retirement is pending, as NVML says it).",
		}},
	},
	{
		Family: families.XIDErrors, typ: counter, sources: fromNVML | fromSimulated,
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
		Family: families.RecoveryAction, typ: gauge, sources: fromAll,
		help: "What the driver says the GPU needs: 0 nothing, 1 a GPU reset, 2 a node reboot, 3 drain peer-to-peer, " +
			"4 drain and reset.",
		value: func(d *gpu.Device) gpu.Value { return d.Health.RecoveryAction },
		dcgm: []dcgmField{{
			name: "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", typ: gauge,
			help: "GPU recovery action: 0 none, 1 GPU reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset.",
		}},
	},
	{
		Family: families.PCIeLinkGeneration, typ: gauge, sources: fromAll,
		help:  "PCIe generation the link runs at now; an idle GPU lowers it to save power.",
		value: func(d *gpu.Device) gpu.Value { return d.PCIe.Generation },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_PCIE_LINK_GEN", typ: gauge, help: "PCIe current link generation."}},
	},
	{
		Family: families.PCIeLinkMaxGeneration, typ: gauge, sources: fromAll,
		help:  "Highest PCIe generation the GPU and its slot can run together.",
		value: func(d *gpu.Device) gpu.Value { return d.PCIe.MaxGeneration },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", typ: gauge, help: "PCIe max link generation."}},
	},
	{
		Family: families.PCIeLinkWidth, typ: gauge, sources: fromAll,
		help:  "PCIe lanes the link runs with now.",
		value: func(d *gpu.Device) gpu.Value { return d.PCIe.Width },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_PCIE_LINK_WIDTH", typ: gauge, help: "PCIe current link width."}},
	},
	{
		Family: families.PCIeLinkMaxWidth, typ: gauge, sources: fromAll,
		help:  "Most PCIe lanes the GPU and its slot can run with together; a link below it is degraded.",
		value: func(d *gpu.Device) gpu.Value { return d.PCIe.MaxWidth },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", typ: gauge, help: "PCIe max link width."}},
	},
	{
		Family: families.PCIeReplays, typ: counter, sources: fromAll,
		help:  "Transfers the PCIe link replayed since the driver loaded; a rising count is a bad link, riser or slot.",
		value: func(d *gpu.Device) gpu.Value { return d.PCIe.Replays },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", typ: counter, help: "Total number of PCIe retries."}},
	},
	{
		Family: families.PCIeBytes, typ: counter, sources: fromNVML | fromSimulated,
		help: "Bytes sent (transmit) and received (receive) over the PCIe link, protocol headers included, since the " +
			"driver loaded (NVML: R555 and later).",
		labels: []string{"direction"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			s.addValue(d.PCIe.TXBytes, "transmit")
			s.addValue(d.PCIe.RXBytes, "receive")
		},
		// DCGM's PCIe fields are the performance monitor's rates, not this counter's: where the GPU has no monitor
		// (before Hopper) they are absent rather than a rate of the counter under DCGM's name.
		dcgm: []dcgmField{
			profilingField("DCGM_FI_PROF_PCIE_TX_BYTES", gauge, "The rate of data transmitted over the PCIe bus - "+
				"including both protocol headers and data payloads - in bytes per second.", pcieTX, false),
			profilingField("DCGM_FI_PROF_PCIE_RX_BYTES", gauge, "The rate of data received over the PCIe bus - "+
				"including both protocol headers and data payloads - in bytes per second.", pcieRX, false),
		},
	},
	{
		Family: families.NVLinkBytes, typ: counter, sources: fromNVML | fromSimulated,
		help:   "Data bytes sent (transmit) and received (receive) over all the GPU's NVLinks since the driver loaded.",
		labels: []string{"direction"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			s.addValue(d.NVLink.TXBytes, "transmit")
			s.addValue(d.NVLink.RXBytes, "receive")
		},
		dcgm: []dcgmField{
			{
				// DCGM reads the same two counters, in KiB, and publishes (Δ(rx+tx) / Δt) / 1000 as MB/s although its
				// counter file types the field a counter.
				name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", typ: counter, convert: toDCGMNVLinkMBps, rate: true,
				counters: []string{"transmit", "receive"},
				help: "Total number of NVLink bandwidth counters for all lanes. (DCGM's value is a rate: the NVLink " +
					"data received and sent per second between the last two readings, in KiB/s / 1000; absent on the first.)",
				value: func(d *gpu.Device) gpu.Value {
					return gpu.Value{V: d.NVLink.TXBytes.V + d.NVLink.RXBytes.V, Valid: d.NVLink.TXBytes.Valid && d.NVLink.RXBytes.Valid}
				},
			},
			profilingField("DCGM_FI_PROF_NVLINK_TX_BYTES", gauge, "The rate of data transmitted over NVLink, not "+
				"including protocol headers, in bytes per second.", nvlinkTX, false),
			profilingField("DCGM_FI_PROF_NVLINK_RX_BYTES", gauge, "The rate of data received over NVLink, not "+
				"including protocol headers, in bytes per second.", nvlinkRX, false),
		},
	},
	{
		Family: families.NVLinks, typ: gauge, sources: fromNVML | fromSimulated,
		help:   "The GPU's NVLinks by state: active (up) and inactive (down).",
		labels: []string{"state"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			if len(d.NVLink.Links) == 0 {
				return
			}
			var active, inactive float64
			for _, l := range d.NVLink.Links {
				switch {
				case !l.Active.Valid:
				case l.Active.V == 1:
					active++
				default:
					inactive++
				}
			}
			s.add(active, "active")
			s.add(inactive, "inactive")
		},
	},
	{
		Family: families.NVLinkErrors, typ: counter, sources: fromNVML | fromSimulated,
		help:   "Errors on the GPU's NVLinks since the driver loaded, summed over its links, by type.",
		labels: []string{"type"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for i, e := range nvlinkErrors {
				s.addValue(nvlinkErrorTotal(d, i), e.typ)
			}
		},
		dcgm: []dcgmField{
			nvlinkErrorField("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "Total number of NVLink flow-control CRC errors.", 0),
			nvlinkErrorField("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "Total number of NVLink data CRC errors.", 1),
			nvlinkErrorField("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.", 2),
			nvlinkErrorField("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "Total number of NVLink recovery errors.", 3),
		},
	},
	{
		Family: families.FabricState, typ: gauge, sources: fromAll,
		help:  "The GPU's registration with the NVSwitch fabric: 1 not started, 2 in progress, 3 completed.",
		value: func(d *gpu.Device) gpu.Value { return d.Health.FabricState },
	},
	{
		Family: families.FabricHealthy, typ: gauge, sources: fromAll,
		help:  "1 when the fabric registration completed without error and no bandwidth is degraded, else 0.",
		value: func(d *gpu.Device) gpu.Value { return d.Health.FabricHealthy },
	},
	{
		Family: families.VGPULicensed, typ: gauge, sources: fromAll,
		help:  "1 when the GPU is a vGPU that holds its licence, else 0 (0 on bare metal, as DCGM reports it).",
		value: func(d *gpu.Device) gpu.Value { return d.VGPULicensed },
		dcgm:  []dcgmField{{name: "DCGM_FI_DEV_VGPU_LICENSE_STATUS", typ: gauge, help: "vGPU License status"}},
	},
	{
		Family: families.GraphicsEngineActive, typ: gauge, sources: fromNVML | fromSimulated,
		help:  "Fraction of the time in which a graphics or compute engine was busy" + monitorHelp,
		value: func(d *gpu.Device) gpu.Value { return profiled(d.Profiling, graphicsEngineActive) },
		dcgm: []dcgmField{estimated(splitBySM(profilingField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gauge,
			"Ratio of time the graphics engine is active.", graphicsEngineActive, true)),
			func(d *gpu.Device) gpu.Value { return d.UtilizationRatio })},
	},
	{
		Family: families.SMActive, typ: gauge, sources: fromNVML | fromSimulated,
		help:  "Fraction of the time in which an SM had at least one warp resident, averaged over the SMs" + monitorHelp,
		value: func(d *gpu.Device) gpu.Value { return profiled(d.Profiling, smActive) },
		dcgm: []dcgmField{splitBySM(profilingField("DCGM_FI_PROF_SM_ACTIVE", gauge,
			"The ratio of cycles an SM has at least 1 warp assigned.", smActive, true))},
	},
	{
		Family: families.SMOccupancy, typ: gauge, sources: fromNVML | fromSimulated,
		help:  "Warps resident on the SMs as a fraction of the most they can hold, averaged over the time" + monitorHelp,
		value: func(d *gpu.Device) gpu.Value { return profiled(d.Profiling, smOccupancy) },
		dcgm: []dcgmField{profilingField("DCGM_FI_PROF_SM_OCCUPANCY", gauge, "The ratio of number of warps resident on an SM.",
			smOccupancy, true)},
	},
	{
		Family: families.PipeActive, typ: gauge, sources: fromNVML | fromSimulated,
		help:   "Fraction of the time in which a kind of SM pipe was busy, by pipe" + monitorHelp,
		labels: []string{"pipe"},
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, p := range pipes {
				s.addValue(profiled(d.Profiling, p.read), p.name)
			}
		},
		dcgm: []dcgmField{
			profilingField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gauge, "Ratio of cycles the tensor (HMMA) pipe is active.", tensorActive, true),
			profilingField("DCGM_FI_PROF_PIPE_FP64_ACTIVE", gauge, "Ratio of cycles the fp64 pipes are active.", fp64Active, true),
			profilingField("DCGM_FI_PROF_PIPE_FP32_ACTIVE", gauge, "Ratio of cycles the fp32 pipes are active.", fp32Active, true),
			profilingField("DCGM_FI_PROF_PIPE_FP16_ACTIVE", gauge, "Ratio of cycles the fp16 pipes are active.", fp16Active, true),
		},
	},
	{
		Family: families.DRAMActive, typ: gauge, sources: fromNVML | fromSimulated,
		help:  "Fraction of the time in which the device memory interface was sending or receiving data" + monitorHelp,
		value: func(d *gpu.Device) gpu.Value { return profiled(d.Profiling, dramActive) },
		dcgm: []dcgmField{profilingField("DCGM_FI_PROF_DRAM_ACTIVE", gauge,
			"Ratio of cycles the device memory interface is active sending or receiving data.", dramActive, true)},
	},
	{
		Family: families.Processes, typ: gauge, sources: fromAll,
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
		Family: families.Workloads, typ: gauge, sources: fromAll,
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
		Family: families.MIGInfo, typ: gauge, sources: fromAll,
		help:   "MIG instance on a GPU in MIG mode; always 1.",
		labels: append(migLabels, "mig_profile"),
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, m := range d.MIG {
				s.add(1, m.UUID, itoa(m.GPUInstance), itoa(m.ComputeInstance), m.Profile)
			}
		},
	},
	{
		Family: families.MIGMemoryTotal, typ: gauge, sources: fromAll,
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
		Family: families.MIGMemoryUsed, typ: gauge, sources: fromAll,
		help: "Framebuffer memory in use on the MIG GPU instance, reported once per GPU instance, on one of its MIG " +
			"devices.",
		labels: migLabels,
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, m := range d.MIG {
				s.addMIG(m.MemoryUsedBytes, m)
			}
		},
	},
	migProfilingFamily(families.MIGGraphicsEngineActive, "Fraction of the time in which a graphics or compute engine "+
		"of the MIG GPU instance was busy", graphicsEngineActive),
	migProfilingFamily(families.MIGSMActive, "Fraction of the time in which an SM of the MIG GPU instance had at "+
		"least one warp resident, averaged over its SMs", smActive),
	migProfilingFamily(families.MIGSMOccupancy, "Warps resident on the MIG GPU instance's SMs as a fraction of the "+
		"most they can hold", smOccupancy),
	{
		Family: families.MIGPipeActive, typ: gauge, sources: fromNVML | fromSimulated,
		help:   "Fraction of the time in which a kind of SM pipe of the MIG GPU instance was busy, by pipe" + migMonitorHelp,
		labels: append(slices.Clip(migLabels), "pipe"),
		series: func(s *deviceSeries, _ *reading.Reading, d *gpu.Device) {
			for _, m := range d.MIG {
				for _, p := range pipes {
					if v := profiled(m.Profiling, p.read); v.Valid {
						s.add(v.V, m.UUID, itoa(m.GPUInstance), itoa(m.ComputeInstance), p.name)
					}
				}
			}
		},
	},
	migProfilingFamily(families.MIGDRAMActive, "Fraction of the time in which the MIG GPU instance's memory "+
		"interface was sending or receiving data", dramActive),
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

func gpuDesc(name, help string, extra ...string) *series.Desc {
	return series.NewDesc(name, help, append(append([]string{}, gpuLabels...), extra...))
}

// deviceMetrics write deviceFamilies.
type deviceMetrics struct {
	byRow     []*series.Desc // the desc of each row of deviceFamilies
	plausible *plausibility
}

func newDeviceMetrics() *deviceMetrics {
	m := &deviceMetrics{plausible: newPlausibility()}
	for _, f := range deviceFamilies {
		m.byRow = append(m.byRow, gpuDesc(f.Name, f.help, f.labels...))
	}
	return m
}

func (m *deviceMetrics) descs() []*series.Desc { return m.byRow }

func (m *deviceMetrics) update(b *series.Batch, r *reading.Reading) {
	s := &deviceSeries{b: b, values: make([]string, 2, 16), plausible: m.plausible, at: r.Snapshot.Time,
		count: m.plausible.reading(r.Snapshot.Time)}
	for i := range r.Snapshot.Devices {
		d := &r.Snapshot.Devices[i]
		s.values[0], s.values[1] = itoa(d.Index), d.UUID
		for j := range deviceFamilies {
			f := &deviceFamilies[j]
			s.desc, s.typ, s.family, s.row = m.byRow[j], f.typ, f, j
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
	b      *series.Batch
	desc   *series.Desc
	typ    metricType
	values []string // gpu, uuid, then the family's labels
	// family is the row of deviceFamilies being written (row its index), whose range each value is checked against
	// at the reading of time at; count is set for the scrape that writes the reading first.
	family    *deviceFamily
	row       int
	plausible *plausibility
	at        time.Time
	count     bool
	// distinct is the set that workloads counts in, kept from one GPU to the next: a set made per GPU doubled the
	// cost of all device families on a node with thousands of processes.
	distinct map[attribution.WorkloadKey]struct{}
}

// add writes one series: v, with the values of the family's labels, when v is plausible.
func (s *deviceSeries) add(v float64, labels ...string) {
	s.values = append(s.values[:2], labels...)
	label := ""
	if len(labels) > 0 {
		label = labels[0] // a rate-checked counter has one label at most (TestCounterRangesHaveOneLabel)
	}
	if !s.plausible.check(s.family, s.row, s.values[1], label, v, s.at, s.count) {
		return
	}
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

// addValue writes one series, when v is known.
func (s *deviceSeries) addValue(v gpu.Value, labels ...string) {
	if v.Valid {
		s.add(v.V, labels...)
	}
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
	// Range bounds the values written (internal/families).
	Range families.Range
}

// DeviceFamilies lists the device families (docs/reference.md's GPUs and MIG instances), in the order of the docs.
func DeviceFamilies() []Family {
	var fs []Family
	for _, f := range deviceFamilies {
		doc := Family{Name: f.Name, Type: f.typ.String(), Labels: slices.Clone(f.labels), Range: f.Range}
		for _, d := range f.dcgm {
			doc.DCGM = append(doc.DCGM, d.name)
		}
		fs = append(fs, doc)
	}
	return fs
}
