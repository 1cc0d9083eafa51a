// Package stubnvml builds the stub libnvidia-ml.so.1 that the NVML source is tested on (testdata/libnvidia-ml.c),
// for one driver generation and GPU model, and says what each build answers, so that every test that reads the
// stub through go-nvml's real dlopen path (the NVML source's, the rendering of its families, the end-to-end tests)
// checks exact values against one table. It is for tests only.
package stubnvml

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

//go:embed testdata/libnvidia-ml.c
var source []byte

// Variant is one build of the stub: a driver generation and a GPU model, two GPUs of it.
type Variant struct {
	Name          string
	DriverVersion string
	GPUName       string
	branch        int    // the driver's major version
	defines       string // the compile-time selection in libnvidia-ml.c
	model         string
}

// The builds the tests use.
var (
	// H100R580 is a current driver on Hopper: every field, GPM profiling, the NVSwitch fabric.
	H100R580 = Variant{Name: "H100 R580", DriverVersion: "580.95.05", GPUName: "NVIDIA H100 80GB HBM3", branch: 580, model: "H100"}
	// A100R580 is a current driver on Ampere: no GPM, so no profiling; no fabric probe.
	A100R580 = Variant{Name: "A100 R580", DriverVersion: "580.95.05", GPUName: "NVIDIA A100-SXM4-80GB", branch: 580,
		defines: "STUB_GPU_A100", model: "A100"}
	// H100R535 is 535.54.03, whose _v3 process lists write 32-byte records (go-nvml#75); no PCIe byte counters,
	// recovery action or versioned fabric information yet.
	H100R535 = Variant{Name: "H100 535.54", DriverVersion: "535.54.03", GPUName: "NVIDIA H100 80GB HBM3", branch: 535, model: "H100",
		defines: "STUB_DRIVER_535"}
	// V100R470 is R470 on Volta: no memory v2, no GPM, clock "throttle" reasons, retired pages instead of remapped rows.
	V100R470 = Variant{Name: "V100 R470", DriverVersion: "470.256.02", GPUName: "Tesla V100-SXM2-32GB", branch: 470,
		defines: "STUB_DRIVER_470 STUB_GPU_V100", model: "V100"}
)

// The stub's memory, the same in every build: an H100's 80 GiB, 479 MiB of it reserved by the driver, 3 GiB used
// by processes.
const (
	MemoryTotal    = 80 << 30
	MemoryReserved = 479 << 20
	MemoryUsed     = 3 << 30
)

// Build compiles the stub with gcc (cgo, which go-nvml needs, needs it too) against go-nvml's copy of nvml.h, the
// header the bindings were generated from, and returns the path of the library, named libnvidia-ml.so.1 in a
// directory of its own (for LD_LIBRARY_PATH). It runs in the test's module.
func (v Variant) Build(tb testing.TB) string {
	tb.Helper()
	lib, err := v.BuildIn(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return lib
}

// BuildIn is Build for a program that is not a test (the benchmark): it builds the library in dir, which should
// be a directory of its own.
func (v Variant) BuildIn(dir string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		return "", fmt.Errorf("finding go-nvml's module directory: %w", err)
	}
	include := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	src := filepath.Join(dir, "libnvidia-ml.c")
	if err := os.WriteFile(src, source, 0o600); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libnvidia-ml.so.1")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	args := []string{"-std=c11", "-Wall", "-Wextra", "-Wno-deprecated-declarations", "-shared", "-fPIC",
		"-DNVML_NO_UNVERSIONED_FUNC_DEFS=1", "-I", include, "-o", lib, src}
	for _, d := range strings.Fields(v.defines) {
		args = append(args, "-D"+d)
	}
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the stub NVML library (%s): %w\n%s", v.Name, err, out)
	}
	return lib, nil
}

// Processes of GPU 0: PIDs 1001 and 1002 using 1 and 2 GiB; 1002 also draws (graphics list).
const (
	FirstPID = 1001
	GiB      = 1 << 30
)

// ClockEventReasons are the reasons every build supports (mask 0xFF: all of R535's but the display clock); the GPU
// is held at its power cap.
var ClockEventReasons = gpu.ClockEventReasons[:8]

// NVLinks is the number of NVLinks of each GPU of the build.
func (v Variant) NVLinks() int {
	switch v.model {
	case "V100":
		return 6
	case "A100":
		return 12
	}
	return 18
}

// HasGPM says whether the build's GPUs have a performance monitor (Hopper and newer, R520 and later).
func (v Variant) HasGPM() bool { return v.model == "H100" && v.branch >= 520 }

// Device is what the NVML source must read from GPU index (0 or 1) of the build, with STUB_NVML_MIG unset: identity,
// memory, and the device health fields. Processes, XID errors and Profiling are not in it (see Profiling).
func (v Variant) Device(index int) gpu.Device {
	k := gpu.Known
	d := gpu.Device{
		Index:                   index,
		UUID:                    fmt.Sprintf("GPU-stub-%d", index),
		Name:                    v.GPUName,
		Vendor:                  gpu.VendorNVIDIA,
		PCIBusID:                fmt.Sprintf("00000000:%02X:00.0", 0x18+index),
		MinorNumber:             k(float64(2*index + 1)),
		MIGMode:                 gpu.MIGDisabled,
		MemoryTotalBytes:        k(MemoryTotal),
		MemoryUsedBytes:         k(MemoryUsed),
		MemoryFreeBytes:         k(MemoryTotal - MemoryReserved - MemoryUsed),
		MemoryReservedBytes:     k(MemoryReserved),
		UtilizationRatio:        k(0.4),
		MemoryUtilizationRatio:  k(0.2),
		EncoderUtilizationRatio: k(0),
		DecoderUtilizationRatio: k(0),
		TemperatureCelsius:      k(41),
		PowerUsageWatts:         k(120),
		PowerLimitWatts:         k(650),
		EnergyJoules:            k(5000),
		PerformanceState:        k(0),
		Clocks: []gpu.Clock{{Name: "graphics", Hertz: 1980e6}, {Name: "sm", Hertz: 1980e6},
			{Name: "memory", Hertz: 1980e6}, {Name: "video", Hertz: 1980e6}},
		ECCErrors:                 []gpu.ECCCount{{Type: "corrected", Count: 7}, {Type: "uncorrected", Count: 2}},
		PowerManagementLimitWatts: k(700),
		VGPULicensed:              k(0),
		PCIe:                      gpu.PCIe{Replays: k(12), Generation: k(5), MaxGeneration: k(5), Width: k(16), MaxWidth: k(16)},
		NVLink:                    gpu.NVLink{TXBytes: k(123456 * 1024), RXBytes: k(654321 * 1024)},
	}
	if v.HasGPM() {
		d.PerformanceMonitor = k(1)
	} else {
		d.PerformanceMonitor = k(0)
	}
	if v.branch < 510 {
		d.MemoryUsedBytes, d.MemoryFreeBytes = k(MemoryUsed+MemoryReserved), k(MemoryTotal-MemoryReserved-MemoryUsed)
		d.MemoryReservedBytes = gpu.Value{}
	}
	if v.model == "V100" {
		d.MIGMode = gpu.MIGUnsupported
	}
	if index == 0 {
		d.MemoryTemperatureCelsius = k(38) // GPU 1 has none, as GPUs without HBM
	} else {
		d.PCIe.Width = k(8) // half of its 16 lanes: a degraded link
	}
	if v.branch >= 555 {
		d.PCIe.TXBytes, d.PCIe.RXBytes = k(5e12), k(7e12)
	}
	for l := range v.NVLinks() {
		active := 1.0
		if l == 3 {
			active = 0
		}
		d.NVLink.Links = append(d.NVLink.Links, gpu.NVLinkLink{Link: l, Active: k(active), CRCFlitErrors: k(float64(10 + l)),
			CRCDataErrors: k(float64(l)), ReplayErrors: k(float64(2 * l)), RecoveryErrors: k(float64(l % 2))})
	}
	h := &d.Health
	if v.model == "V100" {
		h.RetiredPagesSingleBit, h.RetiredPagesDoubleBit, h.RetirementPending = k(5), k(1), k(0)
	} else if index == 0 {
		h.CorrectableRemappedRows, h.UncorrectableRemappedRows, h.RemapPending, h.RemapFailure = k(2), k(1), k(0), k(0)
	} else {
		h.CorrectableRemappedRows, h.UncorrectableRemappedRows, h.RemapPending, h.RemapFailure = k(0), k(3), k(1), k(1)
	}
	for _, r := range ClockEventReasons {
		h.ClockEvents = append(h.ClockEvents, gpu.ClockEvent{Reason: r, Active: r == "sw_power_cap"})
	}
	h.Violations = []gpu.Violation{{Policy: "power", Seconds: 1.5}, {Policy: "thermal", Seconds: 0.25},
		{Policy: "sync_boost", Seconds: 0}, {Policy: "board_limit", Seconds: 3}, {Policy: "low_utilization", Seconds: 72.5}}
	if v.branch >= 575 {
		h.Violations = append(h.Violations, gpu.Violation{Policy: "sw_thermal_slowdown", Seconds: 0.4},
			gpu.Violation{Policy: "hw_thermal_slowdown", Seconds: 0}, gpu.Violation{Policy: "hw_power_brake_slowdown", Seconds: 2})
	}
	if v.branch >= 565 {
		h.RecoveryAction = k(float64(index)) // GPU 1 needs a reset
	}
	if v.branch >= 550 && v.model == "H100" {
		h.FabricState, h.FabricHealthy = k(3), k(float64(1-index)) // GPU 1's bandwidth is degraded
	}
	return d
}

// Profiling is what the NVML source must compute from two readings of a GPU (gi 0) or of GPU instance gi of GPU 1
// in MIG mode: the stub's GPU instance gi has the GPU's values divided by 2^gi, and no NVLink metrics. Nil where
// the build has no GPM.
func (v Variant) Profiling(gi int) *gpu.Profiling {
	if !v.HasGPM() {
		return nil
	}
	div := float64(int(1) << gi)
	ratio := func(percent float64) gpu.Value { return gpu.Known(percent / div / 100) }
	rate := func(mibPerSecond float64) gpu.Value { return gpu.Known(mibPerSecond / div * (1 << 20)) }
	p := &gpu.Profiling{
		GraphicsEngineActive: ratio(85), SMActive: ratio(72.5), SMOccupancy: ratio(40), TensorActive: ratio(55),
		DRAMActive: ratio(30), FP64Active: ratio(2.5), FP32Active: ratio(20), FP16Active: ratio(12.5),
		PCIeTXBytesPerSecond: rate(1024), PCIeRXBytesPerSecond: rate(2048),
	}
	if gi == 0 {
		p.NVLinkTXBytesPerSecond, p.NVLinkRXBytesPerSecond = rate(8192), rate(4096)
	}
	return p
}
