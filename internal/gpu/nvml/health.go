//go:build linux && cgo

package nvml

import (
	"encoding/binary"
	"math"
	"slices"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// allLinks is the scope ID of an NVLink field value summed over all links (UINT_MAX).
const allLinks = math.MaxUint32

// fieldTarget is what one reading of a GPU's field values fills.
type fieldTarget struct {
	d       *gpu.Device
	nvlinks int // the number of NVLinks: links 0 to nvlinks-1 exist
}

// deviceField is one NVML field value the source reads. since is the first driver branch whose header defines
// the ID: a driver answers an ID it does not know with an error of that field, so the source asks only for IDs the
// running driver defines (NVIDIA's headers as nvidia-settings ships them, per release tag).
type deviceField struct {
	id    uint32
	scope uint32
	since int
	op    gpu.Operation
	set   func(t *fieldTarget, v gonvml.FieldValue)
}

// fieldNumber reads a field value by its type. uint64 counters above 2^53 lose precision as float64, as every counter
// in Prometheus does.
func fieldNumber(v gonvml.FieldValue) float64 {
	b := v.Value[:]
	switch gonvml.ValueType(v.ValueType) {
	case gonvml.VALUE_TYPE_DOUBLE:
		return math.Float64frombits(binary.NativeEndian.Uint64(b))
	case gonvml.VALUE_TYPE_UNSIGNED_INT:
		return float64(binary.NativeEndian.Uint32(b))
	case gonvml.VALUE_TYPE_UNSIGNED_LONG, gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG: // unsigned long is 64-bit on Linux
		return float64(binary.NativeEndian.Uint64(b))
	case gonvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return float64(int64(binary.NativeEndian.Uint64(b)))
	case gonvml.VALUE_TYPE_SIGNED_INT:
		return float64(int32(binary.NativeEndian.Uint32(b)))
	case gonvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(binary.NativeEndian.Uint16(b))
	}
	return math.NaN()
}

// memoryTemperature reads NVML_FI_DEV_MEMORY_TEMP. R545 drivers label it a double while writing an unsigned int
// (DCGM works around it as NVIDIA bug 4300930 by always reading the unsigned int), so a "double" that is not a
// normal number is read as the unsigned int it is. Readings above 200 °C are NVML's "no reading", as DCGM drops them.
func memoryTemperature(v gonvml.FieldValue) gpu.Value {
	t := fieldNumber(v)
	if gonvml.ValueType(v.ValueType) == gonvml.VALUE_TYPE_DOUBLE && t != 0 && (math.Abs(t) < 0x1p-1022 || math.IsNaN(t)) {
		t = float64(binary.NativeEndian.Uint32(v.Value[:]))
	}
	if math.IsNaN(t) || t < 0 || t > 200 {
		return gpu.Value{}
	}
	return gpu.Known(t)
}

// counter is a field value that must be a count: negative or not a number is no reading.
func counter(v gonvml.FieldValue, scale float64) gpu.Value {
	n := fieldNumber(v)
	if math.IsNaN(n) || math.IsInf(n, 0) || n < 0 {
		return gpu.Value{}
	}
	return gpu.Known(n * scale)
}

// violation appends one policy's violation time, which NVML counts in nanoseconds.
func violation(policy string) func(*fieldTarget, gonvml.FieldValue) {
	return func(t *fieldTarget, v gonvml.FieldValue) {
		if s := counter(v, 1e-9); s.Valid {
			t.d.Health.Violations = append(t.d.Health.Violations, gpu.Violation{Policy: policy, Seconds: s.V})
		}
	}
}

// deviceFields are the field values read in one call per GPU, each with its own return code. The violation
// times are in this order in the snapshot, named as gpu.ViolationPolicies names them. nvmlDeviceGetViolationStatus,
// which gives the policies' times, is deprecated in NVML 13 for these fields; the clock event reasons' own counters
// (R575+) are nanoseconds too.
var deviceFields = []deviceField{
	{id: gonvml.FI_DEV_MEMORY_TEMP, since: 418, op: gpu.OpMemoryTemperature, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.MemoryTemperatureCelsius = memoryTemperature(v)
	}},
	{id: gonvml.FI_DEV_RETIRED_SBE, since: 418, op: gpu.OpRetiredPages, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.Health.RetiredPagesSingleBit = counter(v, 1)
	}},
	{id: gonvml.FI_DEV_RETIRED_DBE, since: 418, op: gpu.OpRetiredPages, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.Health.RetiredPagesDoubleBit = counter(v, 1)
	}},
	{id: gonvml.FI_DEV_RETIRED_PENDING, since: 418, op: gpu.OpRetiredPages, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.Health.RetirementPending = flag(v)
	}},
	{id: gonvml.FI_DEV_REMAPPED_COR, since: 450, op: gpu.OpRemappedRows, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.Health.CorrectableRemappedRows = counter(v, 1)
	}},
	{id: gonvml.FI_DEV_REMAPPED_UNC, since: 450, op: gpu.OpRemappedRows, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.Health.UncorrectableRemappedRows = counter(v, 1)
	}},
	{id: gonvml.FI_DEV_REMAPPED_PENDING, since: 450, op: gpu.OpRemappedRows, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.Health.RemapPending = flag(v)
	}},
	{id: gonvml.FI_DEV_REMAPPED_FAILURE, since: 450, op: gpu.OpRemappedRows, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.Health.RemapFailure = flag(v)
	}},
	{id: gonvml.FI_DEV_NVLINK_LINK_COUNT, since: 418, op: gpu.OpNVLink, set: func(t *fieldTarget, v gonvml.FieldValue) {
		if n := counter(v, 1); n.Valid && n.V <= gonvml.NVLINK_MAX_LINKS {
			t.nvlinks = int(n.V)
		}
	}},
	// NVLink data throughput counters, in KiB, summed over all links.
	{id: gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, scope: allLinks, since: 450, op: gpu.OpNVLink, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.NVLink.TXBytes = counter(v, 1024)
	}},
	{id: gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, scope: allLinks, since: 450, op: gpu.OpNVLink, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.NVLink.RXBytes = counter(v, 1024)
	}},
	{id: gonvml.FI_DEV_PERF_POLICY_POWER, since: 418, op: gpu.OpViolations, set: violation("power")},
	{id: gonvml.FI_DEV_PERF_POLICY_THERMAL, since: 418, op: gpu.OpViolations, set: violation("thermal")},
	{id: gonvml.FI_DEV_PERF_POLICY_SYNC_BOOST, since: 418, op: gpu.OpViolations, set: violation("sync_boost")},
	{id: gonvml.FI_DEV_PERF_POLICY_BOARD_LIMIT, since: 418, op: gpu.OpViolations, set: violation("board_limit")},
	{id: gonvml.FI_DEV_PERF_POLICY_LOW_UTILIZATION, since: 418, op: gpu.OpViolations, set: violation("low_utilization")},
	{id: gonvml.FI_DEV_PERF_POLICY_RELIABILITY, since: 418, op: gpu.OpViolations, set: violation("reliability")},
	{id: gonvml.FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, since: 575, op: gpu.OpViolations, set: violation("sw_thermal_slowdown")},
	{id: gonvml.FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN, since: 575, op: gpu.OpViolations, set: violation("hw_thermal_slowdown")},
	{id: gonvml.FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN, since: 575, op: gpu.OpViolations, set: violation("hw_power_brake_slowdown")},
	// PCIe byte counters ("value can be wrapped"; a wrap reads as a counter reset).
	{id: gonvml.FI_DEV_PCIE_COUNT_TX_BYTES, since: 555, op: gpu.OpPCIe, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.PCIe.TXBytes = counter(v, 1)
	}},
	{id: gonvml.FI_DEV_PCIE_COUNT_RX_BYTES, since: 555, op: gpu.OpPCIe, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.PCIe.RXBytes = counter(v, 1)
	}},
	{id: gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION, since: 565, op: gpu.OpRecoveryAction, set: func(t *fieldTarget, v gonvml.FieldValue) {
		t.d.Health.RecoveryAction = counter(v, 1)
	}},
}

// flag is a 0/1 field value.
func flag(v gonvml.FieldValue) gpu.Value {
	n := counter(v, 1)
	if n.Valid && n.V > 1 {
		return gpu.Value{}
	}
	return n
}

// fieldsOf returns the fields that a driver of the given branch defines; 0 (unknown) takes them all.
func fieldsOf(branch int) []deviceField {
	var fields []deviceField
	for _, f := range deviceFields {
		if branch == 0 || f.since <= branch {
			fields = append(fields, f)
		}
	}
	return fields
}

// readFields reads the GPU's field values in one call and checks each one's own return code: a value the GPU does
// not have is absent, another failure of one field is an error of that field's operation. It returns how many
// NVLinks the GPU has.
func (r *deviceReader) readFields(h gonvml.Device, d *gpu.Device) int {
	fields := r.s.fields
	if r.lost != nil || len(fields) == 0 {
		return 0
	}
	values := make([]gonvml.FieldValue, len(fields))
	for i, f := range fields {
		values[i] = gonvml.FieldValue{FieldId: f.id, ScopeId: f.scope}
	}
	// A failure of the whole call is a failure of every operation it reads.
	if ret := h.GetFieldValues(values); ret != gonvml.SUCCESS {
		var failed []gpu.Operation
		for _, f := range fields {
			if !slices.Contains(failed, f.op) {
				failed = append(failed, f.op)
				r.ok(f.op, ret)
			}
		}
		return 0
	}
	t := &fieldTarget{d: d}
	for i, f := range fields {
		if r.ok(f.op, gonvml.Return(values[i].NvmlReturn)) {
			f.set(t, values[i])
		}
	}
	return t.nvlinks
}

// readHealth reads what the snapshot's PCIe, NVLink and Health hold, the memory temperature, the power management
// limit and the vGPU licence.
func (r *deviceReader) readHealth(h gonvml.Device, d *gpu.Device) {
	nvlinks := r.readFields(h, d)
	d.PowerManagementLimitWatts = readValue(r, gpu.OpPowerLimit, 0.001, h.GetPowerManagementLimit) // mW
	r.readPCIe(h, &d.PCIe)
	d.NVLink.Links = r.readNVLinks(h, nvlinks)
	d.Health.ClockEvents = r.readClockEvents(h)
	r.readFabric(h, &d.Health)
	d.VGPULicensed = r.readVGPULicense(h)
}

func (r *deviceReader) readPCIe(h gonvml.Device, p *gpu.PCIe) {
	p.Replays = readValue(r, gpu.OpPCIe, 1, h.GetPcieReplayCounter)
	p.Generation = readValue(r, gpu.OpPCIe, 1, h.GetCurrPcieLinkGeneration)
	p.MaxGeneration = readValue(r, gpu.OpPCIe, 1, h.GetMaxPcieLinkGeneration) // of the GPU and its slot together
	p.Width = readValue(r, gpu.OpPCIe, 1, h.GetCurrPcieLinkWidth)
	p.MaxWidth = readValue(r, gpu.OpPCIe, 1, h.GetMaxPcieLinkWidth)
}

// nvlinkCounters are the per-link error counters, by nvmlNvLinkErrorCounter_t.
var nvlinkCounters = []struct {
	counter gonvml.NvLinkErrorCounter
	value   func(*gpu.NVLinkLink) *gpu.Value
}{
	{gonvml.NVLINK_ERROR_DL_CRC_FLIT, func(l *gpu.NVLinkLink) *gpu.Value { return &l.CRCFlitErrors }},
	{gonvml.NVLINK_ERROR_DL_CRC_DATA, func(l *gpu.NVLinkLink) *gpu.Value { return &l.CRCDataErrors }},
	{gonvml.NVLINK_ERROR_DL_REPLAY, func(l *gpu.NVLinkLink) *gpu.Value { return &l.ReplayErrors }},
	{gonvml.NVLINK_ERROR_DL_RECOVERY, func(l *gpu.NVLinkLink) *gpu.Value { return &l.RecoveryErrors }},
}

// readNVLinks reads the state and error counters of links 0 to n-1. A link whose state NVML does not support is not
// listed. Blackwell and newer answer NOT_SUPPORTED for these counters, which leaves them absent; a counter not
// supported on one link is not asked of the next ones.
func (r *deviceReader) readNVLinks(h gonvml.Device, n int) []gpu.NVLinkLink {
	var links []gpu.NVLinkLink
	var unsupportedCounter [4]bool
	for link := 0; link < n && r.lost == nil; link++ {
		state, ret := h.GetNvLinkState(link)
		if !r.ok(gpu.OpNVLink, ret) {
			continue
		}
		l := gpu.NVLinkLink{Link: link, Active: gpu.Known(0)}
		if state == gonvml.FEATURE_ENABLED {
			l.Active = gpu.Known(1)
		}
		for i, c := range nvlinkCounters {
			if unsupportedCounter[i] || r.lost != nil {
				continue
			}
			v, ret := h.GetNvLinkErrorCounter(link, c.counter)
			if unsupported(ret) {
				unsupportedCounter[i] = true
			}
			if r.ok(gpu.OpNVLink, ret) {
				*c.value(&l) = gpu.Known(float64(v))
			}
		}
		links = append(links, l)
	}
	return links
}

// readClockEvents lists the reasons the GPU supports, each active or not. R535 renamed the calls from "throttle"
// to "event" reasons; older drivers have only the old names.
func (r *deviceReader) readClockEvents(h gonvml.Device) []gpu.ClockEvent {
	supportedCall, currentCall := h.GetSupportedClocksThrottleReasons, h.GetCurrentClocksThrottleReasons
	if r.s.syms.clocksEventReasons {
		supportedCall, currentCall = h.GetSupportedClocksEventReasons, h.GetCurrentClocksEventReasons
	}
	if r.lost != nil {
		return nil
	}
	supported, ret := supportedCall()
	if !r.ok(gpu.OpClockEvents, ret) {
		return nil
	}
	current, ret := currentCall()
	if !r.ok(gpu.OpClockEvents, ret) {
		return nil
	}
	var events []gpu.ClockEvent
	for i, reason := range gpu.ClockEventReasons { // reason i is bit i
		if bit := uint64(1) << i; supported&bit != 0 {
			events = append(events, gpu.ClockEvent{Reason: reason, Active: current&bit != 0})
		}
	}
	return events
}

// readVGPULicense follows DCGM's DCGM_FI_DEV_VGPU_LICENSE_STATUS: 0 where vGPU licensing is not supported (bare
// metal), else whether the vGPU feature is licensed; absent when NVML cannot tell. The feature entries have their
// present layout from _v4 (R470) on; before it only the first field, whether licensing is supported, is read.
func (r *deviceReader) readVGPULicense(h gonvml.Device) gpu.Value {
	if r.lost != nil {
		return gpu.Value{}
	}
	f, ret := h.GetGridLicensableFeatures()
	if !r.ok(gpu.OpVGPULicense, ret) {
		return gpu.Value{}
	}
	if f.IsGridLicenseSupported == 0 {
		return gpu.Known(0)
	}
	if !r.s.syms.gridLicensableV4 {
		return gpu.Value{}
	}
	for _, feature := range f.GridLicensableFeatures[:min(int(f.LicensableFeaturesCount), len(f.GridLicensableFeatures))] {
		if feature.FeatureCode == uint32(gonvml.GRID_LICENSE_FEATURE_CODE_VGPU) {
			if feature.FeatureState > 0 {
				return gpu.Known(1)
			}
			return gpu.Known(0)
		}
	}
	return gpu.Value{}
}

// fabricInfo is the part of nvmlGpuFabricInfo_v2/v3_t the source reads.
type fabricInfo struct {
	state      uint8
	status     uint32
	healthMask uint32
	summary    uint8 // v3 only; 0 (not supported) in v2
}

// readFabricInfo reads the versioned fabric information, v3 (R580, with a health summary) where the driver knows
// it, else v2 (R550).
func readFabricInfo(h gonvml.Device, v3 bool) (fabricInfo, gonvml.Return) {
	if v3 {
		i, ret := h.GetGpuFabricInfoV().V3()
		return fabricInfo{state: i.State, status: i.Status, healthMask: i.HealthMask, summary: i.HealthSummary}, ret
	}
	i, ret := h.GetGpuFabricInfoV().V2()
	return fabricInfo{state: i.State, status: i.Status, healthMask: i.HealthMask}, ret
}

// fabricMaskBad are the health mask fields (shift, width) whose value 1 ("true") is a fault: degraded bandwidth,
// an unhealthy route.
var fabricMaskBad = []struct{ shift, width uint32 }{
	{gonvml.GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW, gonvml.GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW},
	{gonvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY, gonvml.GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_UNHEALTHY},
}

// readFabric reads the GPU's registration with the NVSwitch fabric (R550+). The GPU is healthy when registration
// completed without error and, by the health summary (R580) or else the health mask, nothing is degraded or
// misconfigured. GPUs without a fabric answer state "not supported", which leaves both absent.
func (r *deviceReader) readFabric(h gonvml.Device, health *gpu.Health) {
	s := r.s
	if !s.syms.fabricInfoV || r.lost != nil {
		return
	}
	info, ret := s.fabricRead(h, !s.fabricV2Only)
	if ret == gonvml.ERROR_ARGUMENT_VERSION_MISMATCH && !s.fabricV2Only {
		s.fabricV2Only = true // R550 to R575
		info, ret = s.fabricRead(h, false)
	}
	if !r.ok(gpu.OpFabric, ret) || info.state == gonvml.GPU_FABRIC_STATE_NOT_SUPPORTED {
		return
	}
	health.FabricState = gpu.Known(float64(info.state))
	healthy := info.state == gonvml.GPU_FABRIC_STATE_COMPLETED && gonvml.Return(info.status) == gonvml.SUCCESS
	if info.summary != gonvml.GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED {
		healthy = healthy && info.summary == gonvml.GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
	} else {
		for _, f := range fabricMaskBad {
			healthy = healthy && (info.healthMask>>f.shift)&f.width != 1
		}
		config := (info.healthMask >> gonvml.GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION) &
			gonvml.GPU_FABRIC_HEALTH_MASK_WIDTH_INCORRECT_CONFIGURATION
		healthy = healthy && config <= gonvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE
	}
	health.FabricHealthy = gpu.Known(0)
	if healthy {
		health.FabricHealthy = gpu.Known(1)
	}
}
