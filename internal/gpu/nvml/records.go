//go:build linux && cgo

package nvml

// The _v3 process lists of 535.43.02 to 535.86.x write 32-byte records, and go-nvml always passes 24-byte ones
// (go-nvml#75), so on those drivers the source calls the lists itself. go-nvml loads libnvidia-ml.so.1 with
// RTLD_GLOBAL and resolves NVML's functions through the process's global scope; the same lookup here finds the
// same library without knowing its path.

/*
#cgo CFLAGS: -D_GNU_SOURCE
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

// nvmlProcessInfo_t as the headers of 535.43.02 to 535.86.x declared it (nvmlProcessDetail_v1_t in later ones).
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
	unsigned long long usedGpuCcProtectedMemory;
} gpeProcessRecord;

// nvmlDevice_t is a pointer to an opaque struct; nvmlReturn_t an int-sized enum.
typedef int (*gpeListFn)(void *device, unsigned int *count, gpeProcessRecord *records);
typedef int (*gpeHandleByIndexFn)(unsigned int index, void **device);
typedef int (*gpeMIGHandleFn)(void *device, unsigned int index, void **mig);

static void *gpeLookup(const char *name) { return dlsym(RTLD_DEFAULT, name); }

static int gpeList(void *fn, void *device, unsigned int *count, gpeProcessRecord *records) {
	return ((gpeListFn)fn)(device, count, records);
}

static int gpeHandleByIndex(void *fn, unsigned int index, void **device) {
	return ((gpeHandleByIndexFn)fn)(index, device);
}

static int gpeMIGHandle(void *fn, void *device, unsigned int index, void **mig) {
	return ((gpeMIGHandleFn)fn)(device, index, mig);
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// processList is one of NVML's three process lists of a device.
type processList int

const (
	computeList processList = iota
	graphicsList
	mpsList
)

// deviceRef names a GPU, or one of its MIG devices by the slot NVML lists it at, for calls the source makes itself.
type deviceRef struct {
	gpu     int
	migSlot int // -1: the GPU itself
}

// recordLister lists processes on drivers whose _v3 lists write 32-byte records.
type recordLister interface {
	list(list processList, dev deviceRef) ([]gonvml.ProcessInfo, gonvml.Return)
}

// longRecords calls the driver's _v3 process lists with 32-byte records.
type longRecords struct {
	lists         [3]unsafe.Pointer // compute, graphics, MPS; nil where the driver lacks one
	handleByIndex unsafe.Pointer
	migHandle     unsafe.Pointer // nil on drivers without MIG
}

// newLongRecords looks up the functions in the loaded libnvidia-ml.so.1. The compute list and the device lookup
// are required.
func newLongRecords() (*longRecords, error) {
	lookup := func(name string) unsafe.Pointer {
		cname := C.CString(name)
		defer C.free(unsafe.Pointer(cname))
		return C.gpeLookup(cname)
	}
	l := &longRecords{
		lists: [3]unsafe.Pointer{lookup("nvmlDeviceGetComputeRunningProcesses_v3"),
			lookup("nvmlDeviceGetGraphicsRunningProcesses_v3"), lookup("nvmlDeviceGetMPSComputeRunningProcesses_v3")},
		handleByIndex: lookup("nvmlDeviceGetHandleByIndex_v2"),
		migHandle:     lookup("nvmlDeviceGetMigDeviceHandleByIndex"),
	}
	if l.lists[computeList] == nil || l.handleByIndex == nil {
		return nil, fmt.Errorf("looking up NVML's process lists in the loaded libnvidia-ml.so.1: not found " +
			"(the library was not loaded with RTLD_GLOBAL)")
	}
	return l, nil
}

// recordHeadroom is how many records more than the driver announced are passed, for processes that start between
// the count and the read (nvitop passes twice the count and 5 more).
const recordHeadroom = 8

func (l *longRecords) list(list processList, ref deviceRef) ([]gonvml.ProcessInfo, gonvml.Return) {
	fn := l.lists[list]
	if fn == nil {
		return nil, gonvml.ERROR_FUNCTION_NOT_FOUND
	}
	dev, ret := l.handle(ref)
	if ret != gonvml.SUCCESS {
		return nil, ret
	}
	var count C.uint
	ret = gonvml.Return(C.gpeList(fn, dev, &count, nil))
	if ret == gonvml.SUCCESS {
		return nil, ret // no processes
	}
	for range maxSizeRetries {
		if ret != gonvml.ERROR_INSUFFICIENT_SIZE {
			return nil, ret
		}
		n := count + recordHeadroom
		records := make([]C.gpeProcessRecord, n)
		count = n
		ret = gonvml.Return(C.gpeList(fn, dev, &count, &records[0]))
		if ret == gonvml.SUCCESS {
			infos := make([]gonvml.ProcessInfo, min(count, n))
			for i := range infos {
				r := &records[i]
				infos[i] = gonvml.ProcessInfo{Pid: uint32(r.pid), UsedGpuMemory: uint64(r.usedGpuMemory),
					GpuInstanceId: uint32(r.gpuInstanceId), ComputeInstanceId: uint32(r.computeInstanceId)}
			}
			return infos, ret
		}
	}
	return nil, ret
}

// handle gets the driver's handle of the GPU or MIG device, as go-nvml's DeviceGetHandleByIndex and
// GetMigDeviceHandleByIndex do.
func (l *longRecords) handle(ref deviceRef) (unsafe.Pointer, gonvml.Return) {
	var dev unsafe.Pointer
	if ret := gonvml.Return(C.gpeHandleByIndex(l.handleByIndex, C.uint(ref.gpu), &dev)); ret != gonvml.SUCCESS {
		return nil, ret
	}
	if ref.migSlot < 0 {
		return dev, gonvml.SUCCESS
	}
	if l.migHandle == nil {
		return nil, gonvml.ERROR_FUNCTION_NOT_FOUND
	}
	var mig unsafe.Pointer
	if ret := gonvml.Return(C.gpeMIGHandle(l.migHandle, dev, C.uint(ref.migSlot), &mig)); ret != gonvml.SUCCESS {
		return nil, ret
	}
	return mig, gonvml.SUCCESS
}
