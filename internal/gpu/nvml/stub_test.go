package nvml

// Tests through go-nvml's real dlopen path, against a stub libnvidia-ml.so.1 (testdata/stubnvml) that gcc builds
// here. They catch what go-nvml's mocks cannot: a symbol the driver lacks (the process dies with "symbol lookup
// error"), a struct the driver writes with another layout, and go-nvml's own wrappers. go-nvml binds NVML's
// functions once per process, so each case runs in a child process: this test binary, re-run with
// stubChildEnv set, runs TestStubChild, which writes what it read as JSON.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

const (
	stubChildEnv = "GPE_NVML_STUB_CHILD" // the scenario the child runs
	stubLibEnv   = "GPE_NVML_STUB_LIB"   // the stub library's path
	stubOutEnv   = "GPE_NVML_STUB_OUT"   // where the child writes its result
)

// Driver generations the stub can be built as (see testdata/stubnvml/libnvidia-ml.c).
const (
	stubR470 = "STUB_DRIVER_470"
	stubR535 = "STUB_DRIVER_535"
	stubR550 = "" // current
)

// buildStub compiles the stub library for one driver generation against go-nvml's copy of nvml.h, the header the
// bindings were generated from.
func buildStub(t *testing.T, driver string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("finding go-nvml's module directory: %v", err)
	}
	include := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	lib := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc" // cgo, which go-nvml needs, needs it too
	}
	args := []string{"-std=c11", "-Wall", "-Wextra", "-shared", "-fPIC", "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1",
		"-I", include, "-o", lib, filepath.Join("testdata", "stubnvml", "libnvidia-ml.c")}
	if driver != "" {
		args = append(args, "-D"+driver)
	}
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("building the stub NVML library: %v\n%s", err, out)
	}
	return lib
}

// stubResult is what a child read.
type stubResult struct {
	DriverVersion string
	Devices       []stubGPU
	Errors        []stubError
	// Processes is what go-nvml itself returned for GPU 0's compute processes (scenario "go-nvml processes").
	Processes []gonvml.ProcessInfo
}

type stubGPU struct {
	Index                       int
	UUID                        string
	Total, Used, Free, Reserved *float64
	ECC                         []gpu.ECCCount
	XID                         []gpu.XIDCount
	ProcessesListed             bool
	Processes                   []stubProcess
}

type stubProcess struct {
	PID    uint32
	Memory *float64
	SM     *float64
}

type stubError struct {
	Index     int
	UUID      string
	Operation string
	Message   string
	Lost      bool
}

func valuePtr(v gpu.Value) *float64 {
	if !v.Valid {
		return nil
	}
	return &v.V
}

// runStub runs scenario in a child process against lib with the extra environment, and returns what it read; the
// child's exit status and output are returned too, for the cases that expect it to die.
func runStub(t *testing.T, lib, scenario string, env ...string) (stubResult, error, string) {
	t.Helper()
	outFile := filepath.Join(t.TempDir(), "result.json")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStubChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), stubChildEnv+"="+scenario, stubLibEnv+"="+lib, stubOutEnv+"="+outFile)
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
		s, err := New(Config{Library: lib})
		if err != nil {
			t.Fatal(err)
		}
		snap, err := s.Snapshot(t.Context())
		// "xid": read until the stub's XID 79 on GPU 1 has been counted.
		for deadline := time.Now().Add(20 * time.Second); err == nil && scenario == "xid" && !hasXID(snap, 79) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			snap, err = s.Snapshot(t.Context())
		}
		if err != nil {
			t.Fatal(err)
		}
		res = summarize(snap)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	case "go-nvml processes":
		// go-nvml alone, as every program that uses it lists processes.
		if ret := lib.Init(); ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
		h, ret := lib.DeviceGetHandleByIndex(0)
		if ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
		if res.Processes, ret = h.GetComputeRunningProcesses(); ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
	case "go-nvml memory v2":
		if ret := lib.Init(); ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
		h, ret := lib.DeviceGetHandleByIndex(0)
		if ret != gonvml.SUCCESS {
			t.Fatal(ret)
		}
		_, ret = h.GetMemoryInfo_v2()
		t.Fatalf("GetMemoryInfo_v2 returned %v", ret)
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

func hasXID(snap *gpu.Snapshot, xid uint64) bool {
	for _, d := range snap.Devices {
		if slices.ContainsFunc(d.XIDErrors, func(x gpu.XIDCount) bool { return x.XID == xid }) {
			return true
		}
	}
	return false
}

func summarize(snap *gpu.Snapshot) stubResult {
	res := stubResult{DriverVersion: snap.DriverVersion}
	for _, d := range snap.Devices {
		sd := stubGPU{Index: d.Index, UUID: d.UUID, Total: valuePtr(d.MemoryTotalBytes), Used: valuePtr(d.MemoryUsedBytes),
			Free: valuePtr(d.MemoryFreeBytes), Reserved: valuePtr(d.MemoryReservedBytes), ECC: d.ECCErrors, XID: d.XIDErrors,
			ProcessesListed: d.ProcessesListed}
		for _, p := range d.Processes {
			sd.Processes = append(sd.Processes, stubProcess{PID: p.PID, Memory: valuePtr(p.UsedMemoryBytes), SM: valuePtr(p.SMUtilizationRatio)})
		}
		res.Devices = append(res.Devices, sd)
	}
	for _, e := range snap.Errors {
		res.Errors = append(res.Errors, stubError{Index: e.Index, UUID: e.UUID, Operation: string(e.Operation), Message: e.Err.Error(),
			Lost: errors.Is(e.Err, gonvml.ERROR_GPU_IS_LOST)})
	}
	return res
}

func (r stubResult) device(t *testing.T, uuid string) stubGPU {
	t.Helper()
	for _, d := range r.Devices {
		if d.UUID == uuid {
			return d
		}
	}
	t.Fatalf("device %s not read; result %+v", uuid, r)
	return stubGPU{}
}

func (r stubResult) findError(index int, op string) (stubError, bool) {
	for _, e := range r.Errors {
		if e.Index == index && e.Operation == op {
			return e, true
		}
	}
	return stubError{}, false
}

func wantBytes(t *testing.T, what string, got *float64, want uint64) {
	t.Helper()
	if got == nil || *got != float64(want) {
		t.Errorf("%s = %v, want %d", what, fmtPtr(got), want)
	}
}

func fmtPtr(v *float64) string {
	if v == nil {
		return "absent"
	}
	return fmt.Sprint(*v)
}

// The stub's memory: 141 GiB total, 614 MiB reserved by the driver, 3 GiB used by processes.
const (
	stubTotal    = 141 << 30
	stubReserved = 614 << 20
	stubUsed     = 3 << 30
)

// A current driver, read end to end through go-nvml's real bindings: v2 memory with the reservation apart,
// processes from the _v3 lists with their 24-byte records, per-process utilization, and the aggregate ECC counts.
func TestStubLibraryCurrentDriver(t *testing.T) {
	res := mustRunStub(t, buildStub(t, stubR550), "snapshot")
	if len(res.Errors) != 0 {
		t.Errorf("errors = %+v", res.Errors)
	}
	d := res.device(t, "GPU-stub-0")
	wantBytes(t, "total", d.Total, stubTotal)
	wantBytes(t, "used", d.Used, stubUsed)
	wantBytes(t, "reserved", d.Reserved, stubReserved)
	wantBytes(t, "free", d.Free, stubTotal-stubReserved-stubUsed)
	if !d.ProcessesListed || len(d.Processes) != 2 {
		t.Fatalf("listed %v, processes %+v", d.ProcessesListed, d.Processes)
	}
	for i, p := range d.Processes {
		if p.PID != uint32(1001+i) {
			t.Errorf("process %d PID = %d, want %d", i, p.PID, 1001+i)
		}
		wantBytes(t, fmt.Sprintf("PID %d memory", p.PID), p.Memory, uint64(i+1)<<30)
		if p.SM == nil || *p.SM != 0.5 {
			t.Errorf("PID %d SM utilization = %v, want 0.5", p.PID, fmtPtr(p.SM))
		}
	}
	// The stub answers 1/0 for volatile and 7/2 for aggregate counts: the metric is the GPU's lifetime count.
	if want := []gpu.ECCCount{{Type: "corrected", Count: 7}, {Type: "uncorrected", Count: 2}}; !slices.Equal(d.ECC, want) {
		t.Errorf("ECC = %+v, want the aggregate counts %+v", d.ECC, want)
	}
}

// An R470 driver has no nvmlDeviceGetMemoryInfo_v2. go-nvml calls it without a symbol check, and the process
// dies (exit 127, "symbol lookup error"); the source reads v1 instead.
func TestStubLibraryDriverWithoutMemoryInfoV2(t *testing.T) {
	lib := buildStub(t, stubR470)
	_, err, output := runStub(t, lib, "go-nvml memory v2")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 127 || !strings.Contains(output, "symbol lookup error") {
		t.Fatalf("go-nvml calling the missing v2 symbol: %v\n%s\nwant exit 127 with a symbol lookup error", err, output)
	}

	res := mustRunStub(t, lib, "snapshot")
	if len(res.Errors) != 0 {
		t.Errorf("errors = %+v", res.Errors)
	}
	if res.DriverVersion != "470.256.02" {
		t.Errorf("driver version %q", res.DriverVersion)
	}
	d := res.device(t, "GPU-stub-0")
	wantBytes(t, "used (v1: with the reservation)", d.Used, stubUsed+stubReserved)
	wantBytes(t, "total", d.Total, stubTotal)
	if d.Reserved != nil {
		t.Errorf("reserved = %v, want absent (v1 does not tell)", *d.Reserved)
	}
	if !d.ProcessesListed || len(d.Processes) != 2 || d.Processes[1].PID != 1002 {
		t.Errorf("processes from the _v2 lists: listed %v, %+v", d.ProcessesListed, d.Processes)
	}
}

// R535 writes 32-byte records through the _v3 process lists, where go-nvml reserves 24: go-nvml alone reads a
// wrong second PID (go-nvml#75). The source recognises the driver and does not list processes, saying why, and
// reads the rest.
func TestStubLibraryDriverWithLongProcessRecords(t *testing.T) {
	lib := buildStub(t, stubR535)
	garbled := mustRunStub(t, lib, "go-nvml processes")
	if len(garbled.Processes) != 2 || garbled.Processes[1].Pid == 1002 {
		t.Fatalf("go-nvml read %+v from the 32-byte records; the stub should reproduce go-nvml#75", garbled.Processes)
	}

	res := mustRunStub(t, lib, "snapshot")
	d := res.device(t, "GPU-stub-0")
	if d.ProcessesListed || len(d.Processes) != 0 {
		t.Errorf("listed %v, processes %+v; want no list", d.ProcessesListed, d.Processes)
	}
	e, ok := res.findError(0, "processes")
	if !ok || !strings.Contains(e.Message, "--gpu.source=nvidia-smi") {
		t.Errorf("processes error = %+v (found %v)", e, ok)
	}
	wantBytes(t, "used", d.Used, stubUsed)
}

// GPU 1 reports XID 79 and falls off the bus: every call about it, GetUUID included, then answers GPU_IS_LOST.
// The XID is still counted and GPU 1 stays in the snapshot with it.
func TestStubLibraryLostGPUKeepsXID79(t *testing.T) {
	res := mustRunStub(t, buildStub(t, stubR550), "xid", "STUB_NVML_XID79=1")
	lost := res.device(t, "GPU-stub-1")
	if want := []gpu.XIDCount{{XID: 79, Count: 1}}; !slices.Equal(lost.XID, want) {
		t.Errorf("GPU 1 XIDs = %+v, want %+v", lost.XID, want)
	}
	if e, ok := res.findError(1, "device"); !ok || !e.Lost || e.UUID != "GPU-stub-1" {
		t.Errorf("GPU 1 error = %+v (found %v), want GPU_IS_LOST with its UUID", e, ok)
	}
	wantBytes(t, "GPU 0 used", res.device(t, "GPU-stub-0").Used, stubUsed)
}

// The driver finds more utilization samples on go-nvml's second call than it announced on the first: go-nvml's
// wrapper slices past its buffer and panics (go-nvml#11, #27). That costs the per-process utilization of the GPU.
func TestStubLibraryProcessUtilizationGrowsBetweenCalls(t *testing.T) {
	res := mustRunStub(t, buildStub(t, stubR550), "snapshot", "STUB_NVML_UTIL_GROWS=1")
	d := res.device(t, "GPU-stub-0")
	if !d.ProcessesListed || len(d.Processes) != 2 || d.Processes[0].SM != nil {
		t.Errorf("listed %v, processes %+v; want both, without utilization", d.ProcessesListed, d.Processes)
	}
	wantBytes(t, "used", d.Used, stubUsed)
	if e, ok := res.findError(0, "process_utilization"); !ok || !strings.Contains(e.Message, "panicked") {
		t.Errorf("process_utilization error = %+v (found %v)", e, ok)
	}
	res.device(t, "GPU-stub-1")
}
