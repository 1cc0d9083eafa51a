//go:build linux && cgo

package nvml

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// fieldIDs records the field IDs and scopes of each nvmlDeviceGetFieldValues call.
func fieldIDs(dev *mock.Device) *[][2]uint32 {
	var asked [][2]uint32
	dev.GetFieldValuesFunc = func(values []gonvml.FieldValue) gonvml.Return {
		for i := range values {
			asked = append(asked, [2]uint32{values[i].FieldId, values[i].ScopeId})
			values[i].NvmlReturn = uint32(healthyField(&values[i]))
		}
		return gonvml.SUCCESS
	}
	return &asked
}

// The source asks only for the field IDs the running driver's branch defines (a driver answers an ID it does not
// know with an error of that field): the PCIe byte counters from R555, the recovery action from R565. The NVLink
// counters are asked summed over all links (scope UINT_MAX).
func TestFieldValuesAskedByDriverBranch(t *testing.T) {
	for _, tc := range []struct {
		driver        string
		pcie, recover bool
	}{
		{"470.256.02", false, false},
		{"535.54.03", false, false},
		{"555.42.02", true, false},
		{"580.95.05", true, true},
		{"unreadable", true, true},
	} {
		t.Run(tc.driver, func(t *testing.T) {
			dev := newDevice("GPU-0")
			asked := fieldIDs(dev)
			lib := newLibrary(dev)
			lib.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return tc.driver, gonvml.SUCCESS }
			snapshot(t, newSource(t, lib))
			has := func(id uint32) bool {
				return slices.ContainsFunc(*asked, func(f [2]uint32) bool { return f[0] == id })
			}
			if has(gonvml.FI_DEV_PCIE_COUNT_TX_BYTES) != tc.pcie || has(gonvml.FI_DEV_PCIE_COUNT_RX_BYTES) != tc.pcie ||
				has(gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION) != tc.recover {
				t.Errorf("asked %v; want PCIe bytes %v, recovery action %v", *asked, tc.pcie, tc.recover)
			}
			if !slices.Contains(*asked, [2]uint32{gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, math.MaxUint32}) ||
				!has(gonvml.FI_DEV_MEMORY_TEMP) {
				t.Errorf("asked %v", *asked)
			}
		})
	}
}

func fieldValue(valueType gonvml.ValueType, bits uint64) gonvml.FieldValue {
	v := gonvml.FieldValue{ValueType: uint32(valueType)}
	binary.NativeEndian.PutUint64(v.Value[:], bits)
	return v
}

func TestFieldNumberByType(t *testing.T) {
	for _, tc := range []struct {
		v    gonvml.FieldValue
		want float64
	}{
		{fieldValue(gonvml.VALUE_TYPE_DOUBLE, math.Float64bits(2.5)), 2.5},
		{fieldValue(gonvml.VALUE_TYPE_UNSIGNED_INT, 0xFFFF_FFFF_0000_0007), 7},
		{fieldValue(gonvml.VALUE_TYPE_UNSIGNED_LONG, 1<<40), 1 << 40},
		{fieldValue(gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG, 5e12), 5e12},
		{fieldValue(gonvml.VALUE_TYPE_SIGNED_LONG_LONG, math.MaxUint64), -1},
		{fieldValue(gonvml.VALUE_TYPE_SIGNED_INT, 0xFFFF_FFFE), -2},
		{fieldValue(gonvml.VALUE_TYPE_UNSIGNED_SHORT, 0xFFFF_0009), 9},
	} {
		if got := fieldNumber(tc.v); got != tc.want {
			t.Errorf("type %d = %v, want %v", tc.v.ValueType, got, tc.want)
		}
	}
	if got := fieldNumber(fieldValue(gonvml.VALUE_TYPE_COUNT, 1)); !math.IsNaN(got) {
		t.Errorf("unknown type = %v, want NaN", got)
	}
}

// R545 labels the memory temperature a double while writing an unsigned int (NVIDIA bug 4300930, which DCGM works
// around): both read as the temperature. Above 200 °C is no reading, as DCGM has it.
func TestMemoryTemperature(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    gonvml.FieldValue
		want gpu.Value
	}{
		{"unsigned int", fieldValue(gonvml.VALUE_TYPE_UNSIGNED_INT, 41), gpu.Known(41)},
		{"R545: an unsigned int labelled double", fieldValue(gonvml.VALUE_TYPE_DOUBLE, 41), gpu.Known(41)},
		{"a real double", fieldValue(gonvml.VALUE_TYPE_DOUBLE, math.Float64bits(41)), gpu.Known(41)},
		{"0 °C", fieldValue(gonvml.VALUE_TYPE_DOUBLE, 0), gpu.Known(0)},
		{"over 200", fieldValue(gonvml.VALUE_TYPE_UNSIGNED_INT, 0xFFFFFFFF), gpu.Value{}},
	} {
		if got := memoryTemperature(tc.v); got != tc.want {
			t.Errorf("%s = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// Each field value has its own return code: NOT_SUPPORTED leaves that field absent without an error; another
// failure is an error of that field's operation; the other fields are read. A failure of the whole call is an
// error of every operation it reads.
func TestFieldValueReturnCodes(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetFieldValuesFunc = func(values []gonvml.FieldValue) gonvml.Return {
		for i := range values {
			v := &values[i]
			ret := healthyField(v)
			switch v.FieldId {
			case gonvml.FI_DEV_MEMORY_TEMP:
				ret = gonvml.ERROR_NOT_SUPPORTED
			case gonvml.FI_DEV_REMAPPED_UNC:
				ret = gonvml.ERROR_UNKNOWN
			case gonvml.FI_DEV_REMAPPED_COR:
				binary.NativeEndian.PutUint64(v.Value[:], 4)
			}
			v.NvmlReturn = uint32(ret)
		}
		return gonvml.SUCCESS
	}
	lib := newLibrary(dev)
	lib.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return "580.95.05", gonvml.SUCCESS }
	s := newSource(t, lib)
	snap := snapshot(t, s)
	d := deviceByUUID(t, snap, "GPU-0")
	wantAbsent(t, "memory temperature", d.MemoryTemperatureCelsius)
	wantAbsent(t, "uncorrectable remapped rows", d.Health.UncorrectableRemappedRows)
	wantValue(t, "correctable remapped rows", d.Health.CorrectableRemappedRows, 4)
	wantValue(t, "recovery action", d.Health.RecoveryAction, 0)
	if len(snap.Errors) != 1 || snap.Errors[0].Operation != gpu.OpRemappedRows || !isReturn(snap.Errors[0].Err, gonvml.ERROR_UNKNOWN) {
		t.Errorf("errors = %v, want one remapped_rows UNKNOWN", snap.Errors)
	}

	dev.GetFieldValuesFunc = func([]gonvml.FieldValue) gonvml.Return { return gonvml.ERROR_UNKNOWN }
	snap = snapshot(t, s)
	var ops []gpu.Operation
	for _, e := range snap.Errors {
		ops = append(ops, e.Operation)
	}
	slices.Sort(ops)
	want := []gpu.Operation{gpu.OpMemoryTemperature, gpu.OpNVLink, gpu.OpPCIe, gpu.OpRecoveryAction, gpu.OpRemappedRows,
		gpu.OpRetiredPages, gpu.OpViolations}
	slices.Sort(want)
	if !slices.Equal(ops, want) {
		t.Errorf("operations failed %v, want %v", ops, want)
	}
	if d := deviceByUUID(t, snap, "GPU-0"); d.Health.CorrectableRemappedRows.Valid || d.PCIe.Generation != gpu.Known(5) {
		t.Errorf("after a failed call: remapped %+v, PCIe generation %+v", d.Health.CorrectableRemappedRows, d.PCIe.Generation)
	}
}

// NVLinks: links 0 to NVML_FI_DEV_NVLINK_LINK_COUNT-1; a link whose state is not supported is left out, an error
// counter that is not supported (Blackwell) is absent, and not asked of the other links.
func TestNVLinks(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetFieldValuesFunc = func(values []gonvml.FieldValue) gonvml.Return {
		for i := range values {
			v := &values[i]
			v.NvmlReturn = uint32(healthyField(v))
			switch v.FieldId {
			case gonvml.FI_DEV_NVLINK_LINK_COUNT:
				v.ValueType = uint32(gonvml.VALUE_TYPE_UNSIGNED_INT)
				binary.NativeEndian.PutUint64(v.Value[:], 3)
			case gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
				binary.NativeEndian.PutUint64(v.Value[:], 10) // KiB
			}
		}
		return gonvml.SUCCESS
	}
	dev.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
		switch link {
		case 0:
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		case 1:
			return 0, gonvml.ERROR_NOT_SUPPORTED
		}
		return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
	}
	replayAsked := 0
	dev.GetNvLinkErrorCounterFunc = func(link int, c gonvml.NvLinkErrorCounter) (uint64, gonvml.Return) {
		if c == gonvml.NVLINK_ERROR_DL_REPLAY {
			replayAsked++
			return 0, gonvml.ERROR_NOT_SUPPORTED
		}
		return uint64(100*link) + uint64(c), gonvml.SUCCESS
	}
	snap := snapshot(t, newSource(t, newLibrary(dev)))
	wantNoErrors(t, snap)
	nv := deviceByUUID(t, snap, "GPU-0").NVLink
	wantValue(t, "RX bytes", nv.RXBytes, 10*1024)
	want := []gpu.NVLinkLink{
		{Link: 0, Active: gpu.Known(1), CRCFlitErrors: gpu.Known(2), CRCDataErrors: gpu.Known(3), RecoveryErrors: gpu.Known(1)},
		{Link: 2, Active: gpu.Known(0), CRCFlitErrors: gpu.Known(202), CRCDataErrors: gpu.Known(203), RecoveryErrors: gpu.Known(201)},
	}
	if !slices.Equal(nv.Links, want) {
		t.Errorf("links = %+v, want %+v", nv.Links, want)
	}
	if replayAsked != 1 {
		t.Errorf("the unsupported replay counter was asked %d times, want once per reading", replayAsked)
	}
}

// Before 535.43.02 the driver has only the clock "throttle" reason calls; the source calls those (the "event"
// ones would end the process with a symbol lookup error). Each supported reason is listed, active or not.
func TestClockEventReasons(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing []string
	}{{"R535 and later", nil}, {"before R535", []string{symClocksEventReasons}}} {
		t.Run(tc.name, func(t *testing.T) {
			dev := newDevice("GPU-0")
			supported := func() (uint64, gonvml.Return) {
				return gonvml.ClocksEventReasonGpuIdle | gonvml.ClocksEventReasonSwPowerCap | gonvml.ClocksEventReasonReliability, gonvml.SUCCESS
			}
			current := func() (uint64, gonvml.Return) { return gonvml.ClocksEventReasonSwPowerCap | 1<<40, gonvml.SUCCESS }
			if tc.missing == nil {
				dev.GetSupportedClocksEventReasonsFunc, dev.GetCurrentClocksEventReasonsFunc = supported, current
				dev.GetSupportedClocksThrottleReasonsFunc, dev.GetCurrentClocksThrottleReasonsFunc = nil, nil
			} else {
				dev.GetSupportedClocksThrottleReasonsFunc, dev.GetCurrentClocksThrottleReasonsFunc = supported, current
				dev.GetSupportedClocksEventReasonsFunc, dev.GetCurrentClocksEventReasonsFunc = nil, nil
			}
			snap := snapshot(t, newSource(t, withoutSymbols(newLibrary(dev), tc.missing...)))
			wantNoErrors(t, snap)
			want := []gpu.ClockEvent{{Reason: "gpu_idle"}, {Reason: "sw_power_cap", Active: true}, {Reason: "reliability"}}
			if got := deviceByUUID(t, snap, "GPU-0").Health.ClockEvents; !slices.Equal(got, want) {
				t.Errorf("clock events = %+v, want %+v", got, want)
			}
		})
	}
}

// The vGPU licence as DCGM reports it: 0 where licensing is not supported (bare metal), else whether the vGPU
// feature is licensed; absent where NVML cannot tell, and before R470 where the feature entries had another layout.
func TestVGPULicense(t *testing.T) {
	licensed := func(state uint32) gonvml.GridLicensableFeatures {
		f := gonvml.GridLicensableFeatures{IsGridLicenseSupported: 1, LicensableFeaturesCount: 2}
		f.GridLicensableFeatures[1] = gonvml.GridLicensableFeature{FeatureCode: uint32(gonvml.GRID_LICENSE_FEATURE_CODE_VGPU), FeatureState: state}
		return f
	}
	for _, tc := range []struct {
		name     string
		features gonvml.GridLicensableFeatures
		ret      gonvml.Return
		missing  []string
		want     gpu.Value
	}{
		{"bare metal", gonvml.GridLicensableFeatures{}, gonvml.SUCCESS, nil, gpu.Known(0)},
		{"licensed", licensed(1), gonvml.SUCCESS, nil, gpu.Known(1)},
		{"unlicensed", licensed(0), gonvml.SUCCESS, nil, gpu.Known(0)},
		{"no vGPU feature", gonvml.GridLicensableFeatures{IsGridLicenseSupported: 1}, gonvml.SUCCESS, nil, gpu.Value{}},
		{"before R470", licensed(1), gonvml.SUCCESS, []string{symGridLicensableFeaturesV4}, gpu.Value{}},
		{"not supported", gonvml.GridLicensableFeatures{}, gonvml.ERROR_NOT_SUPPORTED, nil, gpu.Value{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := newDevice("GPU-0")
			dev.GetGridLicensableFeaturesFunc = func() (gonvml.GridLicensableFeatures, gonvml.Return) { return tc.features, tc.ret }
			snap := snapshot(t, newSource(t, withoutSymbols(newLibrary(dev), tc.missing...)))
			wantNoErrors(t, snap)
			if got := deviceByUUID(t, snap, "GPU-0").VGPULicensed; got != tc.want {
				t.Errorf("vGPU licence = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// withFabric makes the library have nvmlDeviceGetGpuFabricInfoV and the source read it from read; it returns how
// often each version was asked for.
func withFabric(t *testing.T, lib *mock.Interface, read func(v3 bool) (fabricInfo, gonvml.Return)) (*Source, *[2]int) {
	t.Helper()
	lib.ExtensionsFunc = func() gonvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
	}
	s := newSource(t, lib)
	var asked [2]int
	s.fabricRead = func(_ gonvml.Device, v3 bool) (fabricInfo, gonvml.Return) {
		if v3 {
			asked[1]++
		} else {
			asked[0]++
		}
		return read(v3)
	}
	return s, &asked
}

// Fabric state and health: version 3 (R580) has a health summary; R550 to R575 answer version 3 with
// ARGUMENT_VERSION_MISMATCH and are read with version 2, whose health mask says whether bandwidth is degraded or a
// route unhealthy. A GPU without a fabric (state "not supported") has neither value.
func TestFabric(t *testing.T) {
	const (
		completed   = gonvml.GPU_FABRIC_STATE_COMPLETED
		degradedBW  = gonvml.GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE << gonvml.GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
		healthyBW   = gonvml.GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE << gonvml.GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
		badRoute    = gonvml.GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE << gonvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
		noPartition = gonvml.GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION <<
			gonvml.GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION
	)
	v3 := func(info fabricInfo) func(bool) (fabricInfo, gonvml.Return) {
		return func(bool) (fabricInfo, gonvml.Return) { return info, gonvml.SUCCESS }
	}
	v2 := func(info fabricInfo) func(bool) (fabricInfo, gonvml.Return) {
		return func(isV3 bool) (fabricInfo, gonvml.Return) {
			if isV3 {
				return fabricInfo{}, gonvml.ERROR_ARGUMENT_VERSION_MISMATCH
			}
			return info, gonvml.SUCCESS
		}
	}
	for _, tc := range []struct {
		name           string
		read           func(bool) (fabricInfo, gonvml.Return)
		state, healthy gpu.Value
		wantAsked      [2]int // v2, v3 over two readings
	}{
		{"v3 healthy", v3(fabricInfo{state: completed, healthMask: healthyBW, summary: gonvml.GPU_FABRIC_HEALTH_SUMMARY_HEALTHY}),
			gpu.Known(3), gpu.Known(1), [2]int{0, 2}},
		{"v3 limited capacity", v3(fabricInfo{state: completed, healthMask: degradedBW, summary: gonvml.GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY}),
			gpu.Known(3), gpu.Known(0), [2]int{0, 2}},
		{"v3 registration failed", v3(fabricInfo{state: completed, status: uint32(gonvml.ERROR_UNKNOWN), summary: gonvml.GPU_FABRIC_HEALTH_SUMMARY_HEALTHY}),
			gpu.Known(3), gpu.Known(0), [2]int{0, 2}},
		{"in progress", v3(fabricInfo{state: gonvml.GPU_FABRIC_STATE_IN_PROGRESS}), gpu.Known(2), gpu.Known(0), [2]int{0, 2}},
		{"v2 healthy", v2(fabricInfo{state: completed, healthMask: healthyBW}), gpu.Known(3), gpu.Known(1), [2]int{2, 1}},
		{"v2 degraded bandwidth", v2(fabricInfo{state: completed, healthMask: degradedBW}), gpu.Known(3), gpu.Known(0), [2]int{2, 1}},
		{"v2 unhealthy route", v2(fabricInfo{state: completed, healthMask: healthyBW | badRoute}), gpu.Known(3), gpu.Known(0), [2]int{2, 1}},
		{"v2 no partition", v2(fabricInfo{state: completed, healthMask: noPartition}), gpu.Known(3), gpu.Known(0), [2]int{2, 1}},
		{"no fabric", v3(fabricInfo{state: gonvml.GPU_FABRIC_STATE_NOT_SUPPORTED}), gpu.Value{}, gpu.Value{}, [2]int{0, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, asked := withFabric(t, newLibrary(newDevice("GPU-0")), tc.read)
			for range 2 {
				snap := snapshot(t, s)
				wantNoErrors(t, snap)
				h := deviceByUUID(t, snap, "GPU-0").Health
				if h.FabricState != tc.state || h.FabricHealthy != tc.healthy {
					t.Errorf("fabric state %+v healthy %+v, want %+v %+v", h.FabricState, h.FabricHealthy, tc.state, tc.healthy)
				}
			}
			if *asked != tc.wantAsked {
				t.Errorf("asked v2, v3 %v times, want %v", *asked, tc.wantAsked)
			}
		})
	}
}

// The power management limit (what the administrator set) and the enforced limit (the lowest that applies) are
// read apart, in watts.
func TestPowerLimits(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetPowerManagementLimitFunc = func() (uint32, gonvml.Return) { return 700000, gonvml.SUCCESS }
	dev.GetEnforcedPowerLimitFunc = func() (uint32, gonvml.Return) { return 450500, gonvml.SUCCESS }
	d := deviceByUUID(t, snapshot(t, newSource(t, newLibrary(dev))), "GPU-0")
	wantValue(t, "management limit", d.PowerManagementLimitWatts, 700)
	wantValue(t, "enforced limit", d.PowerLimitWatts, 450.5)
}

// gpu.ClockEventReasons names reason i for NVML's bit i: go-nvml's constants say so. The violation times the
// source reads are named from gpu.ViolationPolicies.
func TestReasonAndPolicyNames(t *testing.T) {
	bits := map[string]uint64{
		"gpu_idle": gonvml.ClocksEventReasonGpuIdle, "applications_clocks_setting": gonvml.ClocksEventReasonApplicationsClocksSetting,
		"sw_power_cap": gonvml.ClocksEventReasonSwPowerCap, "hw_slowdown": gonvml.ClocksThrottleReasonHwSlowdown,
		"sync_boost": gonvml.ClocksEventReasonSyncBoost, "sw_thermal_slowdown": gonvml.ClocksEventReasonSwThermalSlowdown,
		"hw_thermal_slowdown":     gonvml.ClocksThrottleReasonHwThermalSlowdown,
		"hw_power_brake_slowdown": gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown,
		"display_clock_setting":   gonvml.ClocksEventReasonDisplayClockSetting, "board_limit": gonvml.ClocksEventReasonBoardLimit,
		"reliability": gonvml.ClocksEventReasonReliability,
	}
	if len(bits) != len(gpu.ClockEventReasons) {
		t.Errorf("%d reasons, NVML has %d", len(gpu.ClockEventReasons), len(bits))
	}
	for i, r := range gpu.ClockEventReasons {
		if bits[r] != 1<<i {
			t.Errorf("reason %d %q is NVML's bit %#x", i, r, bits[r])
		}
	}
	dev := newDevice("GPU-0")
	dev.GetFieldValuesFunc = func(values []gonvml.FieldValue) gonvml.Return {
		for i := range values {
			values[i].ValueType, values[i].NvmlReturn = uint32(gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG), 0
		}
		return gonvml.SUCCESS
	}
	lib := newLibrary(dev)
	lib.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return "580.95.05", gonvml.SUCCESS }
	var policies []string
	for _, v := range deviceByUUID(t, snapshot(t, newSource(t, lib)), "GPU-0").Health.Violations {
		policies = append(policies, v.Policy)
	}
	if !slices.Equal(policies, gpu.ViolationPolicies) {
		t.Errorf("violation policies read %v, want %v", policies, gpu.ViolationPolicies)
	}
}
