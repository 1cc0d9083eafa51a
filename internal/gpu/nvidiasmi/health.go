package nvidiasmi

import (
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// The element name prefixes of the clock event reasons: clocks_throttle_reason_ up to v12 on drivers before 535,
// clocks_event_reason_ after; and of their counters (v13, drivers 575 and later).
const (
	throttleReasonPrefix = "clocks_throttle_reason_"
	eventReasonPrefix    = "clocks_event_reason_"
	eventCounterPrefix   = "clocks_event_reasons_counters_"
)

// clockEventReasons are the clock event reasons nvidia-smi prints, by the end of their element's name, with the
// name that gpu.ClockEvent gives them (NVML's), in the order of NVML's bit mask.
var clockEventReasons = []struct{ element, reason string }{
	{"gpu_idle", "gpu_idle"},
	{"applications_clocks_setting", "applications_clocks_setting"},
	{"sw_power_cap", "sw_power_cap"},
	{"hw_slowdown", "hw_slowdown"},
	{"sync_boost", "sync_boost"},
	{"sw_thermal_slowdown", "sw_thermal_slowdown"},
	{"hw_thermal_slowdown", "hw_thermal_slowdown"},
	{"hw_power_brake_slowdown", "hw_power_brake_slowdown"},
	{"display_clocks_setting", "display_clock_setting"},
}

// clockEventCounters are the times the clocks were held down, by the end of their element's name, with the policy
// that gpu.Violation names. nvidia-smi reads them from NVML's field values: the sw_power_cap and sync_boost
// counters are the power and sync_boost policies' fields (NVML_FI_DEV_PERF_POLICY_POWER and _SYNC_BOOST).
var clockEventCounters = []struct{ element, policy string }{
	{"sw_power_cap", "power"},
	{"sync_boost", "sync_boost"},
	{"sw_therm_slowdown", "sw_thermal_slowdown"},
	{"hw_therm_slowdown", "hw_thermal_slowdown"},
	{"hw_power_brake", "hw_power_brake_slowdown"},
}

// namedElements are the names of the xmlNamedValues children that are read.
func namedElements() []string {
	var names []string
	for _, r := range clockEventReasons {
		names = append(names, throttleReasonPrefix+r.element, eventReasonPrefix+r.element)
	}
	for _, c := range clockEventCounters {
		names = append(names, eventCounterPrefix+c.element)
	}
	return names
}

// readHealth fills the device's link, health and limit readings.
func readHealth(d *gpu.Device, x xmlGPU) {
	d.MemoryReservedBytes = bytesValue(x.FBMemory.Reserved)
	d.MemoryTemperatureCelsius = quantity(x.MemoryTemp, celsius, false)
	d.PowerManagementLimitWatts = firstValid(
		quantity(x.GPUPowerReadings.RequestedLimit, watts, false),
		quantity(x.GPUPowerReadings.PowerLimit, watts, false),
		quantity(x.PowerReadings.RequestedLimit, watts, false),
		quantity(x.PowerReadings.PowerLimit, watts, false),
	)
	d.VGPULicensed = vgpuLicensed(x.VGPULicenseStatus, x.Virtualization)

	d.PCIe = gpu.PCIe{
		Replays:       count(x.PCI.ReplayCounter),
		Generation:    firstValid(count(x.PCI.CurrentLinkGen), count(x.PCI.DeviceCurrentLinkGen)),
		MaxGeneration: count(x.PCI.MaxLinkGen),
		Width:         linkWidth(x.PCI.CurrentLinkWidth),
		MaxWidth:      linkWidth(x.PCI.MaxLinkWidth),
	}

	h := &d.Health
	h.CorrectableRemappedRows = count(x.RemappedRows.Correctable)
	h.UncorrectableRemappedRows = count(x.RemappedRows.Uncorrectable)
	h.RemapPending = yesNo(x.RemappedRows.Pending)
	h.RemapFailure = yesNo(x.RemappedRows.Failure)
	h.RetiredPagesSingleBit = count(x.RetiredPages.SingleBit)
	h.RetiredPagesDoubleBit = count(x.RetiredPages.DoubleBit)
	h.RetirementPending = firstValid(yesNo(x.RetiredPages.PendingRetirement), yesNo(x.RetiredPages.PendingBlacklist))

	reasons, prefix := x.ClocksEvent, eventReasonPrefix
	if len(reasons.Values) == 0 {
		reasons, prefix = x.ClocksThrottle, throttleReasonPrefix
	}
	for _, r := range clockEventReasons {
		switch strings.ToLower(strings.TrimSpace(reasons.value(prefix + r.element))) {
		case "active":
			h.ClockEvents = append(h.ClockEvents, gpu.ClockEvent{Reason: r.reason, Active: true})
		case "not active":
			h.ClockEvents = append(h.ClockEvents, gpu.ClockEvent{Reason: r.reason})
		}
	}
	for _, c := range clockEventCounters {
		if v := quantity(x.ClocksEventCounters.value(eventCounterPrefix+c.element), seconds, false); v.Valid {
			h.Violations = append(h.Violations, gpu.Violation{Policy: c.policy, Seconds: v.V})
		}
	}

	h.RecoveryAction = recoveryAction(x.RecoveryAction)
	h.FabricState, h.FabricHealthy = fabric(x.Fabric)
}

// value returns the text of the child named name, or "".
func (n xmlNamedValues) value(name string) string {
	for _, v := range n.Values {
		if v.XMLName.Local == name {
			return v.Value
		}
	}
	return ""
}

// linkWidth parses a PCIe link width as nvidia-smi prints it: "16x".
func linkWidth(s string) gpu.Value {
	s = strings.TrimSpace(s)
	if !strings.HasSuffix(s, "x") {
		return gpu.Value{}
	}
	return count(strings.TrimSuffix(s, "x"))
}

// yesNo reads nvidia-smi's Yes and No as 1 and 0.
func yesNo(s string) gpu.Value {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "yes":
		return gpu.Known(1)
	case "no":
		return gpu.Known(0)
	}
	return gpu.Value{}
}

func seconds(u string) (float64, bool) {
	switch u {
	case "ns":
		return 1e-9, true
	case "us", "µs":
		return 1e-6, true
	case "ms":
		return 1e-3, true
	case "s":
		return 1, true
	}
	return 0, false
}

// recoveryAction reads <gpu_recovery_action> as the number of NVML's nvmlDeviceGpuRecoveryAction_t. nvidia-smi prints
// None, Reset, Reboot, Drain P2P or Drain and Reset; anything else is unknown.
func recoveryAction(s string) gpu.Value {
	switch strings.ToLower(strings.Join(strings.Fields(s), " ")) {
	case "none":
		return gpu.Known(0)
	case "reset", "gpu reset":
		return gpu.Known(1)
	case "reboot", "node reboot":
		return gpu.Known(2)
	case "drain p2p":
		return gpu.Known(3)
	case "drain and reset":
		return gpu.Known(4)
	}
	return gpu.Value{}
}

// fabric reads the GPU's NVSwitch fabric registration. Healthy is known only where the state is a registration's
// (not started, in progress, completed): it is 1 when registration completed with status Success and the fabric does
// not report degraded bandwidth.
func fabric(f xmlFabric) (state, healthy gpu.Value) {
	switch strings.ToLower(strings.TrimSpace(f.State)) {
	case "not supported":
		return gpu.Known(0), gpu.Value{}
	case "not started":
		return gpu.Known(1), gpu.Known(0)
	case "in progress":
		return gpu.Known(2), gpu.Known(0)
	case "completed":
		status := strings.ToLower(strings.TrimSpace(f.Status))
		if text(status) == "" {
			return gpu.Known(3), gpu.Value{}
		}
		degraded := strings.EqualFold(strings.TrimSpace(f.Bandwidth), "degraded")
		if status == "success" && !degraded {
			return gpu.Known(3), gpu.Known(1)
		}
		return gpu.Known(3), gpu.Known(0)
	}
	return gpu.Value{}, gpu.Value{}
}

// vgpuLicensed follows DCGM: 1 when the vGPU software licence is held, 0 when it is not, and 0 on a GPU that is not
// a vGPU and has no licence to hold (bare metal or pass-through without a vGPU licensed product). A vGPU without a
// readable status is unknown.
func vgpuLicensed(status, virtualization string) gpu.Value {
	status = strings.ToLower(strings.TrimSpace(status))
	switch {
	case strings.HasPrefix(status, "licensed"):
		return gpu.Known(1)
	case strings.HasPrefix(status, "unlicensed"):
		return gpu.Known(0)
	case status != "":
		return gpu.Value{}
	}
	switch strings.ToLower(strings.TrimSpace(virtualization)) {
	case "none", "pass-through":
		return gpu.Known(0)
	}
	return gpu.Value{}
}
