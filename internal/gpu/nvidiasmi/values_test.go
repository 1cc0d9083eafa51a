package nvidiasmi

import (
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

func TestQuantity(t *testing.T) {
	invalid := gpu.Value{}
	for _, tc := range []struct {
		in    string
		units unit
		neg   bool
		want  gpu.Value
	}{
		{"81559 MiB", memoryUnits, false, gpu.Known(81559 * 1048576)},
		{" 0 MiB ", memoryUnits, false, gpu.Known(0)},
		{"1 GiB", memoryUnits, false, gpu.Known(1 << 30)},
		{"81559", memoryUnits, false, invalid}, // no unit: MiB or bytes?
		{"81559 MB", memoryUnits, false, invalid},
		{"-1 MiB", memoryUnits, false, invalid},
		{"45 C", celsius, true, gpu.Known(45)},
		{"-5 C", celsius, true, gpu.Known(-5)},
		{"45 F", celsius, true, invalid},
		{"70.50 W", watts, false, gpu.Known(70.5)},
		{"1980 MHz", hertz, false, gpu.Known(1.98e9)},
		{"30 %", percent, false, gpu.Known(0.3)},
		{"30%", percent, false, gpu.Known(0.3)},
		{"123456 mJ", joules, false, gpu.Known(123.456)},
		{"N/A", watts, false, invalid},
		{"[N/A]", watts, false, invalid},
		{"[Not Supported]", watts, false, invalid},
		{"[Insufficient Permissions]", watts, false, invalid},
		{"Requested functionality has been deprecated", hertz, false, invalid},
		{"Unknown Error", hertz, false, invalid},
		{"", watts, false, invalid},
		{"NaN W", watts, false, invalid},
		{"Inf W", watts, false, invalid},
		{"0x10 W", watts, false, invalid},
		{"1e3 W", watts, false, invalid},
		{"1.2.3 W", watts, false, invalid},
		{". W", watts, false, invalid},
		{strings.Repeat("9", 400) + " W", watts, false, invalid},
		{"70 W W", watts, false, invalid},
	} {
		got := quantity(tc.in, tc.units, tc.neg)
		if got.Valid != tc.want.Valid || got.Valid && abs(got.V-tc.want.V) > 1e-9*abs(tc.want.V) {
			t.Errorf("quantity(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func TestUtilizationOver100IsInvalid(t *testing.T) {
	if v := utilization("101 %"); v.Valid {
		t.Errorf("utilization(101 %%) = %v", v)
	}
	if v := utilization("100 %"); !v.Valid || v.V != 1 {
		t.Errorf("utilization(100 %%) = %v", v)
	}
}

func TestProcessType(t *testing.T) {
	for in, want := range map[string]string{
		"C":   gpu.ProcessCompute,
		"G":   gpu.ProcessGraphics,
		"C+G": gpu.ProcessComputeAndGraphics,
		"G+C": gpu.ProcessComputeAndGraphics,
		"M":   gpu.ProcessMPS,
		"M+C": gpu.ProcessMPS,
		" c ": gpu.ProcessCompute,
		"X":   "",
		"":    "",
		"C+":  "",
		"N/A": "",
	} {
		if got := processType(in); got != want {
			t.Errorf("processType(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPState(t *testing.T) {
	for in, want := range map[string]gpu.Value{
		"P0": gpu.Known(0), "P8": gpu.Known(8), "P15": gpu.Known(15),
		"P16": {}, "P32": {}, "P-1": {}, "P+1": {}, "Unknown": {}, "N/A": {}, "P": {}, "": {},
	} {
		if got := pstate(in); got != want {
			t.Errorf("pstate(%q) = %+v, want %+v", in, got, want)
		}
	}
}

func TestParseRejectsNonXML(t *testing.T) {
	for in, want := range map[string]string{
		"":     "empty output",
		"  \n": "empty output",
		"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.": "no <nvidia_smi_log> element",
		"<html><body>nope</body></html>":                                                "expected element type <nvidia_smi_log>",
		"<nvidia_smi_log><gpu>":                                                         "unexpected EOF",
	} {
		snap, err := Parse(strings.NewReader(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, %v; want error containing %q", in, snap, err, want)
		}
	}
}

// TestParseEdgeCases asserts what the synthetic fixture is for, beyond its golden file.
func TestParseEdgeCases(t *testing.T) {
	in := `<nvidia_smi_log><attached_gpus>2</attached_gpus>
<gpu id="00000000:01:00.0"><uuid>GPU-a</uuid><processes>
<process_info><pid>7</pid><type>C</type><process_name>a & b <c> AT&T; &amp; "q" C:\x\y.exe</process_name><used_memory>1 MiB</used_memory></process_info>
<process_info><pid>8</pid><type>G</type><process_name>` + "bad\xff\x01name" + `</process_name><used_memory>2 MiB</used_memory></process_info>
</processes></gpu></nvidia_smi_log>`
	snap, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Devices) != 1 || len(snap.Devices[0].Processes) != 2 {
		t.Fatalf("parsed:\n%s", render(snap))
	}
	p := snap.Devices[0].Processes
	if want := `a & b <c> AT&T; & "q" C:\x\y.exe`; p[0].Name != want {
		t.Errorf("name %q, want %q", p[0].Name, want)
	}
	if want := "bad\uFFFD\uFFFDname"; p[1].Name != want {
		t.Errorf("name %q, want %q", p[1].Name, want)
	}
	if len(snap.Errors) != 1 || !strings.Contains(snap.Errors[0].Error(), "reports 2 attached GPUs but lists 1") {
		t.Errorf("errors %v", snap.Errors)
	}
}

func TestProcessesListed(t *testing.T) {
	for body, want := range map[string]bool{
		"":                               false,
		"<processes/>":                   true,
		"<processes>\n</processes>":      true,
		"<processes>None</processes>":    true,
		"<processes>N/A</processes>":     false,
		"<processes>[N/A]</processes>":   false,
		"<processes>Unknown</processes>": false,
	} {
		snap, err := Parse(strings.NewReader("<nvidia_smi_log><gpu><uuid>GPU-a</uuid>" + body + "</gpu></nvidia_smi_log>"))
		if err != nil {
			t.Fatal(err)
		}
		if got := snap.Devices[0].ProcessesListed; got != want {
			t.Errorf("%q: ProcessesListed %t, want %t", body, got, want)
		}
	}
}

// TestRepairIsLinear: repair must not search the rest of the input once per '&' or per <process_name> (it did, and
// the fuzzer stalled on such inputs). Quadratic work on these 3 MB would take minutes.
func TestRepairIsLinear(t *testing.T) {
	for _, in := range []string{
		strings.Repeat("&", 3<<20),
		strings.Repeat("<process_name>", 200000) + "</process_name>",
		strings.Repeat("<process_name>x</process_info>", 100000) + "</process_name>",
	} {
		start := time.Now()
		repair([]byte(in))
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("repair of %d bytes took %v", len(in), d)
		}
	}
}
