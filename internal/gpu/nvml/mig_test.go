//go:build linux && cgo

package nvml

import (
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// newMIGDevice is a MIG device handle as NVML returns it from GetMigDeviceHandleByIndex.
func newMIGDevice(uuid string, gi, ci int, name string, memTotal, memUsed uint64, compute ...gonvml.ProcessInfo) *mock.Device {
	return &mock.Device{
		GetUUIDFunc:              func() (string, gonvml.Return) { return uuid, gonvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, gonvml.Return) { return gi, gonvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, gonvml.Return) { return ci, gonvml.SUCCESS },
		GetNameFunc:              func() (string, gonvml.Return) { return name, gonvml.SUCCESS },
		GetMemoryInfo_v2Func: func() (gonvml.Memory_v2, gonvml.Return) {
			return gonvml.Memory_v2{Total: memTotal, Used: memUsed, Free: memTotal - memUsed}, gonvml.SUCCESS
		},
		GetComputeRunningProcessesFunc: procs(compute...),
		// Graphics is not available on MIG devices.
		GetGraphicsRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) {
			return nil, gonvml.ERROR_NOT_SUPPORTED
		},
		GetMPSComputeRunningProcessesFunc: procs(),
	}
}

// newMIGParent is an H100 in MIG mode whose MIG device slots hold the given handles (nil: empty slot).
func newMIGParent(slots ...gonvml.Device) *mock.Device {
	dev := newDevice("GPU-MIG")
	dev.GetMigModeFunc = func() (int, int, gonvml.Return) {
		return gonvml.DEVICE_MIG_ENABLE, gonvml.DEVICE_MIG_ENABLE, gonvml.SUCCESS
	}
	// NVML gives neither device nor per-process utilization in MIG mode.
	dev.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
		return gonvml.Utilization{}, gonvml.ERROR_NOT_SUPPORTED
	}
	dev.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 7, gonvml.SUCCESS }
	// GPU instance n sits at memory slice n, one slice wide, of the 1g.10gb profile (ID 19).
	dev.GetGpuInstanceByIdFunc = func(id int) (gonvml.GpuInstance, gonvml.Return) {
		return &mock.GpuInstance{GetInfoFunc: func() (gonvml.GpuInstanceInfo, gonvml.Return) {
			return gonvml.GpuInstanceInfo{Id: uint32(id), ProfileId: 19, Placement: gonvml.GpuInstancePlacement{Start: uint32(id), Size: 1}}, gonvml.SUCCESS
		}}, gonvml.SUCCESS
	}
	dev.GetMigDeviceHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
		switch {
		case i < len(slots) && slots[i] != nil:
			return slots[i], gonvml.SUCCESS
		case i%2 == 0:
			return nil, gonvml.ERROR_NOT_FOUND
		default:
			return nil, gonvml.ERROR_INVALID_ARGUMENT
		}
	}
	return dev
}

func TestMIGInstancesAndTheirProcesses(t *testing.T) {
	migA := newMIGDevice("MIG-a", 1, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40*gib, 5*gib,
		gonvml.ProcessInfo{Pid: 100, UsedGpuMemory: 3 * gib, GpuInstanceId: 1, ComputeInstanceId: 0},
		gonvml.ProcessInfo{Pid: 300, UsedGpuMemory: 1 * gib, GpuInstanceId: 1, ComputeInstanceId: 0})
	// A name without the profile: it is rebuilt from the attributes. The process comes in a v1 struct.
	migB := newMIGDevice("MIG-b", 2, 0, "NVIDIA H100 80GB HBM3", 10*gib, 2*gib, proc(200, 2*gib), proc(300, gib/2))
	migB.GetAttributesFunc = func() (gonvml.DeviceAttributes, gonvml.Return) {
		return gonvml.DeviceAttributes{GpuInstanceSliceCount: 1, ComputeInstanceSliceCount: 1, MemorySizeMB: 9856}, gonvml.SUCCESS
	}
	parent := newMIGParent(migA, nil, migB)
	parent.GetProcessUtilizationFunc = func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		t.Error("GetProcessUtilization called on a GPU in MIG mode")
		return nil, gonvml.ERROR_NOT_SUPPORTED
	}
	parent.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) {
		t.Error("processes of a GPU in MIG mode must be listed per MIG device")
		return nil, gonvml.SUCCESS
	}
	snap := snapshot(t, newSource(t, newLibrary(parent)))
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-MIG")
	if d.MIGMode != "enabled" {
		t.Errorf("MIGMode = %q", d.MIGMode)
	}
	wantAbsent(t, "utilization in MIG mode", d.UtilizationRatio)

	wantMIG := []gpu.MIGInstance{
		{UUID: "MIG-a", GPUInstance: 1, ComputeInstance: 0, Profile: "3g.40gb"},
		{UUID: "MIG-b", GPUInstance: 2, ComputeInstance: 0, Profile: "1g.10gb"},
	}
	if len(d.MIG) != len(wantMIG) {
		t.Fatalf("MIG = %+v", d.MIG)
	}
	for i, w := range wantMIG {
		got := d.MIG[i]
		if got.UUID != w.UUID || got.GPUInstance != w.GPUInstance || got.ComputeInstance != w.ComputeInstance || got.Profile != w.Profile {
			t.Errorf("MIG %d = %+v, want %+v", i, got, w)
		}
	}
	if p := d.MIG[1].Placement; p == nil || *p != (gpu.MIGPlacement{ProfileID: 19, Start: 2, Size: 1}) {
		t.Errorf("MIG-b placement = %+v, want profile 19 at slice 2, size 1", p)
	}
	wantValue(t, "MIG-a memory total", d.MIG[0].MemoryTotalBytes, 40*gib)
	wantValue(t, "MIG-a memory used", d.MIG[0].MemoryUsedBytes, 5*gib)
	wantValue(t, "MIG-b memory used", d.MIG[1].MemoryUsedBytes, 2*gib)

	if !d.ProcessesListed {
		t.Fatal("processes not listed")
	}
	want := []struct {
		pid    uint32
		gi, ci int
		mem    float64
	}{{100, 1, 0, 3 * gib}, {200, 2, 0, 2 * gib}, {300, 1, 0, gib}, {300, 2, 0, gib / 2}}
	if len(d.Processes) != len(want) {
		t.Fatalf("processes = %+v", d.Processes)
	}
	for i, w := range want {
		p := d.Processes[i]
		if p.PID != w.pid || !p.MIG || p.GPUInstance != w.gi || p.ComputeInstance != w.ci || p.Type != gpu.ProcessCompute {
			t.Errorf("process %d = %+v, want PID %d on GI %d CI %d", i, p, w.pid, w.gi, w.ci)
		}
		wantValue(t, "process memory", p.UsedMemoryBytes, w.mem)
		wantAbsent(t, "process SM utilization in MIG mode", p.SMUtilizationRatio)
	}
}

// A MIG device that cannot be read is reported; the GPU's process list is then incomplete and not claimed.
func TestMIGDeviceFailure(t *testing.T) {
	migA := newMIGDevice("MIG-a", 1, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40*gib, 0, proc(100, gib))
	migB := newMIGDevice("MIG-b", 2, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40*gib, 0, proc(200, gib))
	migB.GetGpuInstanceIdFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
	snap := snapshot(t, newSource(t, newLibrary(newMIGParent(migA, migB))))
	d := deviceByUUID(t, snap, "GPU-MIG")
	if len(d.MIG) != 1 || d.MIG[0].UUID != "MIG-a" {
		t.Errorf("MIG = %+v, want only MIG-a", d.MIG)
	}
	if d.ProcessesListed || len(d.Processes) != 0 {
		t.Errorf("listed %v, processes %+v: want not listed", d.ProcessesListed, d.Processes)
	}
	if e, ok := findError(snap, 0, "mig"); !ok || e.UUID != "GPU-MIG" || !isReturn(e.Err, gonvml.ERROR_UNKNOWN) {
		t.Errorf("mig error = %+v (found %v) in %v", e, ok, snap.Errors)
	}
}

// MIG mode with no instances created: no MIG devices, and an empty process list that is known to be empty.
func TestMIGModeWithoutInstances(t *testing.T) {
	snap := snapshot(t, newSource(t, newLibrary(newMIGParent())))
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-MIG")
	if len(d.MIG) != 0 || !d.ProcessesListed || len(d.Processes) != 0 {
		t.Errorf("MIG %+v, listed %v, processes %+v", d.MIG, d.ProcessesListed, d.Processes)
	}
}

func TestMIGProfileFromAttributes(t *testing.T) {
	for _, tc := range []struct {
		attrs gonvml.DeviceAttributes
		want  string
	}{
		{gonvml.DeviceAttributes{GpuInstanceSliceCount: 7, ComputeInstanceSliceCount: 7, MemorySizeMB: 80 * 1024}, "7g.80gb"},
		{gonvml.DeviceAttributes{GpuInstanceSliceCount: 3, ComputeInstanceSliceCount: 3, MemorySizeMB: 40192}, "3g.40gb"},
		{gonvml.DeviceAttributes{GpuInstanceSliceCount: 3, ComputeInstanceSliceCount: 1, MemorySizeMB: 40192}, "1c.3g.40gb"},
		{gonvml.DeviceAttributes{}, ""},
	} {
		m := &mock.Device{
			GetNameFunc:       func() (string, gonvml.Return) { return "", gonvml.ERROR_NOT_SUPPORTED },
			GetAttributesFunc: func() (gonvml.DeviceAttributes, gonvml.Return) { return tc.attrs, gonvml.SUCCESS },
		}
		r := &deviceReader{s: &Source{warned: map[string]bool{}}}
		if got := r.migProfile(m, "mig"); got != tc.want {
			t.Errorf("profile of %+v = %q, want %q", tc.attrs, got, tc.want)
		}
	}
}

// Where MIG device handles do not give per-instance process lists, the parent's aggregate list is used, with the
// instance IDs NVML puts in each entry.
func TestMIGProcessesFromParentWhenPerInstanceUnsupported(t *testing.T) {
	migA := newMIGDevice("MIG-a", 1, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40*gib, 0)
	migA.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
	parent := newMIGParent(migA)
	parent.GetComputeRunningProcessesFunc = procs(
		gonvml.ProcessInfo{Pid: 100, UsedGpuMemory: gib, GpuInstanceId: 1, ComputeInstanceId: 0},
		gonvml.ProcessInfo{Pid: 200, UsedGpuMemory: gib, GpuInstanceId: 5, ComputeInstanceId: 2},
		proc(300, gib))
	snap := snapshot(t, newSource(t, newLibrary(parent)))
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-MIG")
	if !d.ProcessesListed || len(d.Processes) != 3 {
		t.Fatalf("listed %v, processes %+v", d.ProcessesListed, d.Processes)
	}
	for i, w := range []struct {
		mig    bool
		gi, ci int
	}{{true, 1, 0}, {true, 5, 2}, {false, 0, 0}} {
		p := d.Processes[i]
		if p.MIG != w.mig || p.GPUInstance != w.gi || p.ComputeInstance != w.ci {
			t.Errorf("process %d = %+v, want MIG %v GI %d CI %d", i, p, w.mig, w.gi, w.ci)
		}
	}
}

// A driver older than R450 has no MIG queries: the GPU is read as one without MIG, and none is called.
func TestNoMIGQueriesWithoutMIGSymbols(t *testing.T) {
	dev := newDevice("GPU-0")
	dev.GetMigModeFunc = func() (int, int, gonvml.Return) {
		t.Error("GetMigMode called although the driver lacks it")
		return 0, 0, gonvml.ERROR_UNKNOWN
	}
	snap := snapshot(t, newSource(t, withoutSymbols(newLibrary(dev), symMIGMode)))
	wantNoErrors(t, snap)
	if d := deviceByUUID(t, snap, "GPU-0"); d.MIGMode != gpu.MIGUnsupported || !d.ProcessesListed {
		t.Errorf("MIG mode %q, processes listed %v", d.MIGMode, d.ProcessesListed)
	}
	// The minor number is older than MIG, and names the GPU to NVIDIA's DRA driver.
	if d := deviceByUUID(t, snap, "GPU-0"); !d.MinorNumber.Valid {
		t.Errorf("minor number %+v without MIG symbols, want it read", d.MinorNumber)
	}
}

// Compute instances of one GPU instance share its memory, and each MIG device handle answers with the GPU
// instance's numbers. They are reported once per GPU instance, on its lowest compute instance, so that sums over
// MIG devices do not count them twice.
func TestMIGMemoryOncePerGPUInstance(t *testing.T) {
	// GPU instance 1 (3g.40gb) split into compute instances 2 and 0 (enumerated in that order); GPU instance 2
	// with one compute instance.
	ci2 := newMIGDevice("MIG-1-2", 1, 2, "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", 40*gib, 6*gib)
	ci0 := newMIGDevice("MIG-1-0", 1, 0, "NVIDIA H100 80GB HBM3 MIG 2c.3g.40gb", 40*gib, 6*gib)
	other := newMIGDevice("MIG-2-0", 2, 0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10*gib, gib)
	snap := snapshot(t, newSource(t, newLibrary(newMIGParent(ci2, ci0, other))))
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-MIG")
	var total, used float64
	byUUID := map[string]gpu.MIGInstance{}
	for _, m := range d.MIG {
		byUUID[m.UUID] = m
		total += m.MemoryTotalBytes.V
		used += m.MemoryUsedBytes.V
	}
	wantValue(t, "GI 1 memory on CI 0", byUUID["MIG-1-0"].MemoryTotalBytes, 40*gib)
	wantValue(t, "GI 1 used memory on CI 0", byUUID["MIG-1-0"].MemoryUsedBytes, 6*gib)
	wantAbsent(t, "GI 1 memory on CI 2", byUUID["MIG-1-2"].MemoryTotalBytes)
	wantAbsent(t, "GI 1 used memory on CI 2", byUUID["MIG-1-2"].MemoryUsedBytes)
	wantValue(t, "GI 2 memory", byUUID["MIG-2-0"].MemoryTotalBytes, 10*gib)
	if total != 50*gib || used != 7*gib {
		t.Errorf("sums over MIG devices: total %v, used %v; want 50 GiB and 7 GiB", total/gib, used/gib)
	}
}

// NVML gives GPU instances to privileged users only: without the privilege the placement is unknown, quietly.
func TestMIGPlacementNeedsPrivilege(t *testing.T) {
	parent := newMIGParent(newMIGDevice("MIG-a", 1, 0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10*gib, 0))
	parent.GetGpuInstanceByIdFunc = func(int) (gonvml.GpuInstance, gonvml.Return) { return nil, gonvml.ERROR_NO_PERMISSION }
	snap := snapshot(t, newSource(t, newLibrary(parent)))
	wantNoErrors(t, snap)
	if d := deviceByUUID(t, snap, "GPU-MIG"); len(d.MIG) != 1 || d.MIG[0].Placement != nil {
		t.Errorf("MIG = %+v, want one instance without placement", d.MIG)
	}
}

// The minor number is read, and it is not the index: NVIDIA's DRA driver names GPUs by it.
func TestMinorNumber(t *testing.T) {
	dev0, dev1 := newDevice("GPU-0"), newDevice("GPU-1")
	dev0.GetMinorNumberFunc = func() (int, gonvml.Return) { return 3, gonvml.SUCCESS }
	dev1.GetMinorNumberFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	snap := snapshot(t, newSource(t, newLibrary(dev0, dev1)))
	wantValue(t, "GPU 0 minor number", deviceByUUID(t, snap, "GPU-0").MinorNumber, 3)
	wantAbsent(t, "GPU 1 minor number", deviceByUUID(t, snap, "GPU-1").MinorNumber)
}
