//go:build linux && cgo

package nvml

import (
	"fmt"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

const notMIG = 0xFFFFFFFF

func procs(infos ...gonvml.ProcessInfo) func() ([]gonvml.ProcessInfo, gonvml.Return) {
	return func() ([]gonvml.ProcessInfo, gonvml.Return) { return infos, gonvml.SUCCESS }
}

func proc(pid uint32, mem uint64) gonvml.ProcessInfo {
	return gonvml.ProcessInfo{Pid: pid, UsedGpuMemory: mem, GpuInstanceId: notMIG, ComputeInstanceId: notMIG}
}

func processByPID(t *testing.T, d gpu.Device, pid uint32) gpu.Process {
	t.Helper()
	for _, p := range d.Processes {
		if p.PID == pid {
			return p
		}
	}
	t.Fatalf("PID %d not in %+v", pid, d.Processes)
	return gpu.Process{}
}

func TestProcessesMergedPerPID(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetComputeRunningProcessesFunc = procs(proc(10, 1*gib), proc(20, 2*gib), proc(40, 4*gib), proc(50, notAvailable))
	dev.GetGraphicsRunningProcessesFunc = procs(proc(20, 2*gib), proc(30, 3*gib))
	// PID 40 is an MPS client, listed in the compute list too as recent drivers do; PID 60 only in the MPS list.
	dev.GetMPSComputeRunningProcessesFunc = procs(proc(40, 4*gib), proc(60, gib/2))
	lib := newLibrary(dev)
	lib.SystemGetProcessNameFunc = func(pid int) (string, gonvml.Return) {
		if pid == 30 {
			return "", gonvml.ERROR_NOT_FOUND
		}
		return "proc", gonvml.SUCCESS
	}
	snap := snapshot(t, newSource(t, lib))
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-0")
	if !d.ProcessesListed {
		t.Fatal("processes not listed")
	}
	want := []struct {
		pid  uint32
		typ  string
		mem  float64
		name string
	}{
		{10, gpu.ProcessCompute, 1 * gib, "proc"},
		{20, gpu.ProcessComputeAndGraphics, 2 * gib, "proc"},
		{30, gpu.ProcessGraphics, 3 * gib, ""},
		{40, gpu.ProcessMPS, 4 * gib, "proc"},
		{50, gpu.ProcessCompute, -1, "proc"},
		{60, gpu.ProcessMPS, gib / 2, "proc"},
	}
	if len(d.Processes) != len(want) {
		t.Fatalf("processes = %+v", d.Processes)
	}
	for i, w := range want {
		p := d.Processes[i]
		if p.PID != w.pid || p.Type != w.typ || p.Name != w.name || p.MIG {
			t.Errorf("process %d = %+v, want PID %d type %s name %q", i, p, w.pid, w.typ, w.name)
		}
		if w.mem < 0 {
			wantAbsent(t, "memory of PID 50 (NVML_VALUE_NOT_AVAILABLE)", p.UsedMemoryBytes)
		} else {
			wantValue(t, "memory", p.UsedMemoryBytes, w.mem)
		}
	}
}

// Old drivers return v1 structs, which go-nvml converts with instance IDs 0xFFFFFFFF; newer drivers use the same
// value on GPUs without MIG. Neither makes a process a MIG process.
func TestV1ProcessStructsAreNotMIG(t *testing.T) {
	dev := newDevice("GPU-0")
	v1 := gonvml.ProcessInfo_v1Slice{{Pid: 10, UsedGpuMemory: gib}}.ToProcessInfoSlice()
	if v1[0].GpuInstanceId != 0xFFFFFFFF {
		t.Fatalf("go-nvml converted v1 instance ID to %#x", v1[0].GpuInstanceId)
	}
	dev.GetComputeRunningProcessesFunc = procs(v1...)
	d := deviceByUUID(t, snapshot(t, newSource(t, newLibrary(dev))), "GPU-0")
	p := processByPID(t, d, 10)
	if p.MIG || p.GPUInstance != 0 || p.ComputeInstance != 0 {
		t.Errorf("process = %+v, want not MIG with zero instance IDs", p)
	}
	wantValue(t, "memory", p.UsedMemoryBytes, gib)
}

func TestProcessListFailure(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetComputeRunningProcessesFunc = procs(proc(10, gib))
	dev.GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_UNKNOWN }
	snap := snapshot(t, newSource(t, newLibrary(dev)))
	d := deviceByUUID(t, snap, "GPU-0")
	if d.ProcessesListed || len(d.Processes) != 0 {
		t.Errorf("listed %v, processes %+v: want not listed and empty", d.ProcessesListed, d.Processes)
	}
	if e, ok := findError(snap, 0, gpu.OpProcesses); !ok || !isReturn(e.Err, gonvml.ERROR_UNKNOWN) {
		t.Errorf("processes error = %+v (found %v)", e, ok)
	}
	wantValue(t, "device memory still read", d.MemoryTotalBytes, 80*gib)
}

// Graphics and MPS lists that the GPU does not support are empty lists, not failures; a driver without any MPS list
// symbol is not asked for one (go-nvml would die calling it).
func TestUnsupportedGraphicsAndMPSListsAreEmpty(t *testing.T) {
	for _, tc := range []struct {
		name    string
		missing []string
	}{
		{"MPS not supported", nil},
		{"MPS list missing from the driver", symMPSProcesses},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := newDevice("GPU-0")
			dev.GetComputeRunningProcessesFunc = procs(proc(10, gib))
			dev.GetGraphicsRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
			dev.GetMPSComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
				if tc.missing != nil {
					t.Error("MPS list called although the driver lacks it")
				}
				return nil, gonvml.ERROR_NOT_SUPPORTED
			}
			snap := snapshot(t, newSource(t, withoutSymbols(newLibrary(dev), tc.missing...)))
			wantNoErrors(t, snap)
			d := deviceByUUID(t, snap, "GPU-0")
			if !d.ProcessesListed || len(d.Processes) != 1 || d.Processes[0].Type != gpu.ProcessCompute {
				t.Errorf("listed %v, processes %+v", d.ProcessesListed, d.Processes)
			}
		})
	}
}

// INSUFFICIENT_SIZE means processes started between NVML's count and its read: the call is repeated.
func TestInsufficientSizeIsRetried(t *testing.T) {
	dev := newDevice("GPU-0")
	computeCalls := 0
	dev.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		computeCalls++
		if computeCalls == 1 {
			return nil, gonvml.ERROR_INSUFFICIENT_SIZE
		}
		return []gonvml.ProcessInfo{proc(10, gib), proc(11, gib)}, gonvml.SUCCESS
	}
	utilCalls := 0
	dev.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		utilCalls++
		if utilCalls == 1 {
			return []gonvml.ProcessUtilizationSample{{Pid: 10}}, gonvml.ERROR_INSUFFICIENT_SIZE
		}
		ts := uint64(testNow.UnixMicro()) - 500_000
		return []gonvml.ProcessUtilizationSample{{Pid: 10, TimeStamp: ts, SmUtil: 50}, {Pid: 11, TimeStamp: ts, SmUtil: 25}}, gonvml.SUCCESS
	}
	snap := snapshot(t, newSource(t, newLibrary(dev)))
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-0")
	if !d.ProcessesListed || len(d.Processes) != 2 {
		t.Fatalf("listed %v, processes %+v", d.ProcessesListed, d.Processes)
	}
	wantValue(t, "PID 11 SM utilization", processByPID(t, d, 11).SMUtilizationRatio, 0.25)
	if computeCalls != 2 || utilCalls != 2 {
		t.Errorf("compute list called %d times, utilization %d times; want 2 each", computeCalls, utilCalls)
	}
}

func TestInsufficientSizeGivesUpAfterRetries(t *testing.T) {
	dev := newDevice("GPU-0")
	calls := 0
	dev.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		calls++
		return nil, gonvml.ERROR_INSUFFICIENT_SIZE
	}
	snap := snapshot(t, newSource(t, newLibrary(dev)))
	d := deviceByUUID(t, snap, "GPU-0")
	if d.ProcessesListed || calls != maxSizeRetries {
		t.Errorf("listed %v after %d calls, want not listed after %d", d.ProcessesListed, calls, maxSizeRetries)
	}
	if _, ok := findError(snap, 0, gpu.OpProcesses); !ok {
		t.Errorf("no processes error in %v", snap.Errors)
	}
}

// The per-process utilization follows NVML's contract: samples newer than the last-seen timestamp, one per process
// with non-zero utilization, NOT_FOUND when there are none.
func TestProcessUtilizationLastSeen(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetComputeRunningProcessesFunc = procs(proc(10, gib), proc(20, gib))
	firstLastSeen := uint64(testNow.UnixMicro()) - 5_000_000
	replies := []struct {
		samples []gonvml.ProcessUtilizationSample
		ret     gonvml.Return
	}{
		{[]gonvml.ProcessUtilizationSample{
			{Pid: 10, TimeStamp: firstLastSeen + 1000, SmUtil: 10, MemUtil: 1},
			{Pid: 10, TimeStamp: firstLastSeen + 3000, SmUtil: 80, MemUtil: 40, EncUtil: 2, DecUtil: 3},
			{Pid: 10, TimeStamp: firstLastSeen + 2000, SmUtil: 20, MemUtil: 2},
		}, gonvml.SUCCESS},
		{nil, gonvml.ERROR_NOT_FOUND},
		{[]gonvml.ProcessUtilizationSample{{Pid: 20, TimeStamp: firstLastSeen + 9000, SmUtil: 55}}, gonvml.SUCCESS},
	}
	var gotLastSeen []uint64
	dev.GetProcessUtilizationFunc = func(lastSeen uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		r := replies[len(gotLastSeen)]
		gotLastSeen = append(gotLastSeen, lastSeen)
		return r.samples, r.ret
	}
	s := newSource(t, newLibrary(dev))

	// First read: the newest of PID 10's samples; PID 20 had no utilization, which is a known 0.
	d := deviceByUUID(t, snapshot(t, s), "GPU-0")
	p10, p20 := processByPID(t, d, 10), processByPID(t, d, 20)
	wantValue(t, "PID 10 SM", p10.SMUtilizationRatio, 0.8)
	wantValue(t, "PID 10 memory", p10.MemoryUtilizationRatio, 0.4)
	wantValue(t, "PID 10 encoder", p10.EncoderUtilizationRatio, 0.02)
	wantValue(t, "PID 10 decoder", p10.DecoderUtilizationRatio, 0.03)
	wantValue(t, "PID 20 SM", p20.SMUtilizationRatio, 0)

	// Second read: NOT_FOUND is not an error; nobody was busy since the last sample.
	snap := snapshot(t, s)
	wantNoErrors(t, snap)
	d = deviceByUUID(t, snap, "GPU-0")
	wantValue(t, "PID 10 SM after NOT_FOUND", processByPID(t, d, 10).SMUtilizationRatio, 0)
	wantValue(t, "PID 20 SM after NOT_FOUND", processByPID(t, d, 20).SMUtilizationRatio, 0)

	d = deviceByUUID(t, snapshot(t, s), "GPU-0")
	wantValue(t, "PID 20 SM", processByPID(t, d, 20).SMUtilizationRatio, 0.55)

	want := []uint64{firstLastSeen, firstLastSeen + 3000, firstLastSeen + 3000}
	if len(gotLastSeen) != len(want) {
		t.Fatalf("GetProcessUtilization called with %v, want %v", gotLastSeen, want)
	}
	for i := range want {
		if gotLastSeen[i] != want[i] {
			t.Errorf("call %d lastSeen = %d, want %d", i, gotLastSeen[i], want[i])
		}
	}
	if got := s.lastSeen["GPU-0"]; got != firstLastSeen+9000 {
		t.Errorf("lastSeen after third read = %d, want %d", got, firstLastSeen+9000)
	}
}

func TestProcessUtilizationErrorIsReported(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetComputeRunningProcessesFunc = procs(proc(10, gib))
	dev.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		return nil, gonvml.ERROR_UNKNOWN
	}
	snap := snapshot(t, newSource(t, newLibrary(dev)))
	d := deviceByUUID(t, snap, "GPU-0")
	wantAbsent(t, "SM utilization", processByPID(t, d, 10).SMUtilizationRatio)
	wantValue(t, "memory", processByPID(t, d, 10).UsedMemoryBytes, gib)
	if _, ok := findError(snap, 0, gpu.OpProcessUtilization); !ok {
		t.Errorf("no process_utilization error in %v", snap.Errors)
	}
}

// Timestamps of GPUs that disappeared are dropped, so the state stays bounded by the GPUs present.
func TestLastSeenForgetsGoneGPUs(t *testing.T) {
	dev0, dev1 := newDevice("GPU-0"), newDevice("GPU-1")
	for _, d := range []*mock.Device{dev0, dev1} {
		d.GetComputeRunningProcessesFunc = procs(proc(10, gib))
	}
	lib := newLibrary(dev0, dev1)
	count := 2
	lib.DeviceGetCountFunc = func() (int, gonvml.Return) { return count, gonvml.SUCCESS }
	s := newSource(t, lib)
	snapshot(t, s)
	if len(s.lastSeen) != 2 {
		t.Fatalf("lastSeen = %v, want both GPUs", s.lastSeen)
	}
	count = 1
	snapshot(t, s)
	if _, ok := s.lastSeen["GPU-1"]; ok || len(s.lastSeen) != 1 {
		t.Errorf("lastSeen = %v, want only GPU-0", s.lastSeen)
	}
}

// A reading right after another must not read a busy process as idle: it looks back at least a second, and the
// driver answers with the same newest sample again.
func TestBackToBackReadingsLookBackASecond(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetComputeRunningProcessesFunc = procs(proc(10, gib))
	recent := uint64(testNow.UnixMicro()) - 100_000
	var asked []uint64
	dev.GetProcessUtilizationFunc = func(since uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		asked = append(asked, since)
		if since >= recent {
			return nil, gonvml.ERROR_NOT_FOUND
		}
		return []gonvml.ProcessUtilizationSample{{Pid: 10, TimeStamp: recent, SmUtil: 70}}, gonvml.SUCCESS
	}
	s := newSource(t, newLibrary(dev))
	for i := range 2 {
		d := deviceByUUID(t, snapshot(t, s), "GPU-0")
		wantValue(t, fmt.Sprintf("reading %d: PID 10 SM", i), processByPID(t, d, 10).SMUtilizationRatio, 0.7)
	}
	if want := uint64(testNow.UnixMicro()) - 1_000_000; len(asked) != 2 || asked[1] != want {
		t.Errorf("GetProcessUtilization asked since %v, want the second reading to look back to %d", asked, want)
	}
}

// fakeRecords is the source's own reading of 32-byte process records, as a test gives it.
type fakeRecords struct {
	lists map[deviceRef][3][]gonvml.ProcessInfo
	calls int
}

func (f *fakeRecords) list(l processList, ref deviceRef) ([]gonvml.ProcessInfo, gonvml.Return, error) {
	f.calls++
	lists, ok := f.lists[ref]
	if !ok {
		return nil, gonvml.ERROR_INVALID_ARGUMENT, nil
	}
	return lists[l], gonvml.SUCCESS, nil
}

// 535.43.02 to 535.86.x write 32-byte records through the _v3 process lists where go-nvml reserves 24. They are
// recognised as nvitop does, by their symbols: the conf-compute memory query is there, the process detail list of
// 535.104.05 is not. go-nvml's lists are then never called (the call itself overwrites Go memory): the source reads
// them with its own calls, and where it could not look those up, the GPU reports a processes error that says what
// to do.
func TestProcessListsOnDriversWithLongRecords(t *testing.T) {
	for _, tc := range []struct {
		name      string
		missing   []string
		own       bool // the source's own calls are available
		wantOwn   bool // and read the lists
		wantError bool
	}{
		{"535.43-535.86: conf compute, no detail list", []string{symProcessDetailList}, true, true, false},
		{"535.43-535.86 without the own calls", []string{symProcessDetailList}, false, false, true},
		{"535.104 and later: detail list", nil, true, false, false},
		{"before 535: no conf compute", []string{symConfComputeMemSize, symProcessDetailList}, true, false, false},
		{"535.98: no _v3 lists", []string{symComputeProcessesV3, symProcessDetailList}, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := newDevice("GPU-0")
			goNVMLCalls := 0
			dev.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
				goNVMLCalls++
				return []gonvml.ProcessInfo{proc(10, gib), proc(11, gib)}, gonvml.SUCCESS
			}
			s := newSource(t, withoutSymbols(newLibrary(dev), tc.missing...))
			own := &fakeRecords{lists: map[deviceRef][3][]gonvml.ProcessInfo{
				{gpu: 0, migSlot: -1}: {{proc(20, gib), proc(21, 2*gib)}, {proc(21, 2*gib)}, nil},
			}}
			if s.syms.processRecordsTooLong && tc.own {
				s.records = own
			}
			snap := snapshot(t, s)
			d := deviceByUUID(t, snap, "GPU-0")
			e, failed := findError(snap, 0, gpu.OpProcesses)
			switch {
			case tc.wantOwn:
				if !d.ProcessesListed || len(d.Processes) != 2 || failed || goNVMLCalls != 0 {
					t.Fatalf("listed %v, processes %+v, error %v, go-nvml calls %d; want the own calls' processes",
						d.ProcessesListed, d.Processes, e, goNVMLCalls)
				}
				if p := processByPID(t, d, 21); p.Type != gpu.ProcessComputeAndGraphics || p.UsedMemoryBytes != gpu.Known(2*gib) {
					t.Errorf("PID 21 = %+v, want compute+graphics with 2 GiB", p)
				}
			case tc.wantError:
				if d.ProcessesListed || len(d.Processes) != 0 || goNVMLCalls != 0 {
					t.Errorf("listed %v, processes %+v after %d list calls; want none listed and no call", d.ProcessesListed, d.Processes, goNVMLCalls)
				}
				if !failed || !strings.Contains(e.Error(), "--gpu.source=nvidia-smi") || !strings.Contains(e.Error(), "535.104.05") {
					t.Errorf("processes error = %v (found %v), want one that says to upgrade or use nvidia-smi", e, failed)
				}
			default:
				if !d.ProcessesListed || len(d.Processes) != 2 || failed || own.calls != 0 {
					t.Errorf("listed %v, processes %+v, error %v, own calls %d; want go-nvml's processes", d.ProcessesListed, d.Processes, e, own.calls)
				}
			}
			wantValue(t, "memory still read", d.MemoryTotalBytes, 80*gib)
		})
	}
}

// On long-record drivers the MIG devices' lists are read with the own calls too, each by its slot.
func TestLongProcessRecordsOfMIGDevices(t *testing.T) {
	mig0 := newMIGDevice("MIG-a", 1, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40*gib, gib)
	mig1 := newMIGDevice("MIG-b", 2, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40*gib, gib)
	s := newSource(t, withoutSymbols(newLibrary(newMIGParent(nil, mig0, nil, mig1)), symProcessDetailList))
	s.records = &fakeRecords{lists: map[deviceRef][3][]gonvml.ProcessInfo{
		{gpu: 0, migSlot: 1}: {{proc(30, gib)}, nil, nil},
		{gpu: 0, migSlot: 3}: {{proc(31, gib)}, nil, {proc(31, gib)}},
	}}
	snap := snapshot(t, s)
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-MIG")
	if p := processByPID(t, d, 30); !p.MIG || p.GPUInstance != 1 || p.Type != gpu.ProcessCompute {
		t.Errorf("PID 30 = %+v, want a compute process on GPU instance 1", p)
	}
	if p := processByPID(t, d, 31); !p.MIG || p.GPUInstance != 2 || p.Type != gpu.ProcessMPS {
		t.Errorf("PID 31 = %+v, want an MPS process on GPU instance 2", p)
	}
}

// Drivers return garbage samples now and then: 37,100% SM, timestamps from before the asked-for time or from the
// future, PIDs that are not on the GPU. Only samples of listed processes, with every field at most 100% and
// lastSeen < timestamp <= now + slack are kept, and lastSeen advances only from kept samples. A process whose only
// samples were garbage has no value rather than a made-up 0.
func TestProcessUtilizationDropsGarbageSamples(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetComputeRunningProcessesFunc = procs(proc(10, gib), proc(20, gib), proc(30, gib), proc(40, gib))
	now := uint64(testNow.UnixMicro())
	since := now - 5_000_000 // the first reading's window
	dev.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		return []gonvml.ProcessUtilizationSample{
			{Pid: 10, TimeStamp: now - 1_000_000, SmUtil: 60, MemUtil: 20},
			{Pid: 10, TimeStamp: now - 500_000, SmUtil: 37100, MemUtil: 20}, // newer, but 37,100%
			{Pid: 20, TimeStamp: now - 900_000, SmUtil: 30, DecUtil: 250},   // decoder over 100%
			{Pid: 30, TimeStamp: now + 60_000_000, SmUtil: 90},              // a minute in the future
			{Pid: 40, TimeStamp: since, SmUtil: 70},                         // not after lastSeen
			{Pid: 99, TimeStamp: now - 100_000, SmUtil: 100},                // not listed on this GPU
		}, gonvml.SUCCESS
	}
	s := newSource(t, newLibrary(dev))
	snap := snapshot(t, s)
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-0")
	wantValue(t, "PID 10 SM (the valid older sample)", processByPID(t, d, 10).SMUtilizationRatio, 0.6)
	for _, pid := range []uint32{20, 30, 40} {
		wantAbsent(t, fmt.Sprintf("PID %d SM (only garbage samples)", pid), processByPID(t, d, pid).SMUtilizationRatio)
	}
	if got, want := s.lastSeen["GPU-0"], now-1_000_000; got != want {
		t.Errorf("lastSeen = %d, want %d (the newest kept sample)", got, want)
	}
	for _, p := range d.Processes {
		if p.SMUtilizationRatio.Valid && p.SMUtilizationRatio.V > 1 {
			t.Errorf("PID %d SM utilization %v > 1", p.PID, p.SMUtilizationRatio.V)
		}
	}
}
