package nvidiasmi

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Each schema version prints the health signals in its own elements; one real file per version shows that they are
// read, and that what a version lacks stays absent.
func TestHealthBySchemaVersion(t *testing.T) {
	v := func(f float64) string { return fmt.Sprint(gpu.Known(f)) }
	absent := fmt.Sprint(gpu.Value{})
	active := func(d gpu.Device) string {
		var on []string
		for _, e := range d.Health.ClockEvents {
			if e.Active {
				on = append(on, e.Reason)
			}
		}
		return fmt.Sprintf("%d reasons, active %v", len(d.Health.ClockEvents), on)
	}
	for _, tc := range []struct {
		file   string
		device int
		check  func(d gpu.Device) map[string][2]string // name: got, want
	}{
		// v10 (440): clocks_throttle_reasons, of which this Maxwell prints two N/A; power_readings; no remapped rows,
		// recovery action or fabric.
		{"e7d-nvidiasmi-dfd392e__nvidia-smi.sample.xml", 0, func(d gpu.Device) map[string][2]string {
			return map[string][2]string{
				"clock events":     {active(d), "7 reasons, active []"},
				"management limit": {fmt.Sprint(d.PowerManagementLimitWatts), v(196)},
				"remap pending":    {fmt.Sprint(d.Health.RemapPending), absent},
				"recovery action":  {fmt.Sprint(d.Health.RecoveryAction), absent},
				"violations":       {fmt.Sprint(d.Health.Violations), "[]"},
			}
		}},
		// v11 (460), Volta: retired pages, HBM2 temperature; power_limit is the management limit.
		{"datakit-3eece3f__tesla-v100-pcie-v11.xml", 0, func(d gpu.Device) map[string][2]string {
			return map[string][2]string{
				"retired single bit":  {fmt.Sprint(d.Health.RetiredPagesSingleBit), v(0)},
				"retirement pending":  {fmt.Sprint(d.Health.RetirementPending), v(0)},
				"memory temperature":  {fmt.Sprint(d.MemoryTemperatureCelsius), v(65)},
				"remapped rows":       {fmt.Sprint(d.Health.CorrectableRemappedRows), absent},
				"pcie":                {fmt.Sprint(d.PCIe.Generation, d.PCIe.MaxGeneration, d.PCIe.Width, d.PCIe.MaxWidth), fmt.Sprint(gpu.Known(3), gpu.Known(3), gpu.Known(16), gpu.Known(16))},
				"vgpu (pass-through)": {fmt.Sprint(d.VGPULicensed), v(0)},
			}
		}},
		// v11: a V100S held at its power cap while busy.
		{"datakit-3eece3f__8-tesla-v100s-v11.xml", 3, func(d gpu.Device) map[string][2]string {
			return map[string][2]string{"clock events": {active(d), "9 reasons, active [sw_power_cap]"}}
		}},
		// v12 (535), A100 in MIG mode: remapped rows are N/A in MIG mode; requested_power_limit.
		{"telegraf__a100-sxm4-v12.xml", 0, func(d gpu.Device) map[string][2]string {
			return map[string][2]string{
				"remapped rows":      {fmt.Sprint(d.Health.UncorrectableRemappedRows), absent},
				"memory temperature": {fmt.Sprint(d.MemoryTemperatureCelsius), v(44)},
				"management limit":   {fmt.Sprint(d.PowerManagementLimitWatts), v(500)},
				"enforced limit":     {fmt.Sprint(d.PowerLimitWatts), v(500)},
				"fabric (N/A)":       {fmt.Sprint(d.Health.FabricState), absent},
			}
		}},
		// v11 (515), Ampere outside MIG mode: remapped rows.
		{"telegraf__a10g.xml", 0, func(d gpu.Device) map[string][2]string {
			return map[string][2]string{
				"remapped rows": {fmt.Sprint(d.Health.CorrectableRemappedRows, d.Health.UncorrectableRemappedRows, d.Health.RemapPending,
					d.Health.RemapFailure), fmt.Sprint(gpu.Known(0), gpu.Known(0), gpu.Known(0), gpu.Known(0))},
				"pcie width": {fmt.Sprint(d.PCIe.Width, d.PCIe.MaxWidth), fmt.Sprint(gpu.Known(8), gpu.Known(16))},
			}
		}},
		// v12 (535), GeForce: clocks_event_reasons; a GeForce prints no remapped rows.
		{"e7d-nvidiasmi__nvidia-smi.sample.xml", 0, func(d gpu.Device) map[string][2]string {
			return map[string][2]string{
				"remap failure": {fmt.Sprint(d.Health.RemapFailure), absent},
				"clock events":  {active(d), "9 reasons, active [gpu_idle]"},
				"pcie":          {fmt.Sprint(d.PCIe.Generation, d.PCIe.MaxGeneration), fmt.Sprint(gpu.Known(1), gpu.Known(4))},
			}
		}},
		// v13 (590): clock event counters and the recovery action.
		{"telegraf-pr58ff61d__pro-6000-maxq-blackwell-v13.xml", 0, func(d gpu.Device) map[string][2]string {
			return map[string][2]string{
				"violations":      {fmt.Sprint(d.Health.Violations), "[{power 25483.012608} {sync_boost 0} {sw_thermal_slowdown 0} {hw_thermal_slowdown 0} {hw_power_brake_slowdown 0}]"},
				"recovery action": {fmt.Sprint(d.Health.RecoveryAction), v(0)},
				"remapped rows":   {fmt.Sprint(d.Health.CorrectableRemappedRows, d.Health.RemapPending), fmt.Sprint(gpu.Known(0), gpu.Known(0))},
			}
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			snap, err := Parse(f)
			if err != nil {
				t.Fatal(err)
			}
			for name, c := range tc.check(snap.Devices[tc.device]) {
				if c[0] != c[1] {
					t.Errorf("%s = %s, want %s", name, c[0], c[1])
				}
			}
		})
	}
}

// tx_util and rx_util are rates over 20 ms: they are neither the link's byte counters nor the performance monitor's
// rates, and nothing is made of them.
func TestPCIeRatesAreNotCounters(t *testing.T) {
	doc := `<nvidia_smi_log><gpu><uuid>GPU-1</uuid><pci><tx_util>4000 KB/s</tx_util><rx_util>2000 KB/s</rx_util>` +
		`</pci></gpu></nvidia_smi_log>`
	snap, err := Parse(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	d := snap.Devices[0]
	if d.PCIe.TXBytes.Valid || d.PCIe.RXBytes.Valid || d.Profiling != nil {
		t.Errorf("PCIe = %+v, profiling %+v: want no counters and no profiling", d.PCIe, d.Profiling)
	}
}

// The XML names map onto the names the Snapshot uses, in the same order. nvidia-smi prints nine of them (up to 610);
// NVML's later reasons stay absent.
func TestTablesUseSnapshotNames(t *testing.T) {
	last := -1
	for _, r := range clockEventReasons {
		i := slices.Index(gpu.ClockEventReasons, r.reason)
		if i <= last {
			t.Errorf("clock event reason %q is not in gpu.ClockEventReasons after the one before it", r.reason)
		}
		last = i
	}
	if len(clockEventReasons) != 9 {
		t.Errorf("%d clock event reasons, want the nine nvidia-smi prints", len(clockEventReasons))
	}
	for _, c := range clockEventCounters {
		if !slices.Contains(gpu.ViolationPolicies, c.policy) {
			t.Errorf("counter %s gives policy %q, not one of gpu.ViolationPolicies", c.element, c.policy)
		}
	}
}
