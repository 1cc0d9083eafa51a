//go:build linux && cgo

package nvml

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// The real go-nvml with a library path that does not exist behaves like a host without the driver.
func TestNewReportsMissingLibrary(t *testing.T) {
	_, err := New(Config{Library: gonvml.New(gonvml.WithLibraryPath("/nonexistent/libnvidia-ml.so.1"))})
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Fatalf("New = %v, want ErrLibraryNotFound", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, "libnvidia-ml.so.1") || !strings.Contains(msg, "install") ||
		!strings.Contains(msg, "mount") {
		t.Errorf("error %q should be one line naming the library and what to install or mount", msg)
	}
}

func TestNewInitFailures(t *testing.T) {
	for _, tc := range []struct {
		name         string
		init         func() gonvml.Return
		wantNotFound bool
		wantReturn   gonvml.Return
		wantFix      string // what the error tells the user to do
	}{
		{"library not found", func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }, true, 0, "install the NVIDIA driver"},
		{"dlopen panics", func() gonvml.Return { panic("dlopen failed") }, true, 0, "install the NVIDIA driver"},
		{"driver not loaded", func() gonvml.Return { return gonvml.ERROR_DRIVER_NOT_LOADED }, false, gonvml.ERROR_DRIVER_NOT_LOADED,
			gpu.FixDriverNotLoaded},
		{"no permission", func() gonvml.Return { return gonvml.ERROR_NO_PERMISSION }, false, gonvml.ERROR_NO_PERMISSION,
			"run privileged or with the NVIDIA runtime"},
		{"driver and library mismatch", func() gonvml.Return { return gonvml.ERROR_LIB_RM_VERSION_MISMATCH }, false,
			gonvml.ERROR_LIB_RM_VERSION_MISMATCH, gpu.FixVersionMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lib := newLibrary()
			lib.InitFunc = tc.init
			_, err := New(Config{Library: lib})
			if err == nil {
				t.Fatal("New succeeded")
			}
			if got := errors.Is(err, ErrLibraryNotFound); got != tc.wantNotFound {
				t.Errorf("errors.Is(%v, ErrLibraryNotFound) = %v, want %v", err, got, tc.wantNotFound)
			}
			if !tc.wantNotFound && !isReturn(err, tc.wantReturn) {
				t.Errorf("error %v does not wrap %v", err, tc.wantReturn)
			}
			if !strings.Contains(err.Error(), tc.wantFix) {
				t.Errorf("error %q does not say %q", err, tc.wantFix)
			}
			if len(lib.EventSetCreateCalls()) != 0 {
				t.Error("an event set was created although NVML did not initialize")
			}
		})
	}
}

func TestSnapshotReadsEveryField(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetFanSpeedFunc = func() (uint32, gonvml.Return) { return 30, gonvml.SUCCESS }
	s := newSource(t, newLibrary(dev))
	if s.Name() != "nvml" {
		t.Errorf("Name = %q", s.Name())
	}
	snap := snapshot(t, s)
	wantNoErrors(t, snap)
	if snap.DriverVersion != "550.54.15" || snap.CUDAVersion != "12.4" || !snap.Time.Equal(testNow) {
		t.Errorf("driver %q, CUDA %q, time %v", snap.DriverVersion, snap.CUDAVersion, snap.Time)
	}
	d := deviceByUUID(t, snap, "GPU-0")
	if d.Index != 0 || d.Name != "NVIDIA H100 80GB HBM3" || d.PCIBusID != "00000000:1A:00.0" || d.MIGMode != "disabled" {
		t.Errorf("identity = %d %q %q %q", d.Index, d.Name, d.PCIBusID, d.MIGMode)
	}
	// v2 memory: used excludes the driver's reservation.
	wantValue(t, "memory total", d.MemoryTotalBytes, 80*gib)
	wantValue(t, "memory used", d.MemoryUsedBytes, 2*gib)
	wantValue(t, "memory free", d.MemoryFreeBytes, 77*gib+gib/2)
	wantValue(t, "memory reserved", d.MemoryReservedBytes, gib/2)
	wantValue(t, "utilization", d.UtilizationRatio, 0.42)
	wantValue(t, "memory utilization", d.MemoryUtilizationRatio, 0.17)
	wantValue(t, "encoder utilization", d.EncoderUtilizationRatio, 0.03)
	wantValue(t, "decoder utilization", d.DecoderUtilizationRatio, 0.05)
	wantValue(t, "temperature", d.TemperatureCelsius, 45)
	wantValue(t, "power", d.PowerUsageWatts, 250.5)
	wantValue(t, "power limit", d.PowerLimitWatts, 700)
	wantValue(t, "energy", d.EnergyJoules, 123456.789)
	wantValue(t, "fan", d.FanSpeedRatio, 0.3)
	wantValue(t, "pstate", d.PerformanceState, 0)
	wantClocks := []gpu.Clock{
		{Name: "graphics", Hertz: 1980e6}, {Name: "sm", Hertz: 1980e6}, {Name: "memory", Hertz: 2619e6}, {Name: "video", Hertz: 1545e6},
	}
	if len(d.Clocks) != len(wantClocks) {
		t.Fatalf("clocks = %v", d.Clocks)
	}
	for i, c := range wantClocks {
		if d.Clocks[i] != c {
			t.Errorf("clock %d = %v, want %v", i, d.Clocks[i], c)
		}
	}
	wantECC := []gpu.ECCCount{{Type: "corrected", Count: 3}, {Type: "uncorrected", Count: 0}}
	if len(d.ECCErrors) != 2 || d.ECCErrors[0] != wantECC[0] || d.ECCErrors[1] != wantECC[1] {
		t.Errorf("ECC = %v, want %v", d.ECCErrors, wantECC)
	}
	if !d.ProcessesListed || len(d.Processes) != 0 || len(d.MIG) != 0 || len(d.XIDErrors) != 0 {
		t.Errorf("listed %v, processes %v, MIG %v, XID %v", d.ProcessesListed, d.Processes, d.MIG, d.XIDErrors)
	}
}

// Fields the GPU does not have are left out, not written as 0, and are not errors.
func TestUnsupportedFieldsAreAbsent(t *testing.T) {
	dev := newDevice("GPU-0")
	notSupported32 := func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	notSupported3 := func() (uint32, uint32, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED }
	dev.GetMigModeFunc = func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED }
	dev.GetEncoderUtilizationFunc = notSupported3
	dev.GetDecoderUtilizationFunc = notSupported3
	dev.GetPowerUsageFunc = notSupported32
	dev.GetEnforcedPowerLimitFunc = notSupported32
	dev.GetTotalEnergyConsumptionFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	dev.GetPerformanceStateFunc = func() (gonvml.Pstates, gonvml.Return) { return gonvml.PSTATE_UNKNOWN, gonvml.SUCCESS }
	dev.GetTotalEccErrorsFunc = func(gonvml.MemoryErrorType, gonvml.EccCounterType) (uint64, gonvml.Return) {
		return 0, gonvml.ERROR_NOT_SUPPORTED
	}
	dev.GetClockInfoFunc = func(t gonvml.ClockType) (uint32, gonvml.Return) {
		if t == gonvml.CLOCK_VIDEO {
			return 0, gonvml.ERROR_NOT_SUPPORTED
		}
		return 1000, gonvml.SUCCESS
	}
	dev.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		return nil, gonvml.ERROR_NOT_SUPPORTED
	}
	dev.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		return []gonvml.ProcessInfo{{Pid: 7, UsedGpuMemory: gib, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}}, gonvml.SUCCESS
	}
	snap := snapshot(t, newSource(t, newLibrary(dev)))
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-0")
	if d.MIGMode != "" {
		t.Errorf("MIGMode = %q, want empty for a GPU without MIG", d.MIGMode)
	}
	wantAbsent(t, "fan", d.FanSpeedRatio)
	wantAbsent(t, "encoder", d.EncoderUtilizationRatio)
	wantAbsent(t, "decoder", d.DecoderUtilizationRatio)
	wantAbsent(t, "power", d.PowerUsageWatts)
	wantAbsent(t, "power limit", d.PowerLimitWatts)
	wantAbsent(t, "energy", d.EnergyJoules)
	wantAbsent(t, "pstate", d.PerformanceState)
	if len(d.ECCErrors) != 0 {
		t.Errorf("ECC = %v, want none", d.ECCErrors)
	}
	if len(d.Clocks) != 3 {
		t.Errorf("clocks = %v, want graphics, sm and memory only", d.Clocks)
	}
	if len(d.Processes) != 1 {
		t.Fatalf("processes = %v", d.Processes)
	}
	p := d.Processes[0]
	wantValue(t, "process memory", p.UsedMemoryBytes, gib)
	wantAbsent(t, "process SM utilization", p.SMUtilizationRatio)
	wantAbsent(t, "process memory utilization", p.MemoryUtilizationRatio)
}

// A field that fails for another reason than "not supported" is absent and reported, and the rest of the GPU is
// still read.
func TestFieldErrorIsReportedAndDeviceKept(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
	dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) { return gonvml.Memory_v2{}, gonvml.ERROR_TIMEOUT }
	dev.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{}, gonvml.ERROR_TIMEOUT }
	s := newSource(t, newLibrary(dev))
	for range 2 { // the second snapshot reports the failures again (self-metrics count them), logging only once
		snap := snapshot(t, s)
		d := deviceByUUID(t, snap, "GPU-0")
		wantAbsent(t, "temperature", d.TemperatureCelsius)
		wantAbsent(t, "memory total", d.MemoryTotalBytes)
		wantValue(t, "power", d.PowerUsageWatts, 250.5)
		if e, ok := findError(snap, 0, "temperature"); !ok || e.UUID != "GPU-0" || !isReturn(e.Err, gonvml.ERROR_UNKNOWN) {
			t.Errorf("temperature error = %+v (found %v), errors %v", e, ok, snap.Errors)
		}
		if e, ok := findError(snap, 0, gpu.OpMemory); !ok || !isReturn(e.Err, gonvml.ERROR_TIMEOUT) {
			t.Errorf("memory error = %+v (found %v)", e, ok)
		}
		if len(snap.Errors) != 2 {
			t.Errorf("errors = %v, want 2", snap.Errors)
		}
	}
}

// A driver before R510 has no nvmlDeviceGetMemoryInfo_v2; go-nvml would die calling it ("symbol lookup error"),
// so v2 is never called and v1, whose "used" includes the driver's reservation, is read instead.
func TestMemoryV1WhereDriverLacksV2(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) {
		t.Error("GetMemoryInfo_v2 called although the driver lacks nvmlDeviceGetMemoryInfo_v2")
		return gonvml.Memory_v2{}, gonvml.ERROR_UNKNOWN
	}
	snap := snapshot(t, newSource(t, withoutSymbols(newLibrary(dev), "nvmlDeviceGetMemoryInfo_v2")))
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-0")
	wantValue(t, "memory used", d.MemoryUsedBytes, 2*gib+gib/2)
	wantValue(t, "memory total", d.MemoryTotalBytes, 80*gib)
	wantAbsent(t, "memory reserved (v1 does not tell)", d.MemoryReservedBytes)
}

// A device that answers NOT_SUPPORTED to v2 is read with v1; a v2 that fails otherwise is an error, not a silent
// switch to v1, whose "used" is larger by the reservation.
func TestMemoryV2Failures(t *testing.T) {
	for _, tc := range []struct {
		ret      gonvml.Return
		wantUsed bool
	}{{gonvml.ERROR_NOT_SUPPORTED, true}, {gonvml.ERROR_UNKNOWN, false}} {
		t.Run(tc.ret.String(), func(t *testing.T) {
			dev := newDevice("GPU-0")
			dev.GetMemoryInfo_v2Func = func() (gonvml.Memory_v2, gonvml.Return) { return gonvml.Memory_v2{}, tc.ret }
			snap := snapshot(t, newSource(t, newLibrary(dev)))
			d := deviceByUUID(t, snap, "GPU-0")
			_, failed := findError(snap, 0, gpu.OpMemory)
			if tc.wantUsed {
				wantValue(t, "memory used from v1", d.MemoryUsedBytes, 2*gib+gib/2)
				wantNoErrors(t, snap)
			} else {
				wantAbsent(t, "memory used", d.MemoryUsedBytes)
				if !failed || len(dev.GetMemoryInfoCalls()) != 0 {
					t.Errorf("memory error reported %v, v1 calls %d; want an error and no v1 call", failed, len(dev.GetMemoryInfoCalls()))
				}
			}
		})
	}
}

// One GPU that falls off the bus is reported and left out; the other is still exported.
func TestLostGPUIsSkippedOthersExport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		break1   func(d *mock.Device, lib *mock.Interface, good *mock.Device)
		wantUUID string
	}{
		{"lost during a field read", func(d *mock.Device, _ *mock.Interface, _ *mock.Device) {
			d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST }
		}, "GPU-1"},
		{"lost when listing processes", func(d *mock.Device, _ *mock.Interface, _ *mock.Device) {
			d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_GPU_IS_LOST }
		}, "GPU-1"},
		{"handle lost", func(_ *mock.Device, lib *mock.Interface, good *mock.Device) {
			lib.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
				if i == 1 {
					return nil, gonvml.ERROR_GPU_IS_LOST
				}
				return good, gonvml.SUCCESS
			}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good, bad := newDevice("GPU-0"), newDevice("GPU-1")
			lib := &mock.Interface{}
			tc.break1(bad, lib, good)
			stubLibrary(lib, good, bad)
			snap := snapshot(t, newSource(t, lib))
			if len(snap.Devices) != 1 || snap.Devices[0].UUID != "GPU-0" {
				t.Fatalf("devices = %+v, want only GPU-0", snap.Devices)
			}
			wantValue(t, "GPU-0 power", snap.Devices[0].PowerUsageWatts, 250.5)
			if len(snap.Errors) != 1 {
				t.Fatalf("errors = %v, want one", snap.Errors)
			}
			e := snap.Errors[0]
			if e.Index != 1 || e.UUID != tc.wantUUID || e.Operation != "device" || !isReturn(e.Err, gonvml.ERROR_GPU_IS_LOST) {
				t.Errorf("error = %+v", e)
			}
		})
	}
}

func TestSnapshotFailsWithoutDeviceCount(t *testing.T) {
	lib := newLibrary()
	lib.DeviceGetCountFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
	if _, err := newSource(t, lib).Snapshot(context.Background()); !isReturn(err, gonvml.ERROR_UNKNOWN) {
		t.Fatalf("Snapshot = %v, want ERROR_UNKNOWN", err)
	}
}

func TestSnapshotStopsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	first := newDevice("GPU-0")
	// The first device's last read cancels the context: the second device must not be read.
	first.GetMPSComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		cancel()
		return nil, gonvml.SUCCESS
	}
	second := newDevice("GPU-1")
	s := newSource(t, newLibrary(first, second))
	if _, err := s.Snapshot(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Snapshot = %v, want context.Canceled", err)
	}
	if n := len(second.GetUUIDCalls()); n != 0 {
		t.Errorf("second GPU was read (%d UUID calls) after the context ended", n)
	}
}

// go-nvml's DGX H100 mock server: eight GPUs, whose mock answers only the v1 memory call, read as on a driver
// without v2.
func TestSnapshotOfDGXH100(t *testing.T) {
	srv := dgxh100.New()
	for _, d := range srv.Devices {
		stubDevice(&d.(*server.Device).Device, "unused") // the server sets GetUUID
	}
	withoutSymbols(stubLibrary(&srv.Interface, srv.Devices...), "nvmlDeviceGetMemoryInfo_v2")
	snap := snapshot(t, newSource(t, srv))
	wantNoErrors(t, snap)
	if snap.DriverVersion != "550.54.15" || snap.CUDAVersion != "12.4" {
		t.Errorf("driver %q CUDA %q", snap.DriverVersion, snap.CUDAVersion)
	}
	if len(snap.Devices) != 8 {
		t.Fatalf("%d devices, want 8", len(snap.Devices))
	}
	uuids := map[string]bool{}
	for i, d := range snap.Devices {
		want := srv.Devices[i].(*server.Device)
		if d.Index != i || d.UUID != want.UUID || !strings.HasPrefix(d.UUID, "GPU-") || d.Name != "NVIDIA H100 80GB HBM3" {
			t.Errorf("device %d = %d %q %q", i, d.Index, d.UUID, d.Name)
		}
		wantValue(t, "memory total", d.MemoryTotalBytes, float64(want.MemoryInfo.Total))
		if d.MIGMode != "disabled" {
			t.Errorf("device %d MIG mode %q", i, d.MIGMode)
		}
		uuids[d.UUID] = true
	}
	if len(uuids) != 8 {
		t.Errorf("UUIDs not distinct: %v", uuids)
	}
}

func TestFormatCUDAVersion(t *testing.T) {
	for v, want := range map[int]string{12040: "12.4", 11080: "11.8", 13000: "13.0", 12090: "12.9"} {
		if got := formatCUDAVersion(v); got != want {
			t.Errorf("formatCUDAVersion(%d) = %q, want %q", v, got, want)
		}
	}
}

// go-nvml's GetProcessUtilization slices its buffer by the count of the driver's second answer, which panics when
// processes started between its two calls (go-nvml#11, #27). That costs the utilization of that GPU, not its
// memory, the other GPUs or the exporter. A panic anywhere else costs that one GPU.
func TestPanicInGoNVMLCostsOneReading(t *testing.T) {
	t.Run("process utilization", func(t *testing.T) {
		dev0, dev1 := newDevice("GPU-0"), newDevice("GPU-1")
		dev0.GetComputeRunningProcessesFunc = procs(proc(10, gib))
		dev0.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
			s := make([]gonvml.ProcessUtilizationSample, 1)
			n := 3
			return s[:n], gonvml.SUCCESS // what go-nvml does: slice bounds out of range
		}
		snap := snapshot(t, newSource(t, newLibrary(dev0, dev1)))
		d := deviceByUUID(t, snap, "GPU-0")
		wantValue(t, "GPU-0 memory", d.MemoryUsedBytes, 2*gib)
		p := processByPID(t, d, 10)
		wantValue(t, "process memory", p.UsedMemoryBytes, gib)
		wantAbsent(t, "process SM utilization", p.SMUtilizationRatio)
		if e, ok := findError(snap, 0, gpu.OpProcessUtilization); !ok || !strings.Contains(e.Error(), "panicked") {
			t.Errorf("process_utilization error = %v (found %v)", e, ok)
		}
		wantValue(t, "GPU-1 power", deviceByUUID(t, snap, "GPU-1").PowerUsageWatts, 250.5)
	})
	t.Run("elsewhere", func(t *testing.T) {
		dev0, dev1 := newDevice("GPU-0"), newDevice("GPU-1")
		dev0.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { panic("boom") }
		snap := snapshot(t, newSource(t, newLibrary(dev0, dev1)))
		if len(snap.Devices) != 1 || snap.Devices[0].UUID != "GPU-1" {
			t.Errorf("devices = %+v, want GPU-1 only", snap.Devices)
		}
		if e, ok := findError(snap, 0, gpu.OpDevice); !ok || !strings.Contains(e.Error(), "boom") {
			t.Errorf("device error = %v (found %v)", e, ok)
		}
	})
}

// Close must not shut NVML down under a reading still in progress (a scrape that timed out lets it run on): that
// unloads the code the reading runs in. It waits for the reading; later snapshots fail instead of calling NVML.
func TestCloseWaitsForReadingInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev := newDevice("GPU-0")
		release := make(chan struct{})
		dev.GetPowerUsageFunc = func() (uint32, gonvml.Return) {
			<-release
			return 1000, gonvml.SUCCESS
		}
		lib := newLibrary(dev)
		s, err := New(Config{Library: lib})
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = s.Snapshot(context.Background()) }()
		synctest.Wait() // the reading is inside GetPowerUsage
		closed := make(chan error)
		go func() { closed <- s.Close() }()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := len(lib.ShutdownCalls()); n != 0 {
			t.Fatalf("Shutdown called %d times while a reading was in progress", n)
		}
		close(release)
		if err := <-closed; err != nil {
			t.Fatalf("Close = %v", err)
		}
		if n := len(lib.ShutdownCalls()); n != 1 {
			t.Errorf("Shutdown called %d times, want 1", n)
		}
		if _, err := s.Snapshot(context.Background()); !errors.Is(err, errClosed) {
			t.Errorf("Snapshot after Close = %v, want errClosed", err)
		}
	})
}

// A reading stuck in the driver does not hold the process's exit forever: after closeWait, Close gives up and
// leaves NVML loaded rather than unloading it under the reading.
func TestCloseGivesUpOnStuckReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev := newDevice("GPU-0")
		release := make(chan struct{})
		dev.GetPowerUsageFunc = func() (uint32, gonvml.Return) {
			<-release
			return 1000, gonvml.SUCCESS
		}
		lib := newLibrary(dev)
		s, err := New(Config{Library: lib})
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = s.Snapshot(context.Background()) }()
		synctest.Wait()
		start := time.Now()
		if err := s.Close(); err == nil || !strings.Contains(err.Error(), "left loaded") {
			t.Errorf("Close = %v, want an error saying NVML was left loaded", err)
		}
		if d := time.Since(start); d != defaultCloseWait {
			t.Errorf("Close took %v, want %v", d, defaultCloseWait)
		}
		if n := len(lib.ShutdownCalls()); n != 0 {
			t.Errorf("Shutdown called %d times under a stuck reading", n)
		}
		close(release)
		synctest.Wait()
		if _, err := s.Snapshot(context.Background()); !errors.Is(err, errClosed) {
			t.Errorf("Snapshot after Close = %v, want errClosed", err)
		}
	})
}

// After the driver is unloaded and loaded again (a GPU reset, a fabric manager restart), NVML answers
// DRIVER_NOT_LOADED or UNINITIALIZED until it is initialized again. After reinitAfter such readings in a row the
// source re-initializes, retrying with a backoff, and reads again.
func TestReinitializesAfterDriverReload(t *testing.T) {
	lib := newLibrary(newDevice("GPU-0"))
	driver := gonvml.SUCCESS
	initialized := false
	lib.InitFunc = func() gonvml.Return {
		if driver != gonvml.SUCCESS {
			return gonvml.ERROR_DRIVER_NOT_LOADED
		}
		initialized = true
		return gonvml.SUCCESS
	}
	lib.ShutdownFunc = func() gonvml.Return { initialized = false; return gonvml.SUCCESS }
	lib.DeviceGetCountFunc = func() (int, gonvml.Return) {
		switch {
		case driver != gonvml.SUCCESS:
			return 0, driver
		case !initialized:
			return 0, gonvml.ERROR_UNINITIALIZED
		}
		return 1, gonvml.SUCCESS
	}
	now := testNow
	s, err := New(Config{Library: lib, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	driver = gonvml.ERROR_DRIVER_NOT_LOADED // the driver is unloaded
	read := func() error {
		now = now.Add(time.Second)
		_, err := s.Snapshot(context.Background())
		return err
	}
	for i := range reinitAfter - 1 {
		if err := read(); !isReturn(err, gonvml.ERROR_DRIVER_NOT_LOADED) {
			t.Fatalf("reading %d = %v", i, err)
		}
	}
	if n := len(lib.InitCalls()); n != 1 {
		t.Fatalf("Init called %d times before the failures were persistent", n)
	}
	if err := read(); err == nil || len(lib.InitCalls()) != 2 {
		t.Fatalf("reading = %v with the driver still gone, Init calls %d; want a failed re-initialization", err, len(lib.InitCalls()))
	}
	if err := read(); err == nil || len(lib.InitCalls()) != 2 {
		t.Fatalf("re-initialized again within the backoff (Init calls %d)", len(lib.InitCalls()))
	}
	driver = gonvml.SUCCESS // loaded again; NVML still answers UNINITIALIZED until Init
	now = now.Add(minReinitBackoff)
	if err := read(); err != nil {
		t.Fatalf("reading after the driver came back = %v", err)
	}
	if n := len(lib.InitCalls()); n != 3 {
		t.Errorf("Init called %d times, want 3", n)
	}
	if err := read(); err != nil {
		t.Errorf("next reading = %v", err)
	}
}

// fakeSource is a gpu.Source that answers a fixed snapshot, as a process fallback.
type fakeSource struct {
	snap   *gpu.Snapshot
	err    error
	calls  int
	closed bool
}

func (f *fakeSource) Name() string { return "nvidia-smi" }
func (f *fakeSource) Snapshot(context.Context) (*gpu.Snapshot, error) {
	f.calls++
	return f.snap, f.err
}
func (f *fakeSource) Close() error { f.closed = true; return nil }

// With a process fallback (nvidia-smi under --gpu.source=auto), a GPU whose list NVML cannot read takes its list
// from the fallback, matched by UUID, and its NVML process error is dropped; that is logged once. The fallback is
// not run while NVML lists every GPU, and its failure is an error of its own that keeps NVML's. Close closes it.
func TestProcessFallback(t *testing.T) {
	broken, fine := newDevice("GPU-0"), newDevice("GPU-1")
	listFails := true
	broken.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		if listFails {
			return nil, gonvml.ERROR_UNKNOWN
		}
		return nil, gonvml.SUCCESS
	}
	fallback := &fakeSource{snap: &gpu.Snapshot{Devices: []gpu.Device{
		{UUID: "GPU-1", ProcessesListed: true, Processes: []gpu.Process{{PID: 99}}},
		{UUID: "GPU-0", ProcessesListed: true, Processes: []gpu.Process{{PID: 7, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(gib)}}},
	}}}
	var logs strings.Builder
	s, err := New(Config{Library: newLibrary(broken, fine), Now: func() time.Time { return testNow },
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), ProcessFallback: fallback})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		snap := snapshot(t, s)
		wantNoErrors(t, snap)
		d := deviceByUUID(t, snap, "GPU-0")
		if !d.ProcessesListed || len(d.Processes) != 1 || d.Processes[0].PID != 7 {
			t.Errorf("GPU 0 processes %+v (listed %v), want the fallback's PID 7", d.Processes, d.ProcessesListed)
		}
		if d := deviceByUUID(t, snap, "GPU-1"); !d.ProcessesListed || len(d.Processes) != 0 {
			t.Errorf("GPU 1 processes %+v, want NVML's (none)", d.Processes)
		}
	}
	if n := strings.Count(logs.String(), "listing them with nvidia-smi"); n != 1 {
		t.Errorf("fallback logged %d times, want once:\n%s", n, logs.String())
	}

	fallback.err = errors.New("nvidia-smi run timed out")
	snap := snapshot(t, s)
	if _, ok := findError(snap, 0, gpu.OpProcesses); !ok {
		t.Errorf("errors %v: want NVML's processes error of GPU 0 kept", snap.Errors)
	}
	if e, ok := findError(snap, -1, gpu.OpProcesses); !ok || !strings.Contains(e.Error(), "nvidia-smi run timed out") {
		t.Errorf("errors %v: want the fallback's failure", snap.Errors)
	}

	listFails = false
	calls := fallback.calls
	wantNoErrors(t, snapshot(t, s))
	if fallback.calls != calls {
		t.Error("fallback run although NVML listed every GPU")
	}
	if err := s.Close(); err != nil || !fallback.closed {
		t.Errorf("Close = %v, fallback closed %v", err, fallback.closed)
	}
}
