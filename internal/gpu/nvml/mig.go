//go:build linux && cgo

package nvml

import (
	"fmt"
	"math"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// migDevice is a MIG device handle, the slot NVML lists it at, and the instance IDs its processes belong to.
type migDevice struct {
	handle          gonvml.Device
	slot            int
	gpuInstance     int
	computeInstance int
}

// readMIG enumerates the MIG devices of a GPU in MIG mode. Slots without a MIG device answer NOT_FOUND or
// INVALID_ARGUMENT and are skipped; a MIG device whose IDs cannot be read is reported and skipped, because its
// processes could not be told apart from another instance's. complete is false when some MIG device could not be
// read, so that the GPU's process list is not taken as whole.
func (r *deviceReader) readMIG(h gonvml.Device) (instances []gpu.MIGInstance, handles []migDevice, complete bool) {
	if r.lost != nil {
		return nil, nil, false
	}
	slots, ret := h.GetMaxMigDeviceCount()
	if !r.ok(gpu.OpMIG, ret) {
		return nil, nil, false
	}
	complete = true
	for i := 0; i < slots && r.lost == nil; i++ {
		m, ret := h.GetMigDeviceHandleByIndex(i)
		if ret == gonvml.ERROR_NOT_FOUND || ret == gonvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if !r.ok(gpu.OpMIG, ret) {
			complete = false
			continue
		}
		inst, ok := r.readMIGDevice(h, m)
		if !ok {
			complete = false
			continue
		}
		instances = append(instances, inst)
		handles = append(handles, migDevice{handle: m, slot: i, gpuInstance: inst.GPUInstance, computeInstance: inst.ComputeInstance})
	}
	memoryPerGPUInstance(instances)
	return instances, handles, complete
}

// lowestComputeInstances maps each GPU instance to the index in instances of its MIG device with the lowest
// compute instance ID, the one that carries what belongs to the GPU instance (memory, profiling).
func lowestComputeInstances(instances []gpu.MIGInstance) map[int]int {
	first := map[int]int{}
	for i, inst := range instances {
		if j, ok := first[inst.GPUInstance]; !ok || inst.ComputeInstance < instances[j].ComputeInstance {
			first[inst.GPUInstance] = i
		}
	}
	return first
}

// memoryPerGPUInstance keeps the memory of each GPU instance on one of its MIG devices, the one with the lowest
// compute instance ID. Memory belongs to the GPU instance: every MIG device of it answers with the same numbers,
// and repeating them would double-count in every sum.
func memoryPerGPUInstance(instances []gpu.MIGInstance) {
	first := lowestComputeInstances(instances)
	for i := range instances {
		if first[instances[i].GPUInstance] != i {
			instances[i].MemoryTotalBytes, instances[i].MemoryUsedBytes = gpu.Value{}, gpu.Value{}
		}
	}
}

// readMIGDevice reads one MIG device. Its failures are all reported as operation "mig", so that the operation
// names stay a short fixed list.
func (r *deviceReader) readMIGDevice(parent, m gonvml.Device) (gpu.MIGInstance, bool) {
	const op = gpu.OpMIG
	uuid, ret := m.GetUUID()
	if !r.ok(op, ret) {
		return gpu.MIGInstance{}, false
	}
	gi, ret := m.GetGpuInstanceId()
	if !r.ok(op, ret) {
		return gpu.MIGInstance{}, false
	}
	ci, ret := m.GetComputeInstanceId()
	if !r.ok(op, ret) {
		return gpu.MIGInstance{}, false
	}
	inst := gpu.MIGInstance{UUID: uuid, GPUInstance: gi, ComputeInstance: ci}
	inst.Profile = r.migProfile(m, op)
	inst.Placement = r.migPlacement(parent, gi)
	mem := r.readMemory(m, gpu.OpMIGMemory)
	inst.MemoryTotalBytes, inst.MemoryUsedBytes = mem.total, mem.used
	return inst, true
}

// migPlacement reads the GPU instance's profile ID and memory slices, by which NVIDIA's DRA driver names MIG
// devices. NVML lets only privileged users look up GPU instances: NO_PERMISSION leaves the placement unknown
// without an error, as an unsupported value does.
func (r *deviceReader) migPlacement(parent gonvml.Device, gi int) *gpu.MIGPlacement {
	if r.lost != nil {
		return nil
	}
	h, ret := parent.GetGpuInstanceById(gi)
	if ret == gonvml.ERROR_NO_PERMISSION || !r.ok(gpu.OpMIG, ret) {
		return nil
	}
	info, ret := h.GetInfo()
	if ret == gonvml.ERROR_NO_PERMISSION || !r.ok(gpu.OpMIG, ret) {
		return nil
	}
	return &gpu.MIGPlacement{ProfileID: int(info.ProfileId), Start: int(info.Placement.Start), Size: int(info.Placement.Size)}
}

// migProfile names the MIG device's profile. NVML names a MIG device "<GPU name> MIG <profile>", e.g. "NVIDIA H100
// 80GB HBM3 MIG 1g.10gb"; when the name has no such suffix the profile is rebuilt from the slice count and memory
// size the way NVIDIA names profiles (memory rounded up to whole GB).
func (r *deviceReader) migProfile(m gonvml.Device, op gpu.Operation) string {
	if name, ret := m.GetName(); r.ok(op, ret) {
		if i := strings.LastIndex(name, " MIG "); i >= 0 {
			return strings.TrimSpace(name[i+len(" MIG "):])
		}
	}
	if r.lost != nil {
		return ""
	}
	attrs, ret := m.GetAttributes()
	if !r.ok(op, ret) || attrs.GpuInstanceSliceCount == 0 {
		return ""
	}
	gb := int(math.Ceil(float64(attrs.MemorySizeMB) / 1024))
	if c := attrs.ComputeInstanceSliceCount; c > 0 && c < attrs.GpuInstanceSliceCount {
		// A compute instance smaller than its GPU instance, e.g. 1c.3g.40gb.
		return fmt.Sprintf("%dc.%dg.%dgb", c, attrs.GpuInstanceSliceCount, gb)
	}
	return fmt.Sprintf("%dg.%dgb", attrs.GpuInstanceSliceCount, gb)
}
