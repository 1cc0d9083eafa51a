package gpu

// PCIe is the GPU's PCI Express link and its traffic.
type PCIe struct {
	// Replays counts the link's replayed transfers since the driver loaded: a rising count is a bad link or slot.
	Replays Value
	// The link's generation and width now, and the most the GPU and its slot can run. A link below its maximum
	// while the GPU is busy is degraded (an idle GPU lowers its generation to save power).
	Generation, MaxGeneration Value
	Width, MaxWidth           Value // lanes
	// TXBytes and RXBytes are the bytes sent and received over the link, as counters; absent where the driver has
	// no counter (it may have a rate, in Profiling).
	TXBytes, RXBytes Value
}

// NVLink is the GPU's NVLink: the traffic summed over its links, and each link's state and errors.
type NVLink struct {
	// TXBytes and RXBytes are the data bytes sent and received over all links, as counters.
	TXBytes, RXBytes Value
	Links            []NVLinkLink
}

// NVLinkLink is one NVLink of a GPU. Only links that exist are listed.
type NVLinkLink struct {
	Link int
	// Active is 1 when the link is up, 0 when it is down.
	Active Value
	// Error counters since the driver loaded, by NVML's counter names.
	CRCFlitErrors, CRCDataErrors, ReplayErrors, RecoveryErrors Value
}

// Health are the GPU's signals of faults and slowdowns.
type Health struct {
	// RemappedRows are the memory rows the GPU replaced (Ampere and newer, outside MIG mode), by the kind of error
	// that caused them. A pending remap takes effect at the next GPU reset; a failure means a row could not be
	// remapped and the GPU should be replaced.
	CorrectableRemappedRows, UncorrectableRemappedRows Value
	RemapPending, RemapFailure                         Value // 0 or 1
	// RetiredPages are the framebuffer pages retired (GPUs before Ampere), by cause; RetirementPending is 1 when a
	// retirement waits for the next reboot.
	RetiredPagesSingleBit, RetiredPagesDoubleBit Value
	RetirementPending                            Value
	// ClockEvents are the reasons the GPU's clocks are held down now, one per reason the GPU can report.
	ClockEvents []ClockEvent
	// Violations are the cumulative times the GPU was held below its requested clocks, by policy.
	Violations []Violation
	// RecoveryAction is what the driver says the GPU needs (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, R565+): 0 none,
	// 1 a GPU reset, 2 a node reboot, 3 drain peer-to-peer traffic, 4 drain and reset.
	RecoveryAction Value
	// FabricState is the GPU's registration with the NVSwitch fabric (R550+, NVSwitch systems): 1 not started,
	// 2 in progress, 3 completed; absent where the GPU has no fabric (NVML's state 0, "not supported").
	// FabricHealthy is 1 when registration completed without error and the fabric reports no degraded bandwidth,
	// 0 otherwise.
	FabricState, FabricHealthy Value
}

// ClockEvent is one reason the GPU's clocks can be held down, and whether it holds them now.
type ClockEvent struct {
	// Reason is one of ClockEventReasons.
	Reason string
	Active bool
}

// ClockEventReasons are the reasons a ClockEvent names, in NVML's words, lower case, in the order of NVML's bit mask
// (nvmlClocksEventReason…: reason i is bit i, from GpuIdle 0x1 to DisplayClockSetting 0x100, and BoardLimit 0x200
// and Reliability 0x400 of NVML 13.4's header).
var ClockEventReasons = []string{"gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
	"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting", "board_limit",
	"reliability"}

// Violation is how long, in total since the driver loaded, one policy held the GPU's clocks down.
type Violation struct {
	// Policy is one of ViolationPolicies.
	Policy  string
	Seconds float64
}

// ViolationPolicies are the policies a Violation names: NVML's performance policies (nvmlPerfPolicyType_t, power
// to reliability), then the clock event reasons that R575+ counts on their own (NVML_FI_DEV_CLOCKS_EVENT_REASON_…).
// NVML's sw_power_cap and sync_boost counters are the power and sync_boost policies' (the same field IDs), so they
// go by those names.
var ViolationPolicies = []string{"power", "thermal", "sync_boost", "board_limit", "low_utilization", "reliability",
	"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}

// Profiling is what a GPU's (or GPU instance's) performance monitor measured between two readings. The ratios are
// fractions of the interval (0-1); the rates are bytes per second. Each is absent where the driver did not give it.
type Profiling struct {
	GraphicsEngineActive                           Value // any graphics or compute engine was busy
	SMActive                                       Value // at least one warp was resident on an SM, averaged over the SMs
	SMOccupancy                                    Value // resident warps over the SMs' maximum
	TensorActive                                   Value // any tensor pipe was busy
	DRAMActive                                     Value // the memory interface was sending or receiving
	FP64Active                                     Value
	FP32Active                                     Value
	FP16Active                                     Value
	PCIeTXBytesPerSecond, PCIeRXBytesPerSecond     Value
	NVLinkTXBytesPerSecond, NVLinkRXBytesPerSecond Value
}
