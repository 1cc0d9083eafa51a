//go:build e2e

package compat

import (
	"math"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvml/stubnvml"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// Through the stub libnvidia-ml on go-nvml's real dlopen path, the real binary writes every field of dcgm-exporter's
// default counter file with the value the stub's table (stubnvml) says NVML gives, in DCGM's name and unit: on the
// H100 variant all of them, the five profiling fields included (from the performance monitor's second reading on);
// on the A100 variant, which has no performance monitor, the same but for the profiling fields, which are absent.
func TestDCGMFieldsThroughTheStubLibrary(t *testing.T) {
	names, _ := defaultCounters(t)
	profiling := map[string]bool{"DCGM_FI_PROF_GR_ENGINE_ACTIVE": true, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": true,
		"DCGM_FI_PROF_DRAM_ACTIVE": true, "DCGM_FI_PROF_PCIE_TX_BYTES": true, "DCGM_FI_PROF_PCIE_RX_BYTES": true}
	for _, v := range []stubnvml.Variant{stubnvml.H100R580, stubnvml.A100R580} {
		t.Run(v.Name, func(t *testing.T) {
			t.Setenv("LD_LIBRARY_PATH", filepath.Dir(v.Build(t)))
			addr := e2eutil.StartExporter(t, binary, "--gpu.source=nvml", "--compat=dcgm", "--path.procfs="+t.TempDir()).Addr
			// The NVLink bandwidth needs two readings, the profiling fields two more than 100 ms apart (NVML's sample
			// refresh); the exporter takes one at start.
			var families map[string]*dto.MetricFamily
			testkit.WaitFor(t, 20*time.Second, "the readings the rates need", func() bool {
				_, families = e2eutil.Scrape(t, addr)
				_, bandwidth := gpu0(families["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"])
				_, monitor := gpu0(families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"])
				return bandwidth && (monitor || !v.HasGPM())
			})
			d, p := v.Device(0), v.Profiling(0)
			want := dcgmValues(d, p)
			for _, name := range names {
				if name == "DCGM_FI_DRIVER_VERSION" {
					for _, m := range families["DCGM_FI_DEV_GPU_TEMP"].GetMetric() {
						if got := e2eutil.Label(m, name); got != v.DriverVersion {
							t.Errorf("%s label = %q, want %q", name, got, v.DriverVersion)
						}
					}
					continue
				}
				got, ok := gpu0(families[name])
				w, known := want[name]
				switch {
				case name == "DCGM_FI_DEV_XID_ERRORS":
					// No XID since the exporter started (the stub raises none without STUB_NVML_XID79): absent.
					if ok {
						t.Errorf("%s = %v, want it absent: no XID was seen", name, got)
					}
				case profiling[name] && !v.HasGPM():
					if ok {
						t.Errorf("%s = %v on a GPU without a performance monitor, want it absent", name, got)
					}
				case !known:
					t.Errorf("%s: the test has no expected value", name)
				case !ok:
					t.Errorf("%s is absent, want %v", name, w)
				case math.Abs(got-w) > 1e-9*math.Max(1, math.Abs(w)):
					t.Errorf("%s = %v, want %v", name, got, w)
				}
			}
		})
	}
}

// gpu0 is the value of GPU 0's one series of a family.
func gpu0(mf *dto.MetricFamily) (float64, bool) {
	for _, m := range mf.GetMetric() {
		if e2eutil.Label(m, "UUID") == "GPU-stub-0" {
			return e2eutil.Value(m), true
		}
	}
	return 0, false
}

// dcgmValues are the default fields' values that DCGM gives for a device that NVML reads as d (and its performance
// monitor as p), in DCGM's units: the conversions DCGM's cache manager applies to the NVML values.
func dcgmValues(d gpu.Device, p *gpu.Profiling) map[string]float64 {
	clock := func(name string) float64 {
		for _, c := range d.Clocks {
			if c.Name == name {
				return c.Hertz / 1e6
			}
		}
		return math.NaN()
	}
	w := map[string]float64{
		"DCGM_FI_DEV_SM_CLOCK": clock("sm"), "DCGM_FI_DEV_MEM_CLOCK": clock("memory"),
		"DCGM_FI_DEV_MEMORY_TEMP": d.MemoryTemperatureCelsius.V, "DCGM_FI_DEV_GPU_TEMP": d.TemperatureCelsius.V,
		"DCGM_FI_DEV_POWER_USAGE": d.PowerUsageWatts.V, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": d.EnergyJoules.V * 1000,
		"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": d.PCIe.Replays.V,
		"DCGM_FI_DEV_GPU_UTIL":            d.UtilizationRatio.V * 100, "DCGM_FI_DEV_MEM_COPY_UTIL": d.MemoryUtilizationRatio.V * 100,
		"DCGM_FI_DEV_ENC_UTIL": d.EncoderUtilizationRatio.V * 100, "DCGM_FI_DEV_DEC_UTIL": d.DecoderUtilizationRatio.V * 100,
		"DCGM_FI_DEV_FB_FREE": d.MemoryFreeBytes.V / mib, "DCGM_FI_DEV_FB_USED": d.MemoryUsedBytes.V / mib,
		"DCGM_FI_DEV_FB_RESERVED": d.MemoryReservedBytes.V / mib,
		// The stub's NVLink counters stand still: no traffic between two readings.
		"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL":      0,
		"DCGM_FI_DEV_VGPU_LICENSE_STATUS":         d.VGPULicensed.V,
		"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": d.Health.UncorrectableRemappedRows.V,
		"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS":   d.Health.CorrectableRemappedRows.V,
		"DCGM_FI_DEV_ROW_REMAP_FAILURE":           d.Health.RemapFailure.V,
	}
	if p != nil {
		w["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] = p.GraphicsEngineActive.V
		w["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] = p.TensorActive.V
		w["DCGM_FI_PROF_DRAM_ACTIVE"] = p.DRAMActive.V
		w["DCGM_FI_PROF_PCIE_TX_BYTES"] = p.PCIeTXBytesPerSecond.V
		w["DCGM_FI_PROF_PCIE_RX_BYTES"] = p.PCIeRXBytesPerSecond.V
	}
	return w
}
