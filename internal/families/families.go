// Package families is the table of the metric families the exporter writes and its views read: each one's name,
// unit and the range of the values it can hold, with a counter's fastest growth. The exporter leaves a value
// outside its family's range out of its series, the node's ps and top show it as unknown, and the cluster view
// drops it from Prometheus' answers, all from this one table, so that the three agree on what a value is.
package families

import (
	"math"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Family is one metric family.
type Family struct {
	Name string
	// Unit is the base unit the name ends with, before _total: "bytes", "ratio", "celsius". Empty for a count, a
	// state or an info family.
	Unit  string
	Range Range
}

// Known is v when the family can hold it, else unknown: a driver's "not available" or garbage is never a value.
func (f Family) Known(v gpu.Value) gpu.Value {
	if !v.Valid || !f.Range.Holds(v.V) {
		return gpu.Value{}
	}
	return v
}

// Range is what a family's values can be, in its unit, and for a counter the most it can grow in a second (Rate;
// 0: not checked). Drivers answer "not available" with a sentinel rather than an error for some GPUs and fields:
// NVML_VALUE_NOT_AVAILABLE (-1, so 0xFFFFFFFF in an unsigned int and 2^64-1 in an unsigned long long, as nvml.h
// defines it for the fields that say so), and values as wild now and then (a sample of 37,100%, which the NVML
// source drops where it reads them). Written as they are, one scrape shows a utilization of 4.29e7, a temperature
// of 4.29e9 °C, 4.29 MW or an NVLink rate of 1.5e15 MB/s. The ranges are far wider than any GPU's, and narrower
// than the sentinels.
type Range struct{ Min, Max, Rate float64 }

// Holds reports whether v is in the range: false for NaN.
func (r Range) Holds(v float64) bool { return v >= r.Min && v <= r.Max }

// The ranges, by what they measure.
var (
	Identity = Range{Min: 1, Max: 1} // an info family's 1
	Fraction = Range{Min: 0, Max: 1}
	// NVML: the fan speed "may exceed 100% in certain cases" (nvmlDeviceGetFanSpeed).
	FanSpeeds = Range{Min: 0, Max: 2}
	Celsius   = Range{Min: -40, Max: 200}
	Watts     = Range{Min: 0, Max: 10_000} // a GB200 superchip's module draws 2,700
	// J since the driver loaded: 10 kW for 3,000 years; it grows at most by the most a board draws.
	Joules      = Range{Min: 0, Max: 1e15, Rate: Watts.Max}
	MemoryBytes = Range{Min: 0, Max: 1 << 50} // 1 PiB; a B300 has 288 GB
	Hertz       = Range{Min: 0, Max: 1e11}    // GDDR memory clocks read 10 to 16 GHz
	// s a policy held the clocks down since the driver loaded: at most a second a second, five times over for the
	// readings' own timing (about a second apart) and a driver that updates the counter in coarse steps.
	ViolationSeconds = Range{Min: 0, Max: 1e10, Rate: 5}
	PStates          = Range{Min: 0, Max: 15} // P0 to P15; NVML's "unknown" is 32
	// Counts of errors in unsigned long long counters (ECC, NVLink errors): 2^64-1 is out.
	WideCount = Range{Min: 0, Max: 1 << 53}
	// Counts in unsigned ints (PCIe replays, remapped rows, retired pages): 0xFFFFFFFF is NVML's "not available".
	NarrowCount = Range{Min: 0, Max: math.MaxUint32 - 1}
	// What the exporter counts itself (XIDs since it started, devices): exact in a float64.
	OwnCount = Range{Min: 0, Max: 1 << 53}
	// Processes on a GPU, or in a workload: no more than a node has PIDs (the kernel's PID_MAX_LIMIT, 2^22).
	ProcessCount = Range{Min: 0, Max: 1 << 22}
	// The processes of an allocation: -1 when the process lists were not complete.
	AllocationProcessCount = Range{Min: -1, Max: ProcessCount.Max}
	// A sum of fractions over a workload's processes on a GPU.
	SummedFraction  = Range{Min: 0, Max: ProcessCount.Max}
	Flag            = Range{Min: 0, Max: 1}
	RecoveryActions = Range{Min: 0, Max: 4}  // NVML_GPU_RECOVERY_ACTION_NONE to _DRAIN_AND_RESET
	PCIeGenerations = Range{Min: 1, Max: 16} // 1 to 7 exist
	PCIeWidths      = Range{Min: 1, Max: 32}
	NVLinkCount     = Range{Min: 0, Max: 1024} // NVML_NVLINK_MAX_LINKS is 18
	FabricStates    = Range{Min: 0, Max: 3}    // NVML_GPU_FABRIC_STATE_NOT_SUPPORTED to _COMPLETED
	// Bytes since the driver loaded, in counters that wrap at 2^64 bytes (PCIe) and 2^64 KiB (NVLink), so 2^64-1 is
	// out; growing at most 1 TB/s (PCIe 7.0 x16: 256 GB/s each way) and 10 TB/s (NVLink 5: 1.8 TB/s).
	PCIeTrafficBytes   = Range{Min: 0, Max: math.Nextafter(0x1p64, 0), Rate: 1e12}
	NVLinkTrafficBytes = Range{Min: 0, Max: math.Nextafter(0x1p74, 0), Rate: 1e13}
)

// The families of a GPU, in the order of docs/reference.md's GPU table.
var (
	GPUInfo               = Family{"gpu_info", "", Identity}
	MemoryTotal           = Family{"gpu_memory_total_bytes", "bytes", MemoryBytes}
	MemoryUsed            = Family{"gpu_memory_used_bytes", "bytes", MemoryBytes}
	MemoryFree            = Family{"gpu_memory_free_bytes", "bytes", MemoryBytes}
	MemoryReserved        = Family{"gpu_memory_reserved_bytes", "bytes", MemoryBytes}
	Utilization           = Family{"gpu_utilization_ratio", "ratio", Fraction}
	MemoryUtilization     = Family{"gpu_memory_utilization_ratio", "ratio", Fraction}
	EncoderUtilization    = Family{"gpu_encoder_utilization_ratio", "ratio", Fraction}
	DecoderUtilization    = Family{"gpu_decoder_utilization_ratio", "ratio", Fraction}
	Temperature           = Family{"gpu_temperature_celsius", "celsius", Celsius}
	MemoryTemperature     = Family{"gpu_memory_temperature_celsius", "celsius", Celsius}
	Power                 = Family{"gpu_power_usage_watts", "watts", Watts}
	PowerLimit            = Family{"gpu_power_limit_watts", "watts", Watts}
	PowerManagementLimit  = Family{"gpu_power_management_limit_watts", "watts", Watts}
	Energy                = Family{"gpu_energy_consumption_joules_total", "joules", Joules}
	Clock                 = Family{"gpu_clock_hertz", "hertz", Hertz}
	ClockEventActive      = Family{"gpu_clock_event_active", "", Flag}
	ClockViolation        = Family{"gpu_clock_violation_seconds_total", "seconds", ViolationSeconds}
	FanSpeed              = Family{"gpu_fan_speed_ratio", "ratio", FanSpeeds}
	PerformanceState      = Family{"gpu_performance_state", "", PStates}
	ECCErrors             = Family{"gpu_ecc_errors_total", "", WideCount}
	RemappedRows          = Family{"gpu_remapped_rows_total", "", NarrowCount}
	RowRemapPending       = Family{"gpu_row_remap_pending", "", Flag}
	RowRemapFailure       = Family{"gpu_row_remap_failure", "", Flag}
	RetiredPages          = Family{"gpu_retired_pages_total", "", NarrowCount}
	RetiredPagesPending   = Family{"gpu_retired_pages_pending", "", Flag}
	XIDErrors             = Family{"gpu_xid_errors_total", "", OwnCount}
	RecoveryAction        = Family{"gpu_recovery_action", "", RecoveryActions}
	PCIeLinkGeneration    = Family{"gpu_pcie_link_generation", "", PCIeGenerations}
	PCIeLinkMaxGeneration = Family{"gpu_pcie_link_max_generation", "", PCIeGenerations}
	PCIeLinkWidth         = Family{"gpu_pcie_link_width", "", PCIeWidths}
	PCIeLinkMaxWidth      = Family{"gpu_pcie_link_max_width", "", PCIeWidths}
	PCIeReplays           = Family{"gpu_pcie_replays_total", "", NarrowCount}
	PCIeBytes             = Family{"gpu_pcie_bytes_total", "bytes", PCIeTrafficBytes}
	NVLinkBytes           = Family{"gpu_nvlink_bytes_total", "bytes", NVLinkTrafficBytes}
	NVLinks               = Family{"gpu_nvlink_links", "", NVLinkCount}
	NVLinkErrors          = Family{"gpu_nvlink_errors_total", "", WideCount}
	FabricState           = Family{"gpu_fabric_state", "", FabricStates}
	FabricHealthy         = Family{"gpu_fabric_healthy", "", Flag}
	VGPULicensed          = Family{"gpu_vgpu_licensed", "", Flag}
	GraphicsEngineActive  = Family{"gpu_graphics_engine_active_ratio", "ratio", Fraction}
	SMActive              = Family{"gpu_sm_active_ratio", "ratio", Fraction}
	SMOccupancy           = Family{"gpu_sm_occupancy_ratio", "ratio", Fraction}
	PipeActive            = Family{"gpu_pipe_active_ratio", "ratio", Fraction}
	DRAMActive            = Family{"gpu_dram_active_ratio", "ratio", Fraction}
	Processes             = Family{"gpu_processes", "", ProcessCount}
	Workloads             = Family{"gpu_workloads", "", ProcessCount}
)

// The families of a GPU's MIG instances.
var (
	MIGInfo                 = Family{"gpu_mig_info", "", Identity}
	MIGMemoryTotal          = Family{"gpu_mig_memory_total_bytes", "bytes", MemoryBytes}
	MIGMemoryUsed           = Family{"gpu_mig_memory_used_bytes", "bytes", MemoryBytes}
	MIGGraphicsEngineActive = Family{"gpu_mig_graphics_engine_active_ratio", "ratio", Fraction}
	MIGSMActive             = Family{"gpu_mig_sm_active_ratio", "ratio", Fraction}
	MIGSMOccupancy          = Family{"gpu_mig_sm_occupancy_ratio", "ratio", Fraction}
	MIGPipeActive           = Family{"gpu_mig_pipe_active_ratio", "ratio", Fraction}
	MIGDRAMActive           = Family{"gpu_mig_dram_active_ratio", "ratio", Fraction}
)

// The families of a GPU's processes and workloads.
var (
	ProcessMemory            = Family{"gpu_process_memory_used_bytes", "bytes", MemoryBytes}
	ProcessSM                = Family{"gpu_process_sm_utilization_ratio", "ratio", Fraction}
	ProcessMemoryUtilization = Family{"gpu_process_memory_utilization_ratio", "ratio", Fraction}
	ProcessEncoder           = Family{"gpu_process_encoder_utilization_ratio", "ratio", Fraction}
	ProcessDecoder           = Family{"gpu_process_decoder_utilization_ratio", "ratio", Fraction}
	WorkloadMemory           = Family{"gpu_workload_memory_used_bytes", "bytes", MemoryBytes}
	WorkloadSM               = Family{"gpu_workload_sm_utilization_ratio", "ratio", SummedFraction}
	WorkloadProcesses        = Family{"gpu_workload_processes", "", ProcessCount}
)

// The families of the kubelet's allocations.
var (
	AllocationInfo      = Family{"gpu_allocation_info", "", Identity}
	AllocationProcesses = Family{"gpu_allocation_processes", "", AllocationProcessCount}
	UnrequestedUse      = Family{"gpu_unrequested_use", "", Identity}
	UnmappedDevices     = Family{"gpu_pod_exporter_kubelet_unmapped_devices", "", OwnCount}
)

// The exporter's own families that the cluster view reads.
var (
	BuildInfo = Family{"gpu_pod_exporter_build_info", "", Identity}
	SourceUp  = Family{"gpu_pod_exporter_source_up", "", Flag}
)

// All are the families of the table.
var All = []Family{
	GPUInfo, MemoryTotal, MemoryUsed, MemoryFree, MemoryReserved, Utilization, MemoryUtilization, EncoderUtilization,
	DecoderUtilization, Temperature, MemoryTemperature, Power, PowerLimit, PowerManagementLimit, Energy, Clock,
	ClockEventActive, ClockViolation, FanSpeed, PerformanceState, ECCErrors, RemappedRows, RowRemapPending,
	RowRemapFailure, RetiredPages, RetiredPagesPending, XIDErrors, RecoveryAction, PCIeLinkGeneration,
	PCIeLinkMaxGeneration, PCIeLinkWidth, PCIeLinkMaxWidth, PCIeReplays, PCIeBytes, NVLinkBytes, NVLinks, NVLinkErrors,
	FabricState, FabricHealthy, VGPULicensed, GraphicsEngineActive, SMActive, SMOccupancy, PipeActive, DRAMActive,
	Processes, Workloads,
	MIGInfo, MIGMemoryTotal, MIGMemoryUsed, MIGGraphicsEngineActive, MIGSMActive, MIGSMOccupancy, MIGPipeActive,
	MIGDRAMActive,
	ProcessMemory, ProcessSM, ProcessMemoryUtilization, ProcessEncoder, ProcessDecoder, WorkloadMemory, WorkloadSM,
	WorkloadProcesses,
	AllocationInfo, AllocationProcesses, UnrequestedUse, UnmappedDevices,
	BuildInfo, SourceUp,
}
