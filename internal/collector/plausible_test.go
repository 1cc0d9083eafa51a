package collector

import (
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// Every device family has a range, and a counter checked for jumps has at most one label, which its state is kept by;
// a --compat=dcgm field written from such a counter follows the family's decisions (dcgmField.counters).
func TestEveryDeviceFamilyHasARange(t *testing.T) {
	for _, f := range deviceFamilies {
		if f.Range == (families.Range{}) || f.Range.Min > f.Range.Max {
			t.Errorf("%s: range %+v", f.Name, f.Range)
		}
		if f.Range.Rate > 0 && (f.typ != counter || len(f.labels) > 1) {
			t.Errorf("%s: a rate bound on a %s with labels %v; want a counter with one label at most", f.Name, f.typ, f.labels)
		}
		for _, d := range f.dcgm {
			if f.Range.Rate > 0 && (d.typ == counter || d.rate) && len(d.counters) == 0 {
				t.Errorf("%s: %s is written from a counter checked for jumps, but does not follow its decisions", f.Name, d.name)
			}
		}
	}
}

// sentinelGPU is a GPU whose driver answered "not available" with NVML_VALUE_NOT_AVAILABLE in each field as the
// source scales it: 0xFFFFFFFF in an unsigned int (utilization in %, temperature in °C, power in mW, the recovery
// action, PCIe replays) and 2^64-1 in an unsigned long long (energy in mJ, NVLink throughput in KiB, ECC counts).
func sentinelGPU() gpu.Device {
	const u32, u64 = math.MaxUint32, math.MaxUint64
	d := gpu.Device{UUID: "GPU-00000000-0000-0000-0000-0000000000f1", Name: "NVIDIA H100 80GB HBM3", Vendor: gpu.VendorNVIDIA,
		MemoryTotalBytes: gpu.Known(85520809984), UtilizationRatio: gpu.Known(u32 / 100.0),
		MemoryUtilizationRatio: gpu.Known(u32 / 100.0), TemperatureCelsius: gpu.Known(u32),
		MemoryTemperatureCelsius: gpu.Known(u32), PowerUsageWatts: gpu.Known(u32 / 1000.0),
		EnergyJoules: gpu.Known(u64 / 1000.0), ECCErrors: []gpu.ECCCount{{Type: "corrected", Count: u64}},
		PCIe:   gpu.PCIe{Replays: gpu.Known(u32), Generation: gpu.Known(5)},
		NVLink: gpu.NVLink{TXBytes: gpu.Known(u64 * 1024), RXBytes: gpu.Known(1 << 40)},
	}
	d.Health.RecoveryAction = gpu.Known(u32)
	return d
}

// Sentinels and garbage are left out, never written as values (a utilization of 4.29e7, 4.29e9 °C, 4.29 MW), and
// counted by family in gpu_pod_exporter_implausible_values_total, once per reading however many scrapes share it.
// The --compat=dcgm fields of those families are left out too (an NVLink rate of 1.5e15 MB/s).
func TestImplausibleValuesAreLeftOut(t *testing.T) {
	d := sentinelGPU()
	snap := &gpu.Snapshot{Time: time.Unix(1765000000, 0), Devices: []gpu.Device{d}}
	c := New(reading.New(fixedSource{snap}, fixedOwners{}, time.Minute, slog.New(slog.DiscardHandler)),
		Options{Compat: []string{CompatDCGM}, CompatHostname: "node"})
	text := gpuFamilies(t, c)
	for _, name := range []string{"gpu_utilization_ratio", "gpu_memory_utilization_ratio", "gpu_temperature_celsius",
		"gpu_memory_temperature_celsius", "gpu_power_usage_watts", "gpu_energy_consumption_joules_total",
		"gpu_ecc_errors_total", "gpu_pcie_replays_total", "gpu_recovery_action", "DCGM_FI_DEV_GPU_UTIL",
		"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
		"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"} {
		if strings.Contains(text, "\n"+name+"{") {
			t.Errorf("%s written from a sentinel:\n%s", name, grepLines(text, name))
		}
	}
	if !strings.Contains(text, `gpu_nvlink_bytes_total{direction="receive",gpu="0",uuid="`+d.UUID+`"} 1.099511627776e+12`) ||
		strings.Contains(text, `direction="transmit"`) {
		t.Errorf("NVLink: want receive written, transmit (2^64-1 KiB) left out:\n%s", grepLines(text, "nvlink"))
	}
	if !strings.Contains(text, "gpu_memory_total_bytes{") || !strings.Contains(text, "gpu_pcie_link_generation{") ||
		!strings.Contains(text, "\nDCGM_FI_DEV_PCIE_LINK_GEN{") {
		t.Errorf("plausible values left out too, or no DCGM field written:\n%s", text)
	}

	// Two scrapes of one reading count it once.
	m := newDeviceMetrics()
	engine := series.NewEngine(m.descs()...)
	r := &reading.Reading{Snapshot: snap}
	for range 2 {
		m.update(engine.Batch(), r)
	}
	want := `# HELP gpu_pod_exporter_implausible_values_total ` + implausibleHelp + `
# TYPE gpu_pod_exporter_implausible_values_total counter
gpu_pod_exporter_implausible_values_total{family="gpu_ecc_errors_total",reason="out_of_range"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_energy_consumption_joules_total",reason="out_of_range"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_memory_temperature_celsius",reason="out_of_range"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_memory_utilization_ratio",reason="out_of_range"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_nvlink_bytes_total",reason="out_of_range"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_pcie_replays_total",reason="out_of_range"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_power_usage_watts",reason="out_of_range"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_recovery_action",reason="out_of_range"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_temperature_celsius",reason="out_of_range"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_utilization_ratio",reason="out_of_range"} 1
`
	if err := testutil.CollectAndCompare(m.plausible, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func grepLines(text, s string) string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}

// A counter that grows faster than it can is left out of that reading, as the energy the accounts use is, and the
// next readings count from it; one that goes back (a driver reload) is written, for Prometheus reads a reset. A
// wrong value undone at the next reading is never seen. --compat=dcgm's field of the same counter follows each
// decision: it writes no value the family left out.
func TestCounterJumpsAreLeftOut(t *testing.T) {
	m := newDeviceMetrics()
	dcgm := newDCGMMetrics("node", DCGMOptions{}, m.plausible)
	engine := series.NewEngine(append(m.descs(), dcgm.descs()...)...)
	start := time.Unix(1765000000, 0)
	energy := func(step int, joules float64) (native, compat bool) {
		t.Helper()
		d := gpu.Device{UUID: "GPU-00000000-0000-0000-0000-0000000000e1", Vendor: gpu.VendorNVIDIA, EnergyJoules: gpu.Known(joules)}
		r := &reading.Reading{Snapshot: &gpu.Snapshot{Time: start.Add(time.Duration(step) * 10 * time.Second), Devices: []gpu.Device{d}}}
		b := engine.Batch()
		m.update(b, r)
		dcgm.update(b, r)
		b.Each(func(desc *series.Desc, _ []string, v float64) {
			native = native || desc.Name() == "gpu_energy_consumption_joules_total" && v == joules
			compat = compat || desc.Name() == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" && v == joules*1000
		})
		return native, compat
	}
	for step, tc := range []struct {
		joules  float64
		written bool
		why     string
	}{
		{1_000_000, true, "the first reading"},
		{1_004_000, true, "400 W for 10 s"},
		{1_004_000 + 1e9, false, "1e9 J in 10 s: 100 MW"},
		{1_008_000, true, "back: the wrong value is undone, and reads as a reset"},
		{1_012_000, true, "400 W"},
		{50, true, "a driver reload: a reset"},
		{math.Nextafter(1e15, 0) + 1e14, false, "past the family's range"},
		{4_050, true, "200 W since the reading before the one left out"},
	} {
		native, compat := energy(step, tc.joules)
		if native != tc.written || compat != tc.written {
			t.Errorf("reading %d (%s): written %v, DCGM %v, want %v", step, tc.why, native, compat, tc.written)
		}
	}
	want := `# HELP gpu_pod_exporter_implausible_values_total ` + implausibleHelp + `
# TYPE gpu_pod_exporter_implausible_values_total counter
gpu_pod_exporter_implausible_values_total{family="gpu_energy_consumption_joules_total",reason="jump"} 1
gpu_pod_exporter_implausible_values_total{family="gpu_energy_consumption_joules_total",reason="out_of_range"} 1
`
	if err := testutil.CollectAndCompare(m.plausible, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// The clock violation time grows by at most a second a second, read about a second apart from a driver that updates
// it in coarse steps: 4 s in a second is written. A counter missing from some readings is checked, when it comes
// back, against its last value and the time since: a wrong value after a gap is not taken as the count to go on
// from, and is left out, as is DCGM's field of it.
func TestViolationTimeAfterAGap(t *testing.T) {
	m := newDeviceMetrics()
	dcgm := newDCGMMetrics("node", DCGMOptions{}, m.plausible)
	engine := series.NewEngine(append(m.descs(), dcgm.descs()...)...)
	start := time.Unix(1765000000, 0)
	violation := func(step int, seconds gpu.Value) (native, compat bool) {
		t.Helper()
		d := gpu.Device{UUID: "GPU-00000000-0000-0000-0000-0000000000e2", Vendor: gpu.VendorNVIDIA}
		if seconds.Valid {
			d.Health.Violations = []gpu.Violation{{Policy: "power", Seconds: seconds.V}}
		}
		r := &reading.Reading{Snapshot: &gpu.Snapshot{Time: start.Add(time.Duration(step) * time.Second), Devices: []gpu.Device{d}}}
		b := engine.Batch()
		m.update(b, r)
		dcgm.update(b, r)
		b.Each(func(desc *series.Desc, _ []string, v float64) {
			native = native || desc.Name() == "gpu_clock_violation_seconds_total" && v == seconds.V
			compat = compat || desc.Name() == "DCGM_FI_DEV_POWER_VIOLATION" && v == seconds.V*1e9
		})
		return native, compat
	}
	for step, tc := range []struct {
		seconds gpu.Value
		written bool
		why     string
	}{
		{gpu.Known(100), true, "the first reading"},
		{gpu.Known(104), true, "4 s in a second: a coarse update"},
		{gpu.Value{}, false, "unknown"},
		{gpu.Value{}, false, "unknown"},
		{gpu.Value{}, false, "unknown"},
		{gpu.Known(5e8), false, "5e8 s after a gap of 4 s: in the range, but no GPU holds its clocks down that long"},
		{gpu.Known(110), true, "the count goes on"},
	} {
		native, compat := violation(step, tc.seconds)
		if native != tc.written || compat != tc.written {
			t.Errorf("reading %d (%s): written %v, DCGM %v, want %v", step, tc.why, native, compat, tc.written)
		}
	}
}
