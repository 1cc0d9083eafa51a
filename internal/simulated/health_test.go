package simulated

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Every health key of the file becomes its Snapshot field, and counters grow from the file's value at their rate.
func TestHealthKeysRoundTrip(t *testing.T) {
	file := `gpus:
  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60
    memory_total_bytes: 1000
    memory_used_bytes: 300
    memory_reserved_bytes: 100
    memory_temperature_celsius: -2.5
    power_limit_watts: 500
    power_management_limit_watts: 600
    vgpu_licensed: false
    pcie: {generation: 4, max_generation: 5, width: 8, max_width: 16, replays: 3, tx_bytes: 1000, rx_bytes_per_second: 10}
    nvlink:
      tx_bytes: 5
      tx_bytes_per_second: 2
      links:
        - {link: 1, active: false, crc_flit_errors: 7}
        - {link: 0, active: true, crc_flit_errors: 0, crc_data_errors: 1, replay_errors: 2, recovery_errors: 3}
    remapped_rows: {correctable: 1, uncorrectable: 2, pending: true, failure: false}
    retired_pages: {single_bit: 4, double_bit: 5, pending: true}
    clock_events_active: [sw_power_cap, hw_slowdown]
    violations_seconds: {power: 100, thermal: 7, board_limit: 1}
    recovery_action: drain_and_reset
    fabric: {state: completed, healthy: true}
    profiling:
      graphics_engine_active: 0.8
      sm_active: 0.6
      sm_occupancy: 0.3
      tensor_active: 0.2
      dram_active: 0.9
      fp64_active: 0.1
      fp32_active: 0.15
      fp16_active: 0.05
      pcie_rx_bytes_per_second: 10
      nvlink_tx_bytes_per_second: 2
  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f61
    memory_total_bytes: 1000
    mig_mode: enabled
    mig_instances:
      - {gpu_instance: 1, compute_instance: 0, profiling: {sm_active: 0.5, pcie_tx_bytes_per_second: 4}}
      - {gpu_instance: 1, compute_instance: 1}
`
	cfg, err := parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.snapshot(10).Devices[0]
	k := gpu.Known
	for name, c := range map[string][2]any{
		"reserved":           {d.MemoryReservedBytes, k(100)},
		"free":               {d.MemoryFreeBytes, k(600)}, // total - used - reserved
		"memory temperature": {d.MemoryTemperatureCelsius, k(-2.5)},
		"management limit":   {d.PowerManagementLimitWatts, k(600)},
		"enforced limit":     {d.PowerLimitWatts, k(500)},
		"vgpu":               {d.VGPULicensed, k(0)},
		"pcie":               {d.PCIe, gpu.PCIe{Generation: k(4), MaxGeneration: k(5), Width: k(8), MaxWidth: k(16), Replays: k(3), TXBytes: k(1000), RXBytes: k(100)}},
		"nvlink tx":          {d.NVLink.TXBytes, k(25)},
		"nvlink rx":          {d.NVLink.RXBytes, gpu.Value{}},
		"nvlink links":       {fmt.Sprint(d.NVLink.Links), fmt.Sprint([]gpu.NVLinkLink{{Link: 0, Active: k(1), CRCFlitErrors: k(0), CRCDataErrors: k(1), ReplayErrors: k(2), RecoveryErrors: k(3)}, {Link: 1, Active: k(0), CRCFlitErrors: k(7)}})},
		"remapped":           {fmt.Sprint(d.Health.CorrectableRemappedRows, d.Health.UncorrectableRemappedRows, d.Health.RemapPending, d.Health.RemapFailure), fmt.Sprint(k(1), k(2), k(1), k(0))},
		"retired":            {fmt.Sprint(d.Health.RetiredPagesSingleBit, d.Health.RetiredPagesDoubleBit, d.Health.RetirementPending), fmt.Sprint(k(4), k(5), k(1))},
		"clock events":       {fmt.Sprint(d.Health.ClockEvents), "[{gpu_idle false} {applications_clocks_setting false} {sw_power_cap true} {hw_slowdown true} {sync_boost false} {sw_thermal_slowdown false} {hw_thermal_slowdown false} {hw_power_brake_slowdown false} {display_clock_setting false} {board_limit false} {reliability false}]"},
		"violations":         {fmt.Sprint(d.Health.Violations), "[{power 110} {thermal 7} {board_limit 1}]"}, // power grows while sw_power_cap holds the clocks
		"recovery action":    {d.Health.RecoveryAction, k(4)},
		"fabric":             {fmt.Sprint(d.Health.FabricState, d.Health.FabricHealthy), fmt.Sprint(k(3), k(1))},
		"profiling":          {*d.Profiling, gpu.Profiling{GraphicsEngineActive: k(0.8), SMActive: k(0.6), SMOccupancy: k(0.3), TensorActive: k(0.2), DRAMActive: k(0.9), FP64Active: k(0.1), FP32Active: k(0.15), FP16Active: k(0.05), PCIeRXBytesPerSecond: k(10), NVLinkTXBytesPerSecond: k(2)}},
	} {
		if c[0] != c[1] {
			t.Errorf("%s = %+v, want %+v", name, c[0], c[1])
		}
	}
	mig := cfg.snapshot(10).Devices[1]
	if p := mig.MIG[0].Profiling; p == nil || *p != (gpu.Profiling{SMActive: k(0.5), PCIeTXBytesPerSecond: k(4)}) || mig.MIG[1].Profiling != nil || mig.Profiling != nil {
		t.Errorf("MIG profiling = %+v / %+v, GPU %+v: want the GPU instance's on its first compute instance only", p, mig.MIG[1].Profiling, mig.Profiling)
	}
}

// A GPU without the health keys has none of the readings: absent in the file, absent in the metrics.
func TestHealthAbsentWithoutKeys(t *testing.T) {
	cfg, err := parse([]byte("gpus: [{uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60, memory_total_bytes: 1}]"))
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.snapshot(10).Devices[0]
	if d.PCIe != (gpu.PCIe{}) || d.NVLink.TXBytes.Valid || len(d.NVLink.Links) > 0 || d.Profiling != nil || d.VGPULicensed.Valid ||
		d.MemoryReservedBytes.Valid || len(d.Health.ClockEvents) > 0 || len(d.Health.Violations) > 0 || d.Health.RecoveryAction.Valid ||
		d.Health.FabricState.Valid || d.Health.RemapPending.Valid {
		t.Errorf("device without health keys = %+v", d)
	}
}

func TestHealthKeysRejected(t *testing.T) {
	base := "gpus:\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60\n    memory_total_bytes: 1000\n"
	for _, tc := range []struct{ name, yaml, want string }{
		{"NaN temperature", base + "    memory_temperature_celsius: .nan\n", "line 4: .nan is not a finite number"},
		{"infinite temperature", base + "    temperature_celsius: .inf\n", "line 4: .inf is not a finite number"},
		{"infinite watts", base + "    power_management_limit_watts: .inf\n", "line 4: .inf must be a finite number, not negative"},
		{"infinite rate", base + "    pcie: {tx_bytes_per_second: .Inf}\n", "must be a finite number"},
		{"NaN ratio", base + "    profiling: {sm_active: .nan}\n", "outside 0..1"},
		{"negative count", base + "    pcie: {replays: -1}\n", `"-1" is not a count`},
		{"fractional count", base + "    remapped_rows: {correctable: 1.5}\n", `"1.5" is not a count`},
		{"fractional bytes", base + "    memory_reserved_bytes: 1.5\n", `"1.5" is not a byte count`},
		{"unknown reason", base + "    clock_events_active: [power_cap]\n", `clock event reason "power_cap" is not one of`},
		{"repeated reason", base + "    clock_events_active: [gpu_idle, gpu_idle]\n", "clock_events_active: gpu_idle appears twice"},
		{"unknown policy", base + "    violations_seconds: {thermals: 1}\n", `violation policy "thermals"`},
		{"unknown recovery action", base + "    recovery_action: reset\n", `recovery_action "reset" is not one of`},
		{"unknown fabric state", base + "    fabric: {state: done}\n", `fabric state "done"`},
		{"healthy fabric not completed", base + "    fabric: {state: in_progress, healthy: true}\n", "gpus[0]: fabric: healthy needs state completed"},
		{"health without fabric", base + "    fabric: {state: not_supported, healthy: false}\n", "no fabric health"},
		{"generation above max", base + "    pcie: {generation: 5, max_generation: 4}\n", "gpus[0]: pcie: generation is above max_generation"},
		{"width above max", base + "    pcie: {width: 32, max_width: 16}\n", "pcie: width is above max_width"},
		{"reserved above total", base + "    memory_reserved_bytes: 1001\n", "memory_reserved_bytes is more than memory_total_bytes"},
		{"link twice", base + "    nvlink: {links: [{link: 0}, {link: 0}]}\n", "nvlink.links[1]: link 0 appears twice"},
		{"link without number", base + "    nvlink: {links: [{active: true}]}\n", "nvlink.links[0].link is required"},
		{"SM active above graphics", base + "    profiling: {graphics_engine_active: 0.5, sm_active: 0.6}\n", "profiling: sm_active 0.6 is above graphics_engine_active 0.5"},
		{"tensor above SM", base + "    profiling: {sm_active: 0.2, tensor_active: 0.3}\n", "tensor_active 0.3 is above sm_active 0.2"},
		{"occupancy above SM", base + "    profiling: {sm_active: 0.2, sm_occupancy: 0.3}\n", "sm_occupancy 0.3 is above sm_active 0.2"},
		{"two PCIe rates", base + "    pcie: {tx_bytes_per_second: 5}\n    profiling: {pcie_tx_bytes_per_second: 6}\n", "pcie.tx_bytes_per_second and profiling.pcie_tx_bytes_per_second differ"},
		{"two NVLink rates", base + "    nvlink: {rx_bytes_per_second: 5}\n    profiling: {nvlink_rx_bytes_per_second: 6}\n", "nvlink.rx_bytes_per_second and profiling.nvlink_rx_bytes_per_second differ"},
		{"GPU instance profiled twice", base + "    mig_mode: enabled\n    mig_instances:\n      - {gpu_instance: 1, compute_instance: 0, profiling: {}}\n      - {gpu_instance: 1, compute_instance: 1, profiling: {}}\n",
			"gpus[0].mig_instances[1]: profiling of gpu_instance 1 is given twice"},
		{"bad MIG profiling", base + "    mig_mode: enabled\n    mig_instances:\n      - {gpu_instance: 1, compute_instance: 0, profiling: {graphics_engine_active: 0.1, sm_active: 0.2}}\n",
			"gpus[0].mig_instances[0].profiling: sm_active 0.2 is above"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parse error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// checkHealth holds for every device a valid file gives, at any time: ratios in 0..1 and ordered as validate
// demands, counters finite and not negative.
func checkHealth(t *testing.T, d gpu.Device) {
	t.Helper()
	finite := func(what string, v gpu.Value) {
		if v.Valid && (math.IsNaN(v.V) || math.IsInf(v.V, 0) || v.V < 0) {
			t.Fatalf("%s = %v", what, v.V)
		}
	}
	for what, v := range map[string]gpu.Value{"reserved": d.MemoryReservedBytes, "free": d.MemoryFreeBytes,
		"management limit": d.PowerManagementLimitWatts, "pcie tx": d.PCIe.TXBytes, "pcie rx": d.PCIe.RXBytes,
		"nvlink tx": d.NVLink.TXBytes, "nvlink rx": d.NVLink.RXBytes} {
		finite(what, v)
	}
	for _, v := range d.Health.Violations {
		finite("violation "+v.Policy, gpu.Known(v.Seconds))
	}
	profiles := []*gpu.Profiling{d.Profiling}
	for _, m := range d.MIG {
		profiles = append(profiles, m.Profiling)
	}
	for _, p := range profiles {
		if p == nil {
			continue
		}
		for _, r := range []gpu.Value{p.GraphicsEngineActive, p.SMActive, p.SMOccupancy, p.TensorActive, p.DRAMActive,
			p.FP64Active, p.FP32Active, p.FP16Active} {
			if r.Valid && !(r.V >= 0 && r.V <= 1) {
				t.Fatalf("profiling ratio %v", r.V)
			}
		}
		if p.SMActive.Valid && p.GraphicsEngineActive.Valid && p.SMActive.V > p.GraphicsEngineActive.V {
			t.Fatalf("SM active %v above graphics engine active %v", p.SMActive.V, p.GraphicsEngineActive.V)
		}
	}
}

// The demo shows each health shape docs/reference.md promises, with readings that agree with each other and counters
// that grow between readings.
func TestDemoHealthShapes(t *testing.T) {
	demo := Demo()
	start := demo.loaded
	demo.now = func() time.Time { return start.Add(10 * time.Second) }
	first, err := demo.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	demo.now = func() time.Time { return start.Add(70 * time.Second) }
	later, err := demo.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	active := func(d gpu.Device, reason string) bool {
		return slices.ContainsFunc(d.Health.ClockEvents, func(e gpu.ClockEvent) bool { return e.Reason == reason && e.Active })
	}
	violation := func(d gpu.Device, policy string) float64 {
		for _, v := range d.Health.Violations {
			if v.Policy == policy {
				return v.Seconds
			}
		}
		t.Fatalf("GPU %d has no %s violation time", d.Index, policy)
		return 0
	}
	var profiled, capped, remap, halfWidth, noProfiling int
	for i, d := range first.Devices {
		next := later.Devices[i]
		if d.Profiling != nil && strings.Contains(d.Name, "H100") && d.Profiling.TensorActive.V > 0 && d.Profiling.GraphicsEngineActive.V > 0 {
			profiled++
		}
		if active(d, "sw_power_cap") {
			capped++
			if d.PowerUsageWatts.V < 0.99*d.PowerLimitWatts.V || d.PowerUsageWatts.V > d.PowerLimitWatts.V {
				t.Errorf("GPU %d is held at its power cap but draws %v W of %v W", i, d.PowerUsageWatts.V, d.PowerLimitWatts.V)
			}
			if d.PowerLimitWatts.V > d.PowerManagementLimitWatts.V {
				t.Errorf("GPU %d enforces %v W, above its management limit %v W", i, d.PowerLimitWatts.V, d.PowerManagementLimitWatts.V)
			}
			if got := violation(next, "power") - violation(d, "power"); got != 60 {
				t.Errorf("GPU %d power violation time grew %v s in 60 s held at its cap", i, got)
			}
		}
		if d.Health.RemapPending.V == 1 {
			remap++
			xid48 := slices.ContainsFunc(d.XIDErrors, func(x gpu.XIDCount) bool { return x.XID == 48 && x.Count > 0 })
			uncorrected := slices.ContainsFunc(d.ECCErrors, func(e gpu.ECCCount) bool { return e.Type == "uncorrected" && e.Count > 0 })
			if !xid48 || !uncorrected || d.Health.UncorrectableRemappedRows.V < 1 || d.Health.RecoveryAction != gpu.Known(1) {
				t.Errorf("GPU %d has a pending remap without its XID 48 (%v), uncorrected ECC (%v), remapped row (%v) or reset (%v)",
					i, xid48, uncorrected, d.Health.UncorrectableRemappedRows, d.Health.RecoveryAction)
			}
		}
		if d.PCIe.Width.Valid && d.PCIe.Width.V*2 == d.PCIe.MaxWidth.V && d.UtilizationRatio.V > 0.5 {
			halfWidth++
		}
		if d.Profiling == nil && !strings.Contains(d.Name, "H100") && d.MIGMode != gpu.MIGEnabled {
			noProfiling++
		}
		if active(d, "gpu_idle") && (d.UtilizationRatio.V != 0 || violation(next, "low_utilization")-violation(d, "low_utilization") != 60) {
			t.Errorf("GPU %d: idle clock event with utilization %v or a low utilization time that does not grow", i, d.UtilizationRatio.V)
		}
		// A counter grows at the rate the performance monitor measures for the same traffic.
		if p := d.Profiling; p != nil {
			for _, c := range []struct {
				what        string
				from, to    gpu.Value
				monitorRate gpu.Value
			}{
				{"PCIe TX", d.PCIe.TXBytes, next.PCIe.TXBytes, p.PCIeTXBytesPerSecond},
				{"PCIe RX", d.PCIe.RXBytes, next.PCIe.RXBytes, p.PCIeRXBytesPerSecond},
				{"NVLink TX", d.NVLink.TXBytes, next.NVLink.TXBytes, p.NVLinkTXBytesPerSecond},
				{"NVLink RX", d.NVLink.RXBytes, next.NVLink.RXBytes, p.NVLinkRXBytesPerSecond},
			} {
				if rate := (c.to.V - c.from.V) / 60; !c.from.Valid || !c.monitorRate.Valid || rate != c.monitorRate.V {
					t.Errorf("GPU %d %s counter grows %v B/s, the monitor says %v", i, c.what, rate, c.monitorRate)
				}
			}
		}
		// On a GPU in MIG mode the GPU instances' traffic adds up to the GPU's.
		if len(d.MIG) > 0 {
			var tx, rx float64
			for _, m := range d.MIG {
				if m.Profiling != nil {
					tx, rx = tx+m.Profiling.PCIeTXBytesPerSecond.V, rx+m.Profiling.PCIeRXBytesPerSecond.V
				}
			}
			if gtx, grx := (next.PCIe.TXBytes.V-d.PCIe.TXBytes.V)/60, (next.PCIe.RXBytes.V-d.PCIe.RXBytes.V)/60; gtx != tx || grx != rx {
				t.Errorf("GPU %d moves %v/%v B/s over PCIe, its GPU instances %v/%v", i, gtx, grx, tx, rx)
			}
		}
		if d.MemoryReservedBytes.Valid && d.MemoryUsedBytes.V+d.MemoryFreeBytes.V+d.MemoryReservedBytes.V != d.MemoryTotalBytes.V {
			t.Errorf("GPU %d: used + free + reserved != total", i)
		}
		checkHealth(t, d)
	}
	if profiled == 0 || capped == 0 || remap == 0 || halfWidth == 0 || noProfiling == 0 {
		t.Errorf("demo health shapes: profiled H100=%d power-capped=%d pending remap=%d half-width link=%d without profiling=%d",
			profiled, capped, remap, halfWidth, noProfiling)
	}
}

// Every reading of the Snapshot that a source can fill has data on the demo, so that every family shows.
func TestDemoFillsEveryHealthReading(t *testing.T) {
	snap, err := Demo().Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	mark := func(name string, ok bool) { seen[name] = seen[name] || ok }
	for _, d := range snap.Devices {
		mark("memory reserved", d.MemoryReservedBytes.Valid)
		mark("memory temperature", d.MemoryTemperatureCelsius.Valid)
		mark("power management limit", d.PowerManagementLimitWatts.Valid)
		mark("vgpu licensed", d.VGPULicensed.Valid)
		p := d.PCIe
		mark("pcie", p.Generation.Valid && p.MaxGeneration.Valid && p.Width.Valid && p.MaxWidth.Valid && p.Replays.Valid && p.TXBytes.Valid && p.RXBytes.Valid)
		mark("nvlink", d.NVLink.TXBytes.Valid && d.NVLink.RXBytes.Valid)
		for _, l := range d.NVLink.Links {
			mark("nvlink link", l.Active.Valid && l.CRCFlitErrors.Valid && l.CRCDataErrors.Valid && l.ReplayErrors.Valid && l.RecoveryErrors.Valid)
		}
		h := d.Health
		mark("remapped rows", h.CorrectableRemappedRows.Valid && h.UncorrectableRemappedRows.Valid && h.RemapPending.Valid && h.RemapFailure.Valid)
		mark("clock events", len(h.ClockEvents) == len(gpu.ClockEventReasons))
		mark("violations", len(h.Violations) == len(gpu.ViolationPolicies))
		mark("recovery action", h.RecoveryAction.Valid)
		mark("fabric", h.FabricState.Valid && h.FabricHealthy.Valid)
		if pr := d.Profiling; pr != nil {
			mark("profiling", pr.GraphicsEngineActive.Valid && pr.SMActive.Valid && pr.SMOccupancy.Valid && pr.TensorActive.Valid &&
				pr.DRAMActive.Valid && pr.FP64Active.Valid && pr.FP32Active.Valid && pr.FP16Active.Valid && pr.PCIeTXBytesPerSecond.Valid &&
				pr.PCIeRXBytesPerSecond.Valid && pr.NVLinkTXBytesPerSecond.Valid && pr.NVLinkRXBytesPerSecond.Valid)
		}
		for _, m := range d.MIG {
			mark("MIG profiling", m.Profiling != nil)
		}
	}
	for _, name := range []string{"memory reserved", "memory temperature", "power management limit", "vgpu licensed", "pcie",
		"nvlink", "nvlink link", "remapped rows", "clock events", "violations", "recovery action", "fabric", "profiling", "MIG profiling"} {
		if !seen[name] {
			t.Errorf("no demo GPU has all of its %s readings", name)
		}
	}
}
