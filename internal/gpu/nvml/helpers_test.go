//go:build linux && cgo

package nvml

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// testNow is the fixed clock of the tests.
var testNow = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

const gib = 1 << 30

// setIfNil sets a mock function field unless the test (or go-nvml's mock server) already set it.
func setIfNil[F any](field *F, f F) {
	if reflect.ValueOf(*field).IsNil() {
		*field = f
	}
}

// stubDevice fills every mock function the source calls with a healthy H100 that runs no processes and has no fan,
// keeping functions already set.
func stubDevice(d *mock.Device, uuid string) *mock.Device {
	setIfNil(&d.GetUUIDFunc, func() (string, gonvml.Return) { return uuid, gonvml.SUCCESS })
	setIfNil(&d.GetNameFunc, func() (string, gonvml.Return) { return "NVIDIA H100 80GB HBM3", gonvml.SUCCESS })
	setIfNil(&d.GetPciInfoFunc, func() (gonvml.PciInfo, gonvml.Return) {
		var p gonvml.PciInfo
		for i, c := range "00000000:1A:00.0" {
			p.BusId[i] = int8(c)
		}
		return p, gonvml.SUCCESS
	})
	setIfNil(&d.GetMigModeFunc, func() (int, int, gonvml.Return) { return 0, 0, gonvml.SUCCESS })
	setIfNil(&d.GetMinorNumberFunc, func() (int, gonvml.Return) { return 0, gonvml.SUCCESS })
	setIfNil(&d.GetMemoryInfo_v2Func, func() (gonvml.Memory_v2, gonvml.Return) {
		return gonvml.Memory_v2{Total: 80 * gib, Reserved: gib / 2, Used: 2 * gib, Free: 77*gib + gib/2}, gonvml.SUCCESS
	})
	setIfNil(&d.GetMemoryInfoFunc, func() (gonvml.Memory, gonvml.Return) {
		return gonvml.Memory{Total: 80 * gib, Used: 2*gib + gib/2, Free: 77*gib + gib/2}, gonvml.SUCCESS
	})
	setIfNil(&d.GetUtilizationRatesFunc, func() (gonvml.Utilization, gonvml.Return) {
		return gonvml.Utilization{Gpu: 42, Memory: 17}, gonvml.SUCCESS
	})
	setIfNil(&d.GetEncoderUtilizationFunc, func() (uint32, uint32, gonvml.Return) { return 3, 167000, gonvml.SUCCESS })
	setIfNil(&d.GetDecoderUtilizationFunc, func() (uint32, uint32, gonvml.Return) { return 5, 167000, gonvml.SUCCESS })
	setIfNil(&d.GetTemperatureFunc, func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 45, gonvml.SUCCESS })
	setIfNil(&d.GetPowerUsageFunc, func() (uint32, gonvml.Return) { return 250500, gonvml.SUCCESS })
	setIfNil(&d.GetEnforcedPowerLimitFunc, func() (uint32, gonvml.Return) { return 700000, gonvml.SUCCESS })
	setIfNil(&d.GetTotalEnergyConsumptionFunc, func() (uint64, gonvml.Return) { return 123456789, gonvml.SUCCESS })
	setIfNil(&d.GetFanSpeedFunc, func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED })
	setIfNil(&d.GetPerformanceStateFunc, func() (gonvml.Pstates, gonvml.Return) { return gonvml.PSTATE_0, gonvml.SUCCESS })
	setIfNil(&d.GetClockInfoFunc, func(t gonvml.ClockType) (uint32, gonvml.Return) {
		return map[gonvml.ClockType]uint32{
			gonvml.CLOCK_GRAPHICS: 1980, gonvml.CLOCK_SM: 1980, gonvml.CLOCK_MEM: 2619, gonvml.CLOCK_VIDEO: 1545,
		}[t], gonvml.SUCCESS
	})
	setIfNil(&d.GetTotalEccErrorsFunc, func(t gonvml.MemoryErrorType, c gonvml.EccCounterType) (uint64, gonvml.Return) {
		if c != gonvml.AGGREGATE_ECC {
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		if t == gonvml.MEMORY_ERROR_TYPE_CORRECTED {
			return 3, gonvml.SUCCESS
		}
		return 0, gonvml.SUCCESS
	})
	setIfNil(&d.GetFieldValuesFunc, func(values []gonvml.FieldValue) gonvml.Return {
		for i := range values {
			values[i].NvmlReturn = uint32(healthyField(&values[i]))
		}
		return gonvml.SUCCESS
	})
	setIfNil(&d.GetPowerManagementLimitFunc, func() (uint32, gonvml.Return) { return 700000, gonvml.SUCCESS })
	setIfNil(&d.GetPcieReplayCounterFunc, func() (int, gonvml.Return) { return 0, gonvml.SUCCESS })
	setIfNil(&d.GetCurrPcieLinkGenerationFunc, func() (int, gonvml.Return) { return 5, gonvml.SUCCESS })
	setIfNil(&d.GetMaxPcieLinkGenerationFunc, func() (int, gonvml.Return) { return 5, gonvml.SUCCESS })
	setIfNil(&d.GetCurrPcieLinkWidthFunc, func() (int, gonvml.Return) { return 16, gonvml.SUCCESS })
	setIfNil(&d.GetMaxPcieLinkWidthFunc, func() (int, gonvml.Return) { return 16, gonvml.SUCCESS })
	idle := func() (uint64, gonvml.Return) { return gonvml.ClocksEventReasonGpuIdle, gonvml.SUCCESS }
	supported := func() (uint64, gonvml.Return) { return 0xFF, gonvml.SUCCESS }
	setIfNil(&d.GetCurrentClocksEventReasonsFunc, idle)
	setIfNil(&d.GetSupportedClocksEventReasonsFunc, supported)
	setIfNil(&d.GetCurrentClocksThrottleReasonsFunc, idle)
	setIfNil(&d.GetSupportedClocksThrottleReasonsFunc, supported)
	setIfNil(&d.GetGridLicensableFeaturesFunc, func() (gonvml.GridLicensableFeatures, gonvml.Return) {
		return gonvml.GridLicensableFeatures{}, gonvml.SUCCESS
	})
	setIfNil(&d.GpmQueryDeviceSupportFunc, func() (gonvml.GpmSupport, gonvml.Return) {
		return gonvml.GpmSupport{Version: 1}, gonvml.SUCCESS // no GPM unless a test gives it
	})
	noProcs := func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.SUCCESS }
	setIfNil(&d.GetComputeRunningProcessesFunc, noProcs)
	setIfNil(&d.GetGraphicsRunningProcessesFunc, noProcs)
	setIfNil(&d.GetMPSComputeRunningProcessesFunc, noProcs)
	setIfNil(&d.GetProcessUtilizationFunc, func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		return nil, gonvml.ERROR_NOT_FOUND
	})
	setIfNil(&d.GetSupportedEventTypesFunc, func() (uint64, gonvml.Return) {
		return gonvml.EventTypeXidCriticalError | gonvml.EventTypeSingleBitEccError, gonvml.SUCCESS
	})
	setIfNil(&d.RegisterEventsFunc, func(uint64, gonvml.EventSet) gonvml.Return { return gonvml.SUCCESS })
	return d
}

// healthyField answers one field value of a healthy H100 without NVLinks: 45 °C memory, nothing remapped, no
// violation time, no recovery action; retired pages are not supported (Ampere and newer remap rows instead).
func healthyField(v *gonvml.FieldValue) gonvml.Return {
	v.ValueType = uint32(gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
	v.Value = [8]byte{}
	switch v.FieldId {
	case gonvml.FI_DEV_MEMORY_TEMP:
		v.ValueType = uint32(gonvml.VALUE_TYPE_UNSIGNED_INT)
		v.Value[0] = 45
	case gonvml.FI_DEV_RETIRED_SBE, gonvml.FI_DEV_RETIRED_DBE, gonvml.FI_DEV_RETIRED_PENDING:
		return gonvml.ERROR_NOT_SUPPORTED
	}
	return gonvml.SUCCESS
}

// newDevice is a healthy H100 with the given UUID.
func newDevice(uuid string) *mock.Device { return stubDevice(&mock.Device{}, uuid) }

// stubLibrary fills the library functions the source calls, keeping functions already set. By default there is no
// event set, so no XID goroutine runs; XID tests set EventSetCreateFunc.
func stubLibrary(l *mock.Interface, devices ...gonvml.Device) *mock.Interface {
	setIfNil(&l.InitFunc, func() gonvml.Return { return gonvml.SUCCESS })
	setIfNil(&l.ShutdownFunc, func() gonvml.Return { return gonvml.SUCCESS })
	setIfNil(&l.SystemGetDriverVersionFunc, func() (string, gonvml.Return) { return "550.54.15", gonvml.SUCCESS })
	setIfNil(&l.SystemGetCudaDriverVersionFunc, func() (int, gonvml.Return) { return 12040, gonvml.SUCCESS })
	setIfNil(&l.DeviceGetCountFunc, func() (int, gonvml.Return) { return len(devices), gonvml.SUCCESS })
	setIfNil(&l.DeviceGetHandleByIndexFunc, func(i int) (gonvml.Device, gonvml.Return) {
		if i < 0 || i >= len(devices) {
			return nil, gonvml.ERROR_INVALID_ARGUMENT
		}
		return devices[i], gonvml.SUCCESS
	})
	setIfNil(&l.EventSetCreateFunc, func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED })
	setIfNil(&l.SystemGetProcessNameFunc, func(pid int) (string, gonvml.Return) { return "python3", gonvml.SUCCESS })
	setIfNil(&l.ExtensionsFunc, func() gonvml.ExtendedInterface { return symbolTable() })
	return l
}

// symbolTable is a library's LookupSymbol as go-nvml answers it: nil for a symbol the library has, an error for
// one it lacks. Every symbol is present except the missing ones and the versioned fabric information, whose
// go-nvml call cannot be mocked (fabric tests replace Source.fabricRead and give the symbol).
func symbolTable(missing ...string) *mock.ExtendedInterface {
	return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error {
		if name == symFabricInfoV || slices.Contains(missing, name) {
			return fmt.Errorf("undefined symbol: %s", name)
		}
		return nil
	}}
}

// withoutSymbols makes lib a library that lacks the named functions, as an older driver does.
func withoutSymbols(lib *mock.Interface, missing ...string) *mock.Interface {
	lib.ExtensionsFunc = func() gonvml.ExtendedInterface { return symbolTable(missing...) }
	return lib
}

func newLibrary(devices ...gonvml.Device) *mock.Interface {
	return stubLibrary(&mock.Interface{}, devices...)
}

// newSource starts a source on lib with the test clock and fails the test if that fails.
func newSource(t *testing.T, lib gonvml.Interface) *Source {
	t.Helper()
	s, err := New(Config{Library: lib, Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// snapshot takes one snapshot and fails the test if that fails.
func snapshot(t *testing.T, s *Source) *gpu.Snapshot {
	t.Helper()
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return snap
}

// deviceByUUID finds a device in a snapshot.
func deviceByUUID(t *testing.T, snap *gpu.Snapshot, uuid string) gpu.Device {
	t.Helper()
	for _, d := range snap.Devices {
		if d.UUID == uuid {
			return d
		}
	}
	t.Fatalf("device %s not in snapshot (devices: %d, errors: %v)", uuid, len(snap.Devices), snap.Errors)
	return gpu.Device{}
}

func wantValue(t *testing.T, what string, got gpu.Value, want float64) {
	t.Helper()
	if !got.Valid || got.V != want {
		t.Errorf("%s = %+v, want %v", what, got, want)
	}
}

func wantAbsent(t *testing.T, what string, got gpu.Value) {
	t.Helper()
	if got.Valid {
		t.Errorf("%s = %v, want absent (Valid=false)", what, got.V)
	}
}

// findError returns the snapshot error of one device and operation.
func findError(snap *gpu.Snapshot, index int, op gpu.Operation) (gpu.DeviceError, bool) {
	for _, e := range snap.Errors {
		if e.Index == index && e.Operation == op {
			return e, true
		}
	}
	return gpu.DeviceError{}, false
}

func wantNoErrors(t *testing.T, snap *gpu.Snapshot) {
	t.Helper()
	if len(snap.Errors) != 0 {
		t.Errorf("Errors = %v, want none", snap.Errors)
	}
}

// isReturn reports whether err wraps the NVML return code.
func isReturn(err error, ret gonvml.Return) bool { return errors.Is(err, ret) }
