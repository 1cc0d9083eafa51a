// Package gpu defines what every GPU source produces: one point-in-time Snapshot of the node's devices, MIG
// instances and GPU processes. Sources (NVML, nvidia-smi, the kernel's DRM interfaces, simulated) live in
// subpackages; attribution and metrics only ever see a Snapshot.
package gpu

import (
	"context"
	"time"
)

// Source reads the state of all GPUs on the node. A Source is called one Snapshot at a time: the caller serializes
// (reading.Reader makes concurrent scrapes share one reading), so a source needs no locking or sharing of its own,
// and the Snapshot it returns belongs to the caller.
type Source interface {
	// Name is the source's name in flags and self-metrics: "nvml", "nvidia-smi", "drm", "simulated", or a
	// mixed node's two joined by "+" ("nvml+drm").
	Name() string
	// Snapshot reads every device once, and returns by ctx's deadline as far as the driver lets it. A failure of
	// one device is reported in Snapshot.Errors and the other devices are still returned; an error return means
	// nothing could be read at all.
	Snapshot(ctx context.Context) (*Snapshot, error)
	// Close releases the library, goroutines and files the source holds.
	Close() error
}

// Timeouter is implemented by a source that bounds each Snapshot itself (nvidia-smi's run timeout), so that the
// caller's deadline for the whole reading can leave it that long.
type Timeouter interface {
	Timeout() time.Duration
}

// Value is a reading that the driver may not have: Valid is false when it reported N/A, "not supported" or an error,
// and then the series is left out rather than written as 0.
type Value struct {
	V     float64
	Valid bool
}

// Known returns a valid Value.
func Known(v float64) Value { return Value{V: v, Valid: true} }

// Snapshot is one reading of the whole node.
type Snapshot struct {
	Time          time.Time
	DriverVersion string
	CUDAVersion   string
	// Simulated marks data that does not come from real hardware (demo and --gpu.simulated-config).
	Simulated bool
	Devices   []Device
	// Errors lists what could not be read, per device and operation. A device that failed entirely is in Errors
	// and not in Devices, except that a GPU with counted XID errors stays in Devices with only its identity (as last
	// read) and XIDErrors (a GPU that fell off the bus reports XID 79 and cannot be read after).
	Errors []DeviceError
}

// Device is one physical GPU.
type Device struct {
	Index    int
	UUID     string // GPU-…; for GPUs that the DRM source reads: GPU-<amdgpu's unique_id>, else PCI-<PCI address>
	Name     string
	PCIBusID string
	// Vendor is VendorNVIDIA, VendorAMD or VendorIntel: on a node with GPUs of several vendors, it tells them apart.
	Vendor string
	// DriverVersion is the version of this GPU's driver, where it differs from the snapshot's (a node whose GPUs
	// have several drivers); empty: Snapshot.DriverVersion.
	DriverVersion string
	// DRMCard is the GPU's DRM card, card<N> of /dev/dri and /sys/class/drm, for the GPUs that the DRM source reads:
	// Intel's device plugin names GPUs by it. Empty for the others.
	DRMCard string
	// MinorNumber is the N of /dev/nvidiaN, for NVIDIA GPUs only. It can differ from Index; NVIDIA's DRA driver names
	// GPUs by it.
	MinorNumber Value
	MIGMode     MIGMode

	MemoryTotalBytes Value
	MemoryUsedBytes  Value // without MemoryReservedBytes where the source knows it
	MemoryFreeBytes  Value
	// MemoryReservedBytes is what the driver and firmware set aside for themselves (NVML v2, R510 and later).
	MemoryReservedBytes Value

	UtilizationRatio        Value
	MemoryUtilizationRatio  Value
	EncoderUtilizationRatio Value
	DecoderUtilizationRatio Value

	TemperatureCelsius Value
	PowerUsageWatts    Value
	PowerLimitWatts    Value
	EnergyJoules       Value // total since the driver loaded
	FanSpeedRatio      Value
	PerformanceState   Value // P-state number: 0 (P0, fastest) to 15

	Clocks    []Clock
	ECCErrors []ECCCount
	XIDErrors []XIDCount // counted since the exporter started

	// MemoryTemperatureCelsius is the temperature of the GPU's memory (HBM parts only).
	MemoryTemperatureCelsius Value
	// PowerManagementLimitWatts is the power limit the administrator (or the default) set; PowerLimitWatts is the one
	// enforced, which can be lower (another limit, such as a thermal one, applies).
	PowerManagementLimitWatts Value
	// VGPULicensed is 1 when the vGPU licence is held, 0 when it is not or the GPU is not a vGPU (bare metal), as
	// DCGM reports it.
	VGPULicensed Value
	PCIe         PCIe
	NVLink       NVLink
	Health       Health
	// Profiling is what the GPU's performance monitor (NVML's GPM, Hopper and newer) measured between this reading
	// and an earlier one; nil where the GPU has none, or on the first reading.
	Profiling *Profiling
	// PerformanceMonitor is 1 where the source reads the GPU's performance monitor, so that a nil Profiling is only
	// a first reading or a failed one; 0 where it reads none (a GPU before Hopper, a driver before R520, a source
	// without one such as nvidia-smi); unknown where the source could not tell.
	PerformanceMonitor Value

	MIG []MIGInstance
	// ProcessesListed is false when the process list could not be read: Processes is then empty without meaning
	// that the GPU is idle, and per-type process counts are left out.
	ProcessesListed bool
	Processes       []Process
}

// The vendors of GPUs, as gpu_info's vendor label writes them.
const (
	VendorNVIDIA = "nvidia"
	VendorAMD    = "amd"
	VendorIntel  = "intel"
)

// MIGMode is a GPU's current MIG mode, as the gpu_info metric's mig_mode label writes it.
type MIGMode string

// MIG modes. The zero value means the GPU does not support MIG.
const (
	MIGEnabled     MIGMode = "enabled"
	MIGDisabled    MIGMode = "disabled"
	MIGUnsupported MIGMode = ""
)

// Clock is one current clock frequency.
type Clock struct {
	Name  string // graphics, sm, memory, video
	Hertz float64
}

// ECCCount is a lifetime ECC error count of one kind.
type ECCCount struct {
	Type  string // corrected, uncorrected
	Count float64
}

// XIDCount is how often one XID error code was seen.
type XIDCount struct {
	XID   uint64
	Count uint64
}

// MIGInstance is one MIG device (a GPU instance and compute instance pair) on a GPU in MIG mode. Its memory belongs
// to the GPU instance, which its compute instances share: it is set on one MIG device per GPU instance (NVML: the
// lowest compute instance) and absent on the others, so that sums count it once.
type MIGInstance struct {
	UUID             string // MIG-…
	GPUInstance      int
	ComputeInstance  int
	Profile          string // e.g. 1g.10gb
	MemoryTotalBytes Value
	MemoryUsedBytes  Value
	// Placement is where the GPU instance sits on its GPU, by which NVIDIA's DRA driver names MIG devices; nil
	// when the source cannot read it (nvidia-smi does not print it).
	Placement *MIGPlacement
	// Profiling is the GPU instance's, set like the memory on one MIG device per GPU instance; nil where not read.
	Profiling *Profiling
}

// MIGPlacement is a GPU instance's profile and the memory slices it occupies (NVML's nvmlGpuInstanceInfo_t).
type MIGPlacement struct {
	ProfileID   int // GPU instance profile ID, as nvidia-smi mig -lgip lists it
	Start, Size int // first memory slice, number of slices
}

// Process types as docs/reference.md names them.
const (
	ProcessCompute            = "compute"
	ProcessGraphics           = "graphics"
	ProcessComputeAndGraphics = "compute+graphics"
	ProcessMPS                = "mps"
)

// Process is one process using one GPU. The same PID appears once per GPU it uses.
type Process struct {
	PID  uint32 // host PID
	Name string // what the source calls it (nvidia-smi's process_name); attribution prefers /proc/<pid>/comm
	Type string

	UsedMemoryBytes         Value
	SMUtilizationRatio      Value
	MemoryUtilizationRatio  Value
	EncoderUtilizationRatio Value
	DecoderUtilizationRatio Value

	// MIG is true when the process runs on a MIG instance, named by GPUInstance and ComputeInstance.
	MIG             bool
	GPUInstance     int
	ComputeInstance int
}

// DeviceError is one thing that could not be read from one device.
type DeviceError struct {
	Index     int       // -1 when the failure is not tied to one device
	UUID      string    // empty when not known
	Operation Operation // what was being read
	Err       error
}

func (e DeviceError) Error() string { return string(e.Operation) + ": " + e.Err.Error() }

// Operation names what could not be read, in DeviceError and in the operation label of
// gpu_pod_exporter_device_errors_total.
type Operation string

// Operations that sources report. OpDevice and OpProcesses say something about the process list: the GPU's
// processes are then not all known.
const (
	OpDevice             Operation = "device"    // the whole GPU: no handle, no UUID, or lost
	OpProcesses          Operation = "processes" // the GPU's process list
	OpProcessUtilization Operation = "process_utilization"
	OpDriverVersion      Operation = "driver_version"
	OpCUDAVersion        Operation = "cuda_version"
	OpName               Operation = "name"
	OpPCI                Operation = "pci"
	OpMinorNumber        Operation = "minor_number"
	OpMIGMode            Operation = "mig_mode"
	OpMIG                Operation = "mig" // MIG instances: listing them or reading one
	OpMIGMemory          Operation = "mig_memory"
	OpMemory             Operation = "memory"
	OpUtilization        Operation = "utilization"
	OpEncoderUtilization Operation = "encoder_utilization"
	OpDecoderUtilization Operation = "decoder_utilization"
	OpTemperature        Operation = "temperature"
	OpPowerUsage         Operation = "power_usage"
	OpPowerLimit         Operation = "power_limit"
	OpEnergy             Operation = "energy"
	OpFanSpeed           Operation = "fan_speed"
	OpPerformanceState   Operation = "performance_state"
	OpClocks             Operation = "clocks"
	OpECC                Operation = "ecc"
	OpMemoryTemperature  Operation = "memory_temperature"
	OpVGPULicense        Operation = "vgpu_license"
	OpPCIe               Operation = "pcie"   // link generation and width, replays, traffic counters
	OpNVLink             Operation = "nvlink" // link state, error counters, traffic counters
	OpRemappedRows       Operation = "remapped_rows"
	OpRetiredPages       Operation = "retired_pages"
	OpClockEvents        Operation = "clock_events"
	OpViolations         Operation = "violations"
	OpRecoveryAction     Operation = "recovery_action"
	OpFabric             Operation = "fabric"
	OpProfiling          Operation = "profiling" // the performance monitor (GPM) of a GPU or GPU instance
	OpConfig             Operation = "config"    // the simulated node file
)
