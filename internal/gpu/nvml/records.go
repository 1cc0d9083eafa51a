//go:build linux && cgo

package nvml

// The source lists a device's processes with calls of its own rather than go-nvml's, for two reasons:
//   - go-nvml repeats a list call for as long as the driver answers INSUFFICIENT_SIZE, doubling its buffer each
//     time, so a driver that keeps asking for more room spins a core inside go-nvml; the source's calls give up
//     after maxSizeRetries and say so;
//   - the _v3 process lists of 535.43.02 to 535.86.x write 32-byte records, and go-nvml always passes 24-byte ones
//     (go-nvml#75).
//
// go-nvml loads libnvidia-ml.so.1 with RTLD_GLOBAL and resolves NVML's functions through the process's global
// scope; the same lookup here finds the same library without knowing its path. Where it finds nothing (go-nvml's
// mocks in tests), the source calls go-nvml's lists.

/*
#cgo CFLAGS: -D_GNU_SOURCE
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

// nvmlDevice_t is a pointer to an opaque struct; nvmlReturn_t an int-sized enum. The records are passed as bytes:
// their layout depends on the list's version (processRecordSize).
typedef int (*gpeListFn)(void *device, unsigned int *count, void *records);
typedef int (*gpeHandleByIndexFn)(unsigned int index, void **device);
typedef int (*gpeMIGHandleFn)(void *device, unsigned int index, void **mig);

static void *gpeLookup(const char *name) { return dlsym(RTLD_DEFAULT, name); }

static int gpeList(void *fn, void *device, unsigned int *count, void *records) {
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
	"encoding/binary"
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

// String names the list as NVML's functions do.
func (l processList) String() string { return [...]string{"compute", "graphics", "MPS compute"}[l] }

// recordLister lists the processes of a device with the source's own calls. An error other than NVML's return
// code is one the source found in the driver's answer.
type recordLister interface {
	list(list processList, dev deviceRef) ([]gonvml.ProcessInfo, gonvml.Return, error)
}

// The record layouts of the process lists: nvmlProcessInfo_v1_t (pid, usedGpuMemory) of the unversioned
// functions; nvmlProcessInfo_t (adding gpuInstanceId and computeInstanceId) of _v2 and _v3; and the
// nvmlProcessInfo_t that 535.43.02 to 535.86.x declared, 8 bytes longer (usedGpuCcProtectedMemory), of their _v3.
const (
	recordV1     = 16
	recordV2     = 24
	recordLongV3 = 32
)

// ownLists calls the driver's process lists.
type ownLists struct {
	lists         [3]unsafe.Pointer // compute, graphics, MPS; nil where the driver lacks one
	recordSize    [3]int
	handleByIndex unsafe.Pointer
	migHandle     unsafe.Pointer // nil on drivers without MIG
}

// listNames are each list's functions, newest first, as go-nvml picks them.
var listNames = [3][3]string{
	{"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses"},
	{"nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses"},
	{"nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses"},
}

// newOwnLists looks up the functions in the loaded libnvidia-ml.so.1, the newest version of each list. longV3 says
// that the driver's _v3 lists write the 32-byte records of 535.43.02 to 535.86.x rather than those of NVML's header,
// which nothing in the library's answers tells apart (the caller recognises such drivers by their symbols). The
// compute list and the device lookup are required.
func newOwnLists(longV3 bool) (*ownLists, error) {
	lookup := func(name string) unsafe.Pointer {
		cname := C.CString(name)
		defer C.free(unsafe.Pointer(cname))
		return C.gpeLookup(cname)
	}
	l := &ownLists{handleByIndex: lookup("nvmlDeviceGetHandleByIndex_v2"), migHandle: lookup("nvmlDeviceGetMigDeviceHandleByIndex")}
	for i, names := range listNames {
		for v, name := range names {
			if fn := lookup(name); fn != nil {
				l.lists[i] = fn
				l.recordSize[i] = [3]int{recordV2, recordV2, recordV1}[v]
				if v == 0 && longV3 {
					l.recordSize[i] = recordLongV3
				}
				break
			}
		}
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

// maxListedProcesses bounds the records passed for one list: a count above it from the driver is an error, not an
// allocation. 64 Ki processes on one GPU is far past what a GPU runs (MPS allows 48 to 60 clients).
const maxListedProcesses = 1 << 16

// tooManyProcessesError is a driver's count of processes on one list above maxListedProcesses.
type tooManyProcessesError struct {
	list  processList
	count uint
}

func (e tooManyProcessesError) Error() string {
	return fmt.Sprintf("NVML counts %d processes in the %s list, more than the %d the exporter reads records for "+
		"(no GPU runs that many: the driver's count is wrong)", e.count, e.list, maxListedProcesses)
}

func (l *ownLists) list(list processList, ref deviceRef) ([]gonvml.ProcessInfo, gonvml.Return, error) {
	fn, size := l.lists[list], l.recordSize[list]
	if fn == nil {
		return nil, gonvml.ERROR_FUNCTION_NOT_FOUND, nil
	}
	dev, ret := l.handle(ref)
	if ret != gonvml.SUCCESS {
		return nil, ret, nil
	}
	var count C.uint
	ret = gonvml.Return(C.gpeList(fn, dev, &count, nil))
	if ret == gonvml.SUCCESS {
		return nil, ret, nil // no processes
	}
	for range maxSizeRetries {
		if ret != gonvml.ERROR_INSUFFICIENT_SIZE {
			return nil, ret, nil
		}
		if count > maxListedProcesses {
			return nil, ret, tooManyProcessesError{list, uint(count)}
		}
		n := count + recordHeadroom
		records := make([]byte, int(n)*size)
		count = n
		ret = gonvml.Return(C.gpeList(fn, dev, &count, unsafe.Pointer(&records[0])))
		if ret == gonvml.SUCCESS {
			return parseRecords(records, int(min(count, n)), size), ret, nil
		}
	}
	return nil, ret, nil
}

// parseRecords reads n records of size bytes: pid at 0, usedGpuMemory at 8, and from version 2 on gpuInstanceId at
// 16 and computeInstanceId at 20 (in version 1, as go-nvml sets them, not a MIG instance).
func parseRecords(b []byte, n, size int) []gonvml.ProcessInfo {
	infos := make([]gonvml.ProcessInfo, n)
	for i := range infos {
		r := b[i*size : (i+1)*size]
		infos[i] = gonvml.ProcessInfo{Pid: binary.NativeEndian.Uint32(r), UsedGpuMemory: binary.NativeEndian.Uint64(r[8:]),
			GpuInstanceId: invalidInstanceID, ComputeInstanceId: invalidInstanceID}
		if size >= recordV2 {
			infos[i].GpuInstanceId, infos[i].ComputeInstanceId = binary.NativeEndian.Uint32(r[16:]), binary.NativeEndian.Uint32(r[20:])
		}
	}
	return infos
}

// handle gets the driver's handle of the GPU or MIG device, as go-nvml's DeviceGetHandleByIndex and
// GetMigDeviceHandleByIndex do.
func (l *ownLists) handle(ref deviceRef) (unsafe.Pointer, gonvml.Return) {
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
