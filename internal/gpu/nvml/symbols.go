//go:build linux && cgo

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
	// R535 renamed the clock "throttle" reasons to "event" reasons; the old names stay for older drivers.
	symClocksEventReasons = "nvmlDeviceGetCurrentClocksEventReasons" // 535.43.02
	symFabricInfoV        = "nvmlDeviceGetGpuFabricInfoV"            // R550
	// The vGPU licence structure got its present layout in _v4 (R470); go-nvml calls the newest present with it.
	symGridLicensableFeaturesV4 = "nvmlDeviceGetGridLicensableFeatures_v4"
	symGPMMIGSample             = "nvmlGpmMigSampleGet" // R525
)

// symGPM are the GPM functions of R520 (Hopper's performance monitor); the source uses GPM only where all are present.
var symGPM = []string{"nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet",
	"nvmlGpmMetricsGet"}

// symMPSProcesses are the names of the MPS process list; go-nvml calls the newest one present, or the first.
var symMPSProcesses = []string{"nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2",
	"nvmlDeviceGetMPSComputeRunningProcesses_v3"}

// symbols says which optional NVML functions the loaded library has.
type symbols struct {
	memoryInfoV2 bool
	mig          bool
	mpsProcesses bool
	// processRecordsTooLong marks drivers whose _v3 process lists write 32-byte records (nvmlProcessDetail_v1_t)
	// where the header, and go-nvml, reserve 24 (nvmlProcessInfo_t): 535.43.02 to 535.86.x, whose header declared
	// the longer nvmlProcessInfo_t; 535.98 dropped the _v3 lists and 535.104.05 brought them back with 24-byte
	// records and moved the longer one to nvmlDeviceGetRunningProcessDetailList (go-nvml#75; NVIDIA's headers as
	// nvidia-settings ships them; nvitop's detection). go-nvml would read every record after the first at the wrong
	// offset, and the driver would write past go-nvml's buffer into Go memory, so the source reads these lists
	// itself (records.go).
	processRecordsTooLong bool
	clocksEventReasons    bool
	fabricInfoV           bool
	gridLicensableV4      bool
	gpm                   bool
	gpmMIG                bool
}

// allSymbols is what a current driver has.
var allSymbols = symbols{memoryInfoV2: true, mig: true, mpsProcesses: true, clocksEventReasons: true, fabricInfoV: true,
	gridLicensableV4: true, gpm: true, gpmMIG: true}

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
	hasAll := func(names ...string) bool {
		for _, n := range names {
			if !has(n) {
				return false
			}
		}
		return true
	}
	gpm := hasAll(symGPM...)
	return symbols{
		memoryInfoV2: has(symMemoryInfoV2),
		mig:          has(symMIGMode),
		mpsProcesses: has(symMPSProcesses...),
		processRecordsTooLong: has(symComputeProcessesV3) && has(symConfComputeMemSize) &&
			!has(symProcessDetailList),
		clocksEventReasons: has(symClocksEventReasons),
		fabricInfoV:        has(symFabricInfoV),
		gridLicensableV4:   has(symGridLicensableFeaturesV4),
		gpm:                gpm,
		gpmMIG:             gpm && has(symGPMMIGSample),
	}, nil
}

// errProcessRecordsTooLong is the process-list error on drivers whose _v3 records do not match NVML's header, where
// the source cannot read them itself (its own lookup of the list functions failed).
var errProcessRecordsTooLong = errors.New("this NVIDIA driver (535.43.02 to 535.86.x) writes 32-byte process " +
	"records where NVML's header has 24, and the exporter could not call the driver's process lists itself, so " +
	"they are not read: upgrade the driver to 535.104.05 or later, or run with --gpu.source=nvidia-smi")
