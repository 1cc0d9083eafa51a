//go:build linux && cgo

package nvml

// Tests through go-nvml's real dlopen path, against the stub libnvidia-ml.so.1 of package stubnvml that gcc builds
// here. They catch what go-nvml's mocks cannot: a symbol the driver lacks (the process dies with "symbol lookup
// error"), a struct the driver writes with another layout, and go-nvml's own wrappers. go-nvml binds NVML's
// functions once per process, so each case runs in a child process: this test binary, re-run with
// stubChildEnv set, runs TestStubChild, which writes what it read as JSON.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvml/stubnvml"
)

const (
	stubChildEnv    = "GPE_NVML_STUB_CHILD"    // the scenario the child runs
	stubLibEnv      = "GPE_NVML_STUB_LIB"      // the stub library's path
	stubOutEnv      = "GPE_NVML_STUB_OUT"      // where the child writes its result
	stubReadingsEnv = "GPE_NVML_STUB_READINGS" // snapshots the "snapshot" scenario takes, one second apart
	stubStormEnv    = "GPE_NVML_STUB_STORM"    // how long the "xid storm" scenario watches the storm
)

// stubResult is what a child read.
type stubResult struct {
	DriverVersion string
	// Readings are the devices of each snapshot, in order.
	Readings [][]gpu.Device
	Errors   []stubError
	// Processes is what go-nvml itself returned for GPU 0's compute processes (scenario "go-nvml processes").
	Processes []gonvml.ProcessInfo
	GPM       stubGPM
	// Report is what the stub wrote at nvmlShutdown: its call count, the XIDs it reported and the GPM samples still
	// allocated.
	Report string
	Storm  stubStorm
}

// stubStorm is what the XID watcher did in an XID storm (scenario "xid storm").
type stubStorm struct {
	Seconds    float64 // how long it was watched
	WarnLines  int64   // the WARN lines logged meanwhile
	CPUSeconds float64 // the process's CPU time meanwhile, user and system
	Counted    uint64  // the XIDs counted, after Close
}

// stubGPM is what go-nvml alone computed from two GPM samples of GPU 0 (scenario "go-nvml gpm").
type stubGPM struct {
	SupportReturn  gonvml.Return
	Supported      uint32
	InOrder        float64   // graphics engine activity, older sample first
	Reversed       float64   // the same, newer sample first
	OnePerCall     []float64 // gpmMetrics, one nvmlGpmMetricsGet call each
	AllInOneCall   []float64 // gpmMetrics, in one call
	OnePerCallRets []gonvml.Return
}

type stubError struct {
	Index     int
	UUID      string
	Operation string
	Message   string
	Lost      bool
}

// runStub runs scenario in a child process against lib with the extra environment, and returns what it read; the
// child's exit status and output are returned too, for the cases that expect it to die.
func runStub(t *testing.T, lib, scenario string, env ...string) (stubResult, error, string) {
	t.Helper()
	dir := t.TempDir()
	outFile, reportFile := filepath.Join(dir, "result.json"), filepath.Join(dir, "report")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStubChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), stubChildEnv+"="+scenario, stubLibEnv+"="+lib, stubOutEnv+"="+outFile,
		"STUB_NVML_REPORT="+reportFile)
	cmd.Env = append(cmd.Env, env...)
	output, runErr := cmd.CombinedOutput()
	var res stubResult
	if runErr == nil {
		b, err := os.ReadFile(outFile)
		if err != nil {
			t.Fatalf("child wrote no result: %v\n%s", err, output)
		}
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatalf("child result: %v", err)
		}
		report, _ := os.ReadFile(reportFile)
		res.Report = strings.TrimSpace(string(report))
	}
	return res, runErr, string(output)
}

// mustRunStub is runStub for children that must succeed.
func mustRunStub(t *testing.T, lib, scenario string, env ...string) stubResult {
	t.Helper()
	res, err, output := runStub(t, lib, scenario, env...)
	if err != nil {
		t.Fatalf("child %q failed: %v\n%s", scenario, err, output)
	}
	return res
}

// TestStubChild is the child side of the stub-library tests; it does nothing in a normal run.
func TestStubChild(t *testing.T) {
	scenario := os.Getenv(stubChildEnv)
	if scenario == "" {
		t.Skip("runs only as the child process of the stub-library tests")
	}
	lib := gonvml.New(gonvml.WithLibraryPath(os.Getenv(stubLibEnv)))
	var res stubResult
	switch scenario {
	case "snapshot", "xid":
		// The readings are one second apart on the source's clock, without waiting: GPM needs more than 100 ms
		// between samples, and a scrape must not wait for it.
		now := time.Now()
		s, err := New(Config{Library: lib, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		readings := 2
		if n := os.Getenv(stubReadingsEnv); n != "" {
			if readings, err = strconv.Atoi(n); err != nil {
				t.Fatal(err)
			}
		}
		var snap *gpu.Snapshot
		for i := 0; i < readings || (scenario == "xid" && !hasXID(snap, 79)); i++ {
			if scenario == "xid" && i > 0 {
				time.Sleep(50 * time.Millisecond) // the XID goroutine reports from the stub's event wait
				if i > 400 {
					t.Fatal("XID 79 was not counted")
				}
			}
			if snap, err = s.Snapshot(t.Context()); err != nil {
				t.Fatal(err)
			}
			res.add(snap)
			now = now.Add(time.Second)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	case "xid storm":
		res.Storm = watchStorm(t, lib)
	case "go-nvml processes":
		// go-nvml alone, as every program that uses it lists processes.
		h := stubGPU0(t, lib)
		var ret gonvml.Return
		if res.Processes, ret = h.GetComputeRunningProcesses(); ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
	case "go-nvml memory v2":
		_, ret := stubGPU0(t, lib).GetMemoryInfo_v2()
		t.Fatalf("GetMemoryInfo_v2 returned %v", ret)
	case "go-nvml gpm":
		res.GPM = goNVMLGPM(t, lib, stubGPU0(t, lib))
	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv(stubOutEnv), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// watchStorm runs the source, and so its XID watcher, through the stub's XID storm for GPE_NVML_STUB_STORM (2 s by
// default), logging as the exporter does (text, here to nowhere).
func watchStorm(t *testing.T, lib gonvml.Interface) stubStorm {
	d, err := time.ParseDuration(cmp.Or(os.Getenv(stubStormEnv), "2s"))
	if err != nil {
		t.Fatal(err)
	}
	warn := &warnCounter{Handler: slog.NewTextHandler(io.Discard, nil)}
	s, err := New(Config{Library: lib, Logger: slog.New(warn)})
	if err != nil {
		t.Fatal(err)
	}
	cpu := processCPUSeconds(t)
	time.Sleep(d)
	storm := stubStorm{Seconds: d.Seconds(), CPUSeconds: processCPUSeconds(t) - cpu, WarnLines: warn.n.Load()}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, x := range s.xid.countsOf("GPU-stub-0") {
		storm.Counted += x.Count
	}
	return storm
}

// warnCounter counts the WARN records its handler gets.
type warnCounter struct {
	slog.Handler
	n atomic.Int64
}

func (w *warnCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		w.n.Add(1)
	}
	return w.Handler.Handle(ctx, r)
}

func processCPUSeconds(t *testing.T) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func stubGPU0(t *testing.T, lib gonvml.Interface) gonvml.Device {
	t.Helper()
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	h, ret := lib.DeviceGetHandleByIndex(0)
	if ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	return h
}

// goNVMLGPM computes GPM metrics with go-nvml alone from two samples of h: in order and reversed, one metric per
// call and all in one call.
func goNVMLGPM(t *testing.T, lib gonvml.Interface, h gonvml.Device) stubGPM {
	var g stubGPM
	support, ret := h.GpmQueryDeviceSupport()
	g.SupportReturn, g.Supported = ret, support.IsSupportedDevice
	older, ret1 := lib.GpmSampleAlloc()
	newer, ret2 := lib.GpmSampleAlloc()
	if ret1 != gonvml.SUCCESS || ret2 != gonvml.SUCCESS {
		t.Fatal(ret1, ret2)
	}
	if ret1, ret2 = h.GpmSampleGet(older), h.GpmSampleGet(newer); ret1 != gonvml.SUCCESS || ret2 != gonvml.SUCCESS {
		t.Fatal(ret1, ret2)
	}
	get := func(a, b gonvml.GpmSample, ids ...gonvml.GpmMetricId) ([]float64, gonvml.Return) {
		req := &gonvml.GpmMetricsGetType{NumMetrics: uint32(len(ids)), Sample1: a, Sample2: b}
		for i, id := range ids {
			req.Metrics[i].MetricId = uint32(id)
		}
		ret := lib.GpmMetricsGet(req)
		var values []float64
		for i := range ids {
			values = append(values, req.Metrics[i].Value)
		}
		return values, ret
	}
	v, _ := get(older, newer, gonvml.GPM_METRIC_GRAPHICS_UTIL)
	g.InOrder = v[0]
	v, _ = get(newer, older, gonvml.GPM_METRIC_GRAPHICS_UTIL)
	g.Reversed = v[0]
	var ids []gonvml.GpmMetricId
	for _, m := range gpmMetrics {
		ids = append(ids, m.id)
		v, ret := get(older, newer, m.id)
		g.OnePerCall, g.OnePerCallRets = append(g.OnePerCall, v[0]), append(g.OnePerCallRets, ret)
	}
	g.AllInOneCall, _ = get(older, newer, ids...)
	older.Free()
	newer.Free()
	return g
}

func (r *stubResult) add(snap *gpu.Snapshot) {
	r.DriverVersion = snap.DriverVersion
	r.Readings = append(r.Readings, snap.Devices)
	for _, e := range snap.Errors {
		r.Errors = append(r.Errors, stubError{Index: e.Index, UUID: e.UUID, Operation: string(e.Operation), Message: e.Err.Error(),
			Lost: errors.Is(e.Err, gonvml.ERROR_GPU_IS_LOST)})
	}
}

func hasXID(snap *gpu.Snapshot, xid uint64) bool {
	if snap == nil {
		return false
	}
	for _, d := range snap.Devices {
		if slices.ContainsFunc(d.XIDErrors, func(x gpu.XIDCount) bool { return x.XID == xid }) {
			return true
		}
	}
	return false
}

// device returns a GPU of reading i (-1: the last).
func (r stubResult) device(t *testing.T, reading int, uuid string) gpu.Device {
	t.Helper()
	if reading < 0 {
		reading += len(r.Readings)
	}
	if reading < 0 || reading >= len(r.Readings) {
		t.Fatalf("no reading %d of %d", reading, len(r.Readings))
	}
	for _, d := range r.Readings[reading] {
		if d.UUID == uuid {
			return d
		}
	}
	t.Fatalf("device %s not in reading %d; errors %+v", uuid, reading, r.Errors)
	return gpu.Device{}
}

func (r stubResult) findError(index int, op string) (stubError, bool) {
	for _, e := range r.Errors {
		if e.Index == index && e.Operation == op {
			return e, true
		}
	}
	return stubError{}, false
}

func (r stubResult) wantNoErrors(t *testing.T) {
	t.Helper()
	if len(r.Errors) != 0 {
		t.Errorf("errors = %+v", r.Errors)
	}
}

// wantNoSamplesLeft checks the stub's report: every GPM sample allocated was freed by Close.
func (r stubResult) wantNoSamplesLeft(t *testing.T) {
	t.Helper()
	if !strings.HasSuffix(r.Report, " samples=0") {
		t.Errorf("stub report %q: GPM samples left allocated after Close", r.Report)
	}
}

// wantDevice compares what the source read of a GPU with the variant's table, leaving out processes, XIDs,
// MIG and profiling, which the tests check on their own.
func wantDevice(t *testing.T, got, want gpu.Device) {
	t.Helper()
	got.Processes, got.ProcessesListed, got.XIDErrors, got.MIG, got.Profiling = nil, false, nil, nil, nil
	if reflect.DeepEqual(got, want) {
		return
	}
	g, _ := json.MarshalIndent(got, "", " ")
	w, _ := json.MarshalIndent(want, "", " ")
	gl, wl := strings.Split(string(g), "\n"), strings.Split(string(w), "\n")
	var diff []string
	for i := range max(len(gl), len(wl)) {
		var a, b string
		if i < len(gl) {
			a = gl[i]
		}
		if i < len(wl) {
			b = wl[i]
		}
		if a != b {
			diff = append(diff, fmt.Sprintf("line %d: got %s, want %s", i+1, strings.TrimSpace(a), strings.TrimSpace(b)))
		}
	}
	if len(diff) > 12 {
		diff = append(diff[:12], "...")
	}
	t.Errorf("GPU %s differs from the stub's table:\n%s", want.UUID, strings.Join(diff, "\n"))
}

func wantProfiling(t *testing.T, what string, got, want *gpu.Profiling) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s profiling = %+v, want %+v", what, got, want)
	}
}

// wantProcesses checks GPU 0's processes: PID 1001 computing with 1 GiB, PID 1002 computing and drawing with 2 GiB.
func wantProcesses(t *testing.T, d gpu.Device) {
	t.Helper()
	want := []struct {
		pid  uint32
		typ  string
		used float64
	}{{stubnvml.FirstPID, gpu.ProcessCompute, stubnvml.GiB}, {stubnvml.FirstPID + 1, gpu.ProcessComputeAndGraphics, 2 * stubnvml.GiB}}
	if !d.ProcessesListed || len(d.Processes) != len(want) {
		t.Fatalf("listed %v, processes %+v; want PIDs 1001 and 1002", d.ProcessesListed, d.Processes)
	}
	for i, w := range want {
		p := d.Processes[i]
		if p.PID != w.pid || p.Type != w.typ || p.UsedMemoryBytes != gpu.Known(w.used) || p.MIG {
			t.Errorf("process %d = PID %d %s %+v MIG %v, want PID %d %s %v bytes", i, p.PID, p.Type, p.UsedMemoryBytes, p.MIG,
				w.pid, w.typ, w.used)
		}
	}
}

// An H100 on R580, read end to end through go-nvml's real bindings: every device field exact as the stub's table
// has it (v2 memory, aggregate ECC counts, field values each with its own return code, PCIe, NVLink links, clock
// event reasons, violation times, recovery action, fabric health, vGPU licence), processes from the _v3 lists with
// their 24-byte records and per-process utilization, and GPM profiling from the second reading on, computed without
// waiting. Close frees every GPM sample.
func TestStubLibraryH100R580(t *testing.T) {
	v := stubnvml.H100R580
	res := mustRunStub(t, v.Build(t), "snapshot")
	res.wantNoErrors(t)
	if res.DriverVersion != v.DriverVersion {
		t.Errorf("driver version %q", res.DriverVersion)
	}
	for reading := range 2 {
		for i := range 2 {
			wantDevice(t, res.device(t, reading, fmt.Sprintf("GPU-stub-%d", i)), v.Device(i))
		}
	}
	first, second := res.device(t, 0, "GPU-stub-0"), res.device(t, 1, "GPU-stub-0")
	wantProfiling(t, "first reading", first.Profiling, nil)
	wantProfiling(t, "second reading", second.Profiling, v.Profiling(0))
	wantProfiling(t, "GPU 1, second reading", res.device(t, 1, "GPU-stub-1").Profiling, v.Profiling(0))
	wantProcesses(t, first)
	for _, p := range first.Processes {
		if p.SMUtilizationRatio != gpu.Known(0.5) {
			t.Errorf("PID %d SM utilization = %+v, want 0.5", p.PID, p.SMUtilizationRatio)
		}
	}
	res.wantNoSamplesLeft(t)
}

// R550 to R575 know only version 2 of the fabric information: the source asks version 3, is told the version does
// not match, and reads version 2, whose health mask says GPU 1's bandwidth is degraded.
func TestStubLibraryFabricVersion2(t *testing.T) {
	v := stubnvml.H100R580
	res := mustRunStub(t, v.Build(t), "snapshot", "STUB_NVML_FABRIC_V2=1")
	res.wantNoErrors(t)
	for reading := range 2 {
		for i := range 2 {
			wantDevice(t, res.device(t, reading, fmt.Sprintf("GPU-stub-%d", i)), v.Device(i))
		}
	}
}

// An A100 has no GPM: NVML says so (nvmlGpmQueryDeviceSupport), and the profiling fields are absent, not 0.
func TestStubLibraryA100HasNoProfiling(t *testing.T) {
	v := stubnvml.A100R580
	res := mustRunStub(t, v.Build(t), "snapshot", stubReadingsEnv+"=3")
	res.wantNoErrors(t)
	for reading := range 3 {
		for i := range 2 {
			d := res.device(t, reading, fmt.Sprintf("GPU-stub-%d", i))
			wantDevice(t, d, v.Device(i))
			wantProfiling(t, fmt.Sprintf("GPU %d reading %d", i, reading), d.Profiling, nil)
		}
	}
	res.wantNoSamplesLeft(t)
}

// GPU 1 in MIG mode: profiling per GPU instance from nvmlGpmMigSampleGet, on the MIG device with the lowest compute
// instance (as its memory), and of the whole GPU; row remapping is not supported in MIG mode and is absent.
func TestStubLibraryProfilingPerGPUInstance(t *testing.T) {
	v := stubnvml.H100R580
	res := mustRunStub(t, v.Build(t), "snapshot", "STUB_NVML_MIG=1")
	res.wantNoErrors(t)
	d := res.device(t, 1, "GPU-stub-1")
	if d.MIGMode != gpu.MIGEnabled || len(d.MIG) != 3 {
		t.Fatalf("MIG mode %q, instances %+v", d.MIGMode, d.MIG)
	}
	wantProfiling(t, "GPU 1", d.Profiling, v.Profiling(0))
	for _, inst := range d.MIG {
		var want *gpu.Profiling
		if inst.ComputeInstance == 0 {
			want = v.Profiling(inst.GPUInstance)
		}
		wantProfiling(t, fmt.Sprintf("GPU instance %d compute instance %d", inst.GPUInstance, inst.ComputeInstance), inst.Profiling, want)
	}
	for _, inst := range res.device(t, 0, "GPU-stub-1").MIG {
		wantProfiling(t, "first reading of a GPU instance", inst.Profiling, nil)
	}
	if h := d.Health; h.CorrectableRemappedRows.Valid || h.RemapPending.Valid {
		t.Errorf("remapped rows in MIG mode = %+v, want absent", h)
	}
	res.wantNoSamplesLeft(t)
}

// GPM's pitfalls, first with go-nvml alone: go-nvml v0.13.4-1 sends nvmlGpmSupport_t's plain version 1, which the
// stub, as NVML, requires (NVML refuses NVML_STRUCT_VERSION there); samples passed newest first give another value
// (the counters' differences wrap); and with STUB_NVML_GPM_BATCH several metrics in one call come back in the wrong
// slots. The source, one metric per call, reads them exactly.
func TestStubLibraryGPMPitfalls(t *testing.T) {
	v := stubnvml.H100R580
	lib := v.Build(t)
	g := mustRunStub(t, lib, "go-nvml gpm", "STUB_NVML_GPM_BATCH=1").GPM
	if g.SupportReturn != gonvml.SUCCESS || g.Supported != 1 {
		t.Errorf("nvmlGpmQueryDeviceSupport through go-nvml = %v, supported %d; want SUCCESS, 1", g.SupportReturn, g.Supported)
	}
	want := v.Profiling(0)
	if g.InOrder != want.GraphicsEngineActive.V*100 || g.Reversed == g.InOrder {
		t.Errorf("graphics activity in order %v, reversed %v: want %v, and another value reversed",
			g.InOrder, g.Reversed, want.GraphicsEngineActive.V*100)
	}
	for i, ret := range g.OnePerCallRets {
		if ret != gonvml.SUCCESS {
			t.Errorf("metric %d: %v", gpmMetrics[i].id, ret)
		}
	}
	if slices.Equal(g.OnePerCall, g.AllInOneCall) {
		t.Errorf("the stub's batched metrics came back right (%v); the case shows nothing", g.AllInOneCall)
	}

	res := mustRunStub(t, lib, "snapshot", "STUB_NVML_GPM_BATCH=1")
	res.wantNoErrors(t)
	wantProfiling(t, "with batching broken", res.device(t, 1, "GPU-stub-0").Profiling, want)
}

// R470 on a V100 has no nvmlDeviceGetMemoryInfo_v2. go-nvml calls it without a symbol check, and the process dies
// (exit 127, "symbol lookup error"); the source reads v1 instead, the clock "throttle" reasons instead of the
// "event" ones, retired pages instead of remapped rows, and no GPM, versioned fabric information, PCIe byte
// counters or recovery action, which the driver does not have.
func TestStubLibraryV100R470(t *testing.T) {
	v := stubnvml.V100R470
	lib := v.Build(t)
	_, err, output := runStub(t, lib, "go-nvml memory v2")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 127 || !strings.Contains(output, "symbol lookup error") {
		t.Fatalf("go-nvml calling the missing v2 symbol: %v\n%s\nwant exit 127 with a symbol lookup error", err, output)
	}

	res := mustRunStub(t, lib, "snapshot")
	res.wantNoErrors(t)
	if res.DriverVersion != v.DriverVersion {
		t.Errorf("driver version %q", res.DriverVersion)
	}
	for i := range 2 {
		d := res.device(t, 1, fmt.Sprintf("GPU-stub-%d", i))
		wantDevice(t, d, v.Device(i))
		wantProfiling(t, "V100", d.Profiling, nil)
	}
	wantProcesses(t, res.device(t, 0, "GPU-stub-0"))
}

// 535.54 writes 32-byte records through the _v3 process lists, where go-nvml reserves 24: go-nvml alone reads a
// wrong second PID. The source reads the lists with calls of its own: the right PIDs, memory and
// types, from the compute and the graphics lists. The driver defines no PCIe byte counters or recovery action yet,
// and the source does not ask for them (the stub answers an error for an ID its branch lacks).
func TestStubLibraryDriverWithLongProcessRecords(t *testing.T) {
	v := stubnvml.H100R535
	lib := v.Build(t)
	garbled := mustRunStub(t, lib, "go-nvml processes")
	if len(garbled.Processes) != 2 || garbled.Processes[1].Pid == stubnvml.FirstPID+1 {
		t.Fatalf("go-nvml read %+v from the 32-byte records; the stub should make go-nvml misread them", garbled.Processes)
	}

	res := mustRunStub(t, lib, "snapshot")
	res.wantNoErrors(t)
	for i := range 2 {
		wantDevice(t, res.device(t, 0, fmt.Sprintf("GPU-stub-%d", i)), v.Device(i))
	}
	wantProcesses(t, res.device(t, 0, "GPU-stub-0"))
	wantProcesses(t, res.device(t, 1, "GPU-stub-0"))
	wantProfiling(t, "535.54", res.device(t, 1, "GPU-stub-0").Profiling, v.Profiling(0))
	res.wantNoSamplesLeft(t)
}

// GPU 1 reports XID 79 and falls off the bus: every call about it, GetUUID included, then answers GPU_IS_LOST.
// The XID is still counted and GPU 1 stays in the snapshot with it; its GPM samples are freed.
func TestStubLibraryLostGPUKeepsXID79(t *testing.T) {
	res := mustRunStub(t, stubnvml.H100R580.Build(t), "xid", "STUB_NVML_XID79=1", stubReadingsEnv+"=1")
	lost := res.device(t, -1, "GPU-stub-1")
	if want := []gpu.XIDCount{{XID: 79, Count: 1}}; !slices.Equal(lost.XIDErrors, want) {
		t.Errorf("GPU 1 XIDs = %+v, want %+v", lost.XIDErrors, want)
	}
	if e, ok := res.findError(1, "device"); !ok || !e.Lost || e.UUID != "GPU-stub-1" {
		t.Errorf("GPU 1 error = %+v (found %v), want GPU_IS_LOST with its UUID", e, ok)
	}
	if d := res.device(t, -1, "GPU-stub-0"); d.MemoryUsedBytes != gpu.Known(stubnvml.MemoryUsed) {
		t.Errorf("GPU 0 used = %+v", d.MemoryUsedBytes)
	}
	res.wantNoSamplesLeft(t)
}

// The driver finds more utilization samples on go-nvml's second call than it announced on the first: go-nvml's
// wrapper slices past its buffer and panics. That costs the per-process utilization of the GPU.
func TestStubLibraryProcessUtilizationGrowsBetweenCalls(t *testing.T) {
	res := mustRunStub(t, stubnvml.H100R580.Build(t), "snapshot", "STUB_NVML_UTIL_GROWS=1", stubReadingsEnv+"=1")
	d := res.device(t, 0, "GPU-stub-0")
	if !d.ProcessesListed || len(d.Processes) != 2 || d.Processes[0].SMUtilizationRatio.Valid {
		t.Errorf("listed %v, processes %+v; want both, without utilization", d.ProcessesListed, d.Processes)
	}
	if d.MemoryUsedBytes != gpu.Known(stubnvml.MemoryUsed) {
		t.Errorf("used = %+v", d.MemoryUsedBytes)
	}
	if e, ok := res.findError(0, "process_utilization"); !ok || !strings.Contains(e.Message, "panicked") {
		t.Errorf("process_utilization error = %+v (found %v)", e, ok)
	}
	res.device(t, 0, "GPU-stub-1")
}

// A driver in an XID storm answers every event wait at once. Through the real library: every XID the driver
// reported is counted, the log has GPU 0's first xidLogBurst of the minute, and the watcher reads at most
// maxXIDEventsPerSecond a second, which bounds its CPU (measured and logged, not asserted: the machine's load is
// not the test's).
func TestStubLibraryXIDStorm(t *testing.T) {
	res := mustRunStub(t, stubnvml.H100R580.Build(t), "xid storm", "STUB_NVML_XID_STORM=1")
	var sent uint64
	if _, err := fmt.Sscanf(res.Report, "calls=%d xids=%d", new(uint64), &sent); err != nil {
		t.Fatalf("stub report %q: %v", res.Report, err)
	}
	st := res.Storm
	t.Logf("XID storm for %.0f s: %d XIDs reported and %d counted, %d WARN lines, %.2f CPU-s",
		st.Seconds, sent, st.Counted, st.WarnLines, st.CPUSeconds)
	if st.Counted != sent || sent == 0 {
		t.Errorf("%d XIDs counted, want every one the driver reported: %d", st.Counted, sent)
	}
	if max := uint64(st.Seconds+1) * maxXIDEventsPerSecond; sent > max {
		t.Errorf("%d XIDs read in %.0f s, want at most %d a second", sent, st.Seconds, maxXIDEventsPerSecond)
	}
	if st.WarnLines != xidLogBurst {
		t.Errorf("%d WARN lines, want GPU 0's first %d XIDs of the minute", st.WarnLines, xidLogBurst)
	}
}

// A driver that answers INSUFFICIENT_SIZE to a process list however much room it is given, each time with a larger
// count: go-nvml's lists call it again without end, doubling their buffer, and the reading never returns (a core
// spinning inside go-nvml). The source's own calls give up after maxSizeRetries, and GPU 0's processes are unlisted
// for the reading with an error that says why; GPU 1 and the rest of GPU 0 are read.
func TestStubLibraryProcessListThatKeepsGrowing(t *testing.T) {
	start := time.Now()
	res := mustRunStub(t, stubnvml.H100R580.Build(t), "snapshot", "STUB_NVML_PROCESSES_GROW=1", stubReadingsEnv+"=1")
	var calls uint64
	if _, err := fmt.Sscanf(res.Report, "calls=%d", &calls); err != nil {
		t.Fatalf("stub report %q: %v", res.Report, err)
	}
	t.Logf("a reading against a process list that keeps growing: %d NVML calls, %v", calls, time.Since(start).Round(time.Millisecond))
	d := res.device(t, 0, "GPU-stub-0")
	if d.ProcessesListed || len(d.Processes) != 0 {
		t.Errorf("GPU 0 listed %v with %d processes, want unlisted", d.ProcessesListed, len(d.Processes))
	}
	if e, ok := res.findError(0, "processes"); !ok || !strings.Contains(e.Message, "kept answering INSUFFICIENT_SIZE") {
		t.Errorf("GPU 0 processes error = %+v (found %v), want one that says NVML kept asking for more room", e, ok)
	}
	if d.MemoryUsedBytes != gpu.Known(stubnvml.MemoryUsed) {
		t.Errorf("GPU 0 memory used = %+v, want it read", d.MemoryUsedBytes)
	}
	if d1 := res.device(t, 0, "GPU-stub-1"); !d1.ProcessesListed {
		t.Errorf("GPU 1 processes not listed")
	}
}

// A driver that counts more processes on GPU 0 than maxListedProcesses: the source passes no records for them,
// and GPU 0's processes are unlisted for the reading with an error that gives the count, not one that says the
// driver kept asking for more room; GPU 1 is read.
func TestStubLibraryProcessCountPastTheBound(t *testing.T) {
	count := maxListedProcesses + 1
	res := mustRunStub(t, stubnvml.H100R580.Build(t), "snapshot", fmt.Sprintf("STUB_NVML_PROCESSES=%d", count),
		stubReadingsEnv+"=1")
	d := res.device(t, 0, "GPU-stub-0")
	if d.ProcessesListed || len(d.Processes) != 0 {
		t.Errorf("GPU 0 listed %v with %d processes, want unlisted", d.ProcessesListed, len(d.Processes))
	}
	want := fmt.Sprintf("NVML counts %d processes in the compute list, more than the %d", count, maxListedProcesses)
	if e, ok := res.findError(0, "processes"); !ok || !strings.Contains(e.Message, want) {
		t.Errorf("GPU 0 processes error = %+v (found %v), want one that says %q", e, ok, want)
	}
	if d1 := res.device(t, 0, "GPU-stub-1"); !d1.ProcessesListed {
		t.Errorf("GPU 1 processes not listed")
	}
}
