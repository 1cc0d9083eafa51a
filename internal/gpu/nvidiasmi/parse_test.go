package nvidiasmi

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/golden"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// TestParseFixtures parses every real nvidia-smi output in testdata and compares it with its reviewed golden file.
func TestParseFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/*.xml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 15 {
		t.Fatalf("found %d fixtures, want every file of shared/testdata/nvidia-smi", len(files))
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			f, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			snap, err := Parse(f)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			checkInvariants(t, snap)
			got := render(snap)
			// Review a new or changed golden file against the XML.
			golden.Check(t, strings.TrimSuffix(file, ".xml")+".golden", got)
		})
	}
}

// render writes a snapshot as stable text that a person can check against the XML. Invalid values are "-"; byte
// counts also show MiB, the unit nvidia-smi prints.
func render(s *gpu.Snapshot) string {
	var b strings.Builder
	fmt.Fprintf(&b, "driver_version %q\ncuda_version %q\n", s.DriverVersion, s.CUDAVersion)
	for _, d := range s.Devices {
		fmt.Fprintf(&b, "\ndevice %d\n", d.Index)
		fmt.Fprintf(&b, "  uuid %q\n  name %q\n  pci_bus_id %q\n  mig_mode %q\n", d.UUID, d.Name, d.PCIBusID, d.MIGMode)
		fmt.Fprintf(&b, "  minor_number %s\n", value(d.MinorNumber, false))
		for _, f := range []struct {
			name string
			v    gpu.Value
		}{
			{"memory_total_bytes", d.MemoryTotalBytes},
			{"memory_used_bytes", d.MemoryUsedBytes},
			{"memory_free_bytes", d.MemoryFreeBytes},
			{"utilization_ratio", d.UtilizationRatio},
			{"memory_utilization_ratio", d.MemoryUtilizationRatio},
			{"encoder_utilization_ratio", d.EncoderUtilizationRatio},
			{"decoder_utilization_ratio", d.DecoderUtilizationRatio},
			{"temperature_celsius", d.TemperatureCelsius},
			{"power_usage_watts", d.PowerUsageWatts},
			{"power_limit_watts", d.PowerLimitWatts},
			{"energy_joules", d.EnergyJoules},
			{"fan_speed_ratio", d.FanSpeedRatio},
			{"performance_state", d.PerformanceState},
			{"memory_reserved_bytes", d.MemoryReservedBytes},
			{"memory_temperature_celsius", d.MemoryTemperatureCelsius},
			{"power_management_limit_watts", d.PowerManagementLimitWatts},
			{"vgpu_licensed", d.VGPULicensed},
		} {
			fmt.Fprintf(&b, "  %s %s\n", f.name, value(f.v, strings.HasSuffix(f.name, "_bytes")))
		}
		renderHealth(&b, d)
		for _, c := range d.Clocks {
			fmt.Fprintf(&b, "  clock %s %s Hz\n", c.Name, num(c.Hertz))
		}
		for _, e := range d.ECCErrors {
			fmt.Fprintf(&b, "  ecc %s %s\n", e.Type, num(e.Count))
		}
		for _, m := range d.MIG {
			fmt.Fprintf(&b, "  mig gi=%d ci=%d uuid=%q profile=%q total=%s used=%s\n", m.GPUInstance, m.ComputeInstance,
				m.UUID, m.Profile, value(m.MemoryTotalBytes, true), value(m.MemoryUsedBytes, true))
		}
		fmt.Fprintf(&b, "  processes_listed %t\n", d.ProcessesListed)
		for _, p := range d.Processes {
			mig := "-"
			if p.MIG {
				mig = fmt.Sprintf("gi=%d ci=%d", p.GPUInstance, p.ComputeInstance)
			}
			fmt.Fprintf(&b, "  process pid=%d type=%q mig=%s used=%s sm=%s name=%q\n", p.PID, p.Type, mig,
				value(p.UsedMemoryBytes, true), value(p.SMUtilizationRatio, false), p.Name)
		}
	}
	for _, e := range s.Errors {
		fmt.Fprintf(&b, "\nerror index=%d uuid=%q %s\n", e.Index, e.UUID, e.Error())
	}
	return b.String()
}

// renderHealth writes the link and health readings, one line per group.
func renderHealth(b *strings.Builder, d gpu.Device) {
	p := d.PCIe
	fmt.Fprintf(b, "  pcie generation=%s/%s width=%s/%s replays=%s tx_bytes=%s rx_bytes=%s\n", value(p.Generation, false),
		value(p.MaxGeneration, false), value(p.Width, false), value(p.MaxWidth, false), value(p.Replays, false),
		value(p.TXBytes, false), value(p.RXBytes, false))
	fmt.Fprintf(b, "  nvlink tx_bytes=%s rx_bytes=%s links=%d\n", value(d.NVLink.TXBytes, false), value(d.NVLink.RXBytes, false),
		len(d.NVLink.Links))
	h := d.Health
	fmt.Fprintf(b, "  remapped_rows correctable=%s uncorrectable=%s pending=%s failure=%s\n", value(h.CorrectableRemappedRows, false),
		value(h.UncorrectableRemappedRows, false), value(h.RemapPending, false), value(h.RemapFailure, false))
	fmt.Fprintf(b, "  retired_pages single_bit=%s double_bit=%s pending=%s\n", value(h.RetiredPagesSingleBit, false),
		value(h.RetiredPagesDoubleBit, false), value(h.RetirementPending, false))
	var events []string
	for _, e := range h.ClockEvents {
		events = append(events, fmt.Sprintf("%s=%t", e.Reason, e.Active))
	}
	fmt.Fprintf(b, "  clock_events %s\n", cmp.Or(strings.Join(events, " "), "-"))
	for _, v := range h.Violations {
		fmt.Fprintf(b, "  violation %s %s s\n", v.Policy, num(v.Seconds))
	}
	fmt.Fprintf(b, "  recovery_action %s fabric_state %s fabric_healthy %s profiling %t\n", value(h.RecoveryAction, false),
		value(h.FabricState, false), value(h.FabricHealthy, false), d.Profiling != nil)
}

func value(v gpu.Value, bytes bool) string {
	if !v.Valid {
		return "-"
	}
	if bytes {
		return fmt.Sprintf("%s (%s MiB)", num(v.V), num(v.V/mib))
	}
	return num(v.V)
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// diff shows the first differing line, enough to find the change in a golden file.
// checkInvariants holds for every snapshot Parse returns, whatever the input.
func checkInvariants(t *testing.T, s *gpu.Snapshot) {
	t.Helper()
	finite := func(what string, v gpu.Value) {
		if v.Valid && (math.IsNaN(v.V) || math.IsInf(v.V, 0)) {
			t.Errorf("%s = %v", what, v.V)
		}
	}
	nonNegative := func(what string, v gpu.Value) {
		finite(what, v)
		if v.Valid && v.V < 0 {
			t.Errorf("%s = %v, want >= 0", what, v.V)
		}
	}
	ratio := func(what string, v gpu.Value) {
		finite(what, v)
		if v.Valid && (v.V < 0 || v.V > 1) {
			t.Errorf("%s = %v, want 0..1", what, v.V)
		}
	}
	seen := map[string]bool{}
	for i, d := range s.Devices {
		if d.UUID == "" {
			t.Errorf("device %d has no UUID", i)
		}
		if seen[d.UUID] {
			t.Logf("device %d repeats UUID %s", i, d.UUID) // possible in garbage input, not an error of Parse
		}
		seen[d.UUID] = true
		if d.MIGMode != "" && d.MIGMode != "enabled" && d.MIGMode != "disabled" {
			t.Errorf("device %d mig mode %q", i, d.MIGMode)
		}
		nonNegative("memory total", d.MemoryTotalBytes)
		nonNegative("memory used", d.MemoryUsedBytes)
		nonNegative("memory free", d.MemoryFreeBytes)
		ratio("utilization", d.UtilizationRatio)
		ratio("memory utilization", d.MemoryUtilizationRatio)
		ratio("encoder utilization", d.EncoderUtilizationRatio)
		ratio("decoder utilization", d.DecoderUtilizationRatio)
		finite("temperature", d.TemperatureCelsius)
		nonNegative("power", d.PowerUsageWatts)
		nonNegative("power limit", d.PowerLimitWatts)
		nonNegative("energy", d.EnergyJoules)
		nonNegative("fan", d.FanSpeedRatio)
		nonNegative("memory reserved", d.MemoryReservedBytes)
		finite("memory temperature", d.MemoryTemperatureCelsius)
		nonNegative("power management limit", d.PowerManagementLimitWatts)
		flag := func(what string, v gpu.Value) {
			if v.Valid && v.V != 0 && v.V != 1 {
				t.Errorf("%s = %v, want 0 or 1", what, v.V)
			}
		}
		whole := func(what string, v gpu.Value) {
			nonNegative(what, v)
			if v.Valid && v.V != math.Trunc(v.V) {
				t.Errorf("%s = %v, want a whole number", what, v.V)
			}
		}
		flag("vgpu licensed", d.VGPULicensed)
		for what, v := range map[string]gpu.Value{"pcie replays": d.PCIe.Replays, "pcie generation": d.PCIe.Generation,
			"pcie max generation": d.PCIe.MaxGeneration, "pcie width": d.PCIe.Width, "pcie max width": d.PCIe.MaxWidth,
			"correctable remapped rows":   d.Health.CorrectableRemappedRows,
			"uncorrectable remapped rows": d.Health.UncorrectableRemappedRows,
			"retired pages single bit":    d.Health.RetiredPagesSingleBit, "retired pages double bit": d.Health.RetiredPagesDoubleBit} {
			whole(what, v)
		}
		for what, v := range map[string]gpu.Value{"remap pending": d.Health.RemapPending, "remap failure": d.Health.RemapFailure,
			"retirement pending": d.Health.RetirementPending, "fabric healthy": d.Health.FabricHealthy} {
			flag(what, v)
		}
		if v := d.Health.RecoveryAction; v.Valid && (v.V < 0 || v.V > 4 || v.V != math.Trunc(v.V)) {
			t.Errorf("recovery action %v", v.V)
		}
		if v := d.Health.FabricState; v.Valid && (v.V < 0 || v.V > 3 || v.V != math.Trunc(v.V)) {
			t.Errorf("fabric state %v", v.V)
		}
		reasons := map[string]bool{}
		for _, e := range d.Health.ClockEvents {
			if e.Reason == "" || reasons[e.Reason] {
				t.Errorf("clock event reason %q empty or repeated", e.Reason)
			}
			reasons[e.Reason] = true
		}
		policies := map[string]bool{}
		for _, v := range d.Health.Violations {
			nonNegative("violation "+v.Policy, gpu.Known(v.Seconds))
			if v.Policy == "" || policies[v.Policy] {
				t.Errorf("violation policy %q empty or repeated", v.Policy)
			}
			policies[v.Policy] = true
		}
		if d.PCIe.TXBytes.Valid || d.PCIe.RXBytes.Valid || d.NVLink.TXBytes.Valid || len(d.NVLink.Links) > 0 || d.Profiling != nil {
			t.Errorf("device %d has readings nvidia-smi does not print: PCIe/NVLink counters or profiling", i)
		}
		if v := d.PerformanceState; v.Valid && (v.V < 0 || v.V > 15 || v.V != math.Trunc(v.V)) {
			t.Errorf("performance state %v", v.V)
		}
		for _, c := range d.Clocks {
			nonNegative("clock "+c.Name, gpu.Known(c.Hertz))
		}
		for _, e := range d.ECCErrors {
			nonNegative("ecc "+e.Type, gpu.Known(e.Count))
		}
		for _, m := range d.MIG {
			nonNegative("mig memory total", m.MemoryTotalBytes)
			nonNegative("mig memory used", m.MemoryUsedBytes)
			if m.GPUInstance < 0 || m.ComputeInstance < 0 {
				t.Errorf("mig instance ids %d/%d", m.GPUInstance, m.ComputeInstance)
			}
		}
		if !d.ProcessesListed && len(d.Processes) > 0 {
			t.Errorf("device %d has processes but ProcessesListed is false", i)
		}
		for _, p := range d.Processes {
			if p.PID == 0 {
				t.Errorf("process with pid 0")
			}
			switch p.Type {
			case "", gpu.ProcessCompute, gpu.ProcessGraphics, gpu.ProcessComputeAndGraphics, gpu.ProcessMPS:
			default:
				t.Errorf("process type %q", p.Type)
			}
			nonNegative("process memory", p.UsedMemoryBytes)
			if !p.MIG && (p.GPUInstance != 0 || p.ComputeInstance != 0) {
				t.Errorf("non-MIG process with instance ids")
			}
		}
	}
}

// compact drops <supported_clocks> and the indentation between elements.
func compact(b []byte) []byte {
	for {
		i := bytes.Index(b, []byte("<supported_clocks>"))
		j := bytes.Index(b, []byte("</supported_clocks>"))
		if i < 0 || j < i {
			break
		}
		b = append(b[:i:i], b[j+len("</supported_clocks>"):]...)
	}
	var out []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		out = append(out, bytes.TrimSpace(line)...)
	}
	return out
}

func FuzzParse(f *testing.F) {
	files, err := filepath.Glob("testdata/*.xml")
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		// A small seed per schema lets the fuzzer mutate the parts that matter: the supported clock tables are most
		// of a file, and Parse skips them.
		f.Add(compact(b))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		snap, err := Parse(bytes.NewReader(b))
		if err != nil {
			if snap != nil {
				t.Errorf("Parse returned a snapshot with error %v", err)
			}
			return
		}
		checkInvariants(t, snap)
	})
}

// The same PID listed twice on one GPU (once per context type, or repeated) is one process; on two MIG instances
// it stays two.
func TestSamePIDOnOneGPUIsMerged(t *testing.T) {
	proc := func(pid, typ, mem, gi string) string {
		return "<process_info><gpu_instance_id>" + gi + "</gpu_instance_id><compute_instance_id>" +
			map[bool]string{true: "N/A", false: "0"}[gi == "N/A"] + "</compute_instance_id><pid>" + pid +
			"</pid><type>" + typ + "</type><process_name>p</process_name><used_memory>" + mem + "</used_memory></process_info>"
	}
	xml := `<?xml version="1.0" ?><nvidia_smi_log><attached_gpus>1</attached_gpus><gpu id="00000000:01:00.0">` +
		`<uuid>GPU-11111111-2222-3333-4444-555555555555</uuid><processes>` +
		proc("7", "C", "10 MiB", "N/A") + proc("7", "G", "20 MiB", "N/A") + proc("8", "C", "5 MiB", "N/A") +
		proc("8", "C", "5 MiB", "N/A") + proc("9", "C", "1 MiB", "1") + proc("9", "C", "2 MiB", "2") +
		`</processes></gpu></nvidia_smi_log>`
	snap, err := Parse(strings.NewReader(xml))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range snap.Devices[0].Processes {
		got[fmt.Sprintf("%d/%v/%d", p.PID, p.MIG, p.GPUInstance)] = fmt.Sprintf("%s %v", p.Type, p.UsedMemoryBytes.V)
	}
	want := map[string]string{
		"7/false/0": "compute+graphics 2.097152e+07",
		"8/false/0": "compute 5.24288e+06",
		"9/true/1":  "compute 1.048576e+06",
		"9/true/2":  "compute 2.097152e+06",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("processes = %v, want %v", got, want)
	}
}

// BenchmarkParse is the parse of the 4 x RTX 3090 fixture (192 KB, most of it supported clock tables).
func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile("testdata/500farm__4-geforce-rtx-3090.xml")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parse(data); err != nil { // as the Source parses its output buffer
			b.Fatal(err)
		}
	}
}
