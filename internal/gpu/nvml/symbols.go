package nvml

import (
	"errors"
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// go-nvml binds most NVML functions without checking that the loaded libnvidia-ml.so.1 has them: calling one that
// the driver lacks ends the process with "symbol lookup error" (exit 127), never with ERROR_FUNCTION_NOT_FOUND.
// So every function this source calls that is newer than the oldest driver it supports (R418) is looked up once
// after Init, and the source does not call what is missing.
const (
	symMemoryInfoV2 = "nvmlDeviceGetMemoryInfo_v2" // R510
	symMIGMode      = "nvmlDeviceGetMigMode"       // R450, with the other MIG queries
	// The process lists go-nvml calls in its newest version present, falling back to the unversioned name.
	symComputeProcessesV3 = "nvmlDeviceGetComputeRunningProcesses_v3"
	symConfComputeMemSize = "nvmlDeviceGetConfComputeMemSizeInfo"
	symProcessDetailList  = "nvmlDeviceGetRunningProcessDetailList"
)

// symMPSProcesses are the names of the MPS process list; go-nvml calls the newest one present, or the first.
var symMPSProcesses = []string{"nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2",
	"nvmlDeviceGetMPSComputeRunningProcesses_v3"}

// symbols says which optional NVML functions the loaded library has.
type symbols struct {
	memoryInfoV2 bool
	mig          bool
	mpsProcesses bool
	// processRecordsTooLong marks drivers whose _v3 process lists write 32-byte records (nvmlProcessDetail_v1_t)
	// where the header, and go-nvml, reserve 24 (nvmlProcessInfo_t): 530.x and R535 until R550 replaced the
	// layout with nvmlDeviceGetRunningProcessDetailList (go-nvml#75, nvitop's detection). Every record after the
	// first is read at the wrong offset, and the driver writes past go-nvml's buffer into Go memory.
	processRecordsTooLong bool
}

// allSymbols is what a current driver has.
var allSymbols = symbols{memoryInfoV2: true, mig: true, mpsProcesses: true}

// lookupSymbols asks the loaded library for the optional functions. A library that cannot answer (no
// ExtendedInterface) is taken to be current, which is what go-nvml itself assumes.
func lookupSymbols(lib gonvml.Interface) (syms symbols, err error) {
	defer func() {
		if r := recover(); r != nil {
			syms, err = allSymbols, fmt.Errorf("looking up NVML symbols: %v", r)
		}
	}()
	ext := lib.Extensions()
	if ext == nil {
		return allSymbols, errors.New("looking up NVML symbols: the library has no LookupSymbol")
	}
	has := func(names ...string) bool {
		for _, n := range names {
			if ext.LookupSymbol(n) == nil {
				return true
			}
		}
		return false
	}
	return symbols{
		memoryInfoV2: has(symMemoryInfoV2),
		mig:          has(symMIGMode),
		mpsProcesses: has(symMPSProcesses...),
		processRecordsTooLong: has(symComputeProcessesV3) && has(symConfComputeMemSize) &&
			!has(symProcessDetailList),
	}, nil
}

// errProcessRecordsTooLong is the process-list error on drivers whose _v3 records do not match NVML's header.
var errProcessRecordsTooLong = errors.New("this NVIDIA driver (530.x, or R535 before R550) writes 32-byte process " +
	"records where NVML's header has 24, so its process lists would be read garbled and would overwrite the " +
	"exporter's memory; they are not read: upgrade the driver to R550 or later, or run with --gpu.source=nvidia-smi")
