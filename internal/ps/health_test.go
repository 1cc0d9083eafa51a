package ps

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
)

func TestHealth(t *testing.T) {
	link := func(n int, up float64) gpu.NVLinkLink { return gpu.NVLinkLink{Link: n, Active: gpu.Known(up)} }
	pcie := func(gen, maxGen, width, maxWidth float64) gpu.PCIe {
		return gpu.PCIe{Generation: gpu.Known(gen), MaxGeneration: gpu.Known(maxGen), Width: gpu.Known(width), MaxWidth: gpu.Known(maxWidth)}
	}
	for _, c := range []struct {
		what string
		d    gpu.Device
		want []string
	}{
		{"nothing known", gpu.Device{}, nil},
		{"healthy, with every reading", gpu.Device{
			UtilizationRatio: gpu.Known(0.9), PCIe: pcie(5, 5, 16, 16), NVLink: gpu.NVLink{Links: []gpu.NVLinkLink{link(0, 1)}},
			XIDErrors: []gpu.XIDCount{{XID: 13, Count: 4}}, // an application fault
			Health: gpu.Health{RecoveryAction: gpu.Known(0), RemapPending: gpu.Known(0), RemapFailure: gpu.Known(0),
				FabricState: gpu.Known(3), FabricHealthy: gpu.Known(1),
				ClockEvents: []gpu.ClockEvent{{Reason: "gpu_idle", Active: true}, {Reason: "sw_power_cap"}}},
		}, nil},
		{"an idle GPU lowers its link generation", gpu.Device{UtilizationRatio: gpu.Known(0), PCIe: pcie(1, 5, 16, 16)}, nil},
		{"a busy one does not", gpu.Device{UtilizationRatio: gpu.Known(0.7), PCIe: pcie(3, 5, 16, 16)}, []string{"PCIe gen 3 of 5"}},
		{"half width", gpu.Device{PCIe: pcie(5, 5, 8, 16)}, []string{"PCIe x8 of x16"}},
		{"the demo's GPU 6, most serious first", gpu.Device{
			XIDErrors: []gpu.XIDCount{{XID: 63, Count: 1}, {XID: 13, Count: 2}, {XID: 48, Count: 1}},
			Health:    gpu.Health{RecoveryAction: gpu.Known(1), RemapPending: gpu.Known(1)},
		}, []string{"needs GPU reset", "row remap pending", "XID 48, 63"}},
		{"memory beyond repair", gpu.Device{Health: gpu.Health{RemapFailure: gpu.Known(1), RecoveryAction: gpu.Known(2)}},
			[]string{"needs node reboot", "row remap failed"}},
		{"before Ampere", gpu.Device{Health: gpu.Health{RetirementPending: gpu.Known(1)}}, []string{"page retirement pending"}},
		{"XIDs sort as numbers", gpu.Device{XIDErrors: []gpu.XIDCount{{XID: 79, Count: 1}, {XID: 74, Count: 3}}}, []string{"XID 74, 79"}},
		{"slowdowns", gpu.Device{Health: gpu.Health{ClockEvents: []gpu.ClockEvent{
			{Reason: "sw_power_cap", Active: true}, {Reason: "hw_thermal_slowdown", Active: true}, {Reason: "hw_slowdown", Active: true},
			{Reason: "hw_power_brake_slowdown", Active: true}}}},
			[]string{"thermal slowdown", "power brake", "at power cap"}},
		{"links and fabric", gpu.Device{NVLink: gpu.NVLink{Links: []gpu.NVLinkLink{link(0, 1), link(3, 0), link(7, 0)}},
			Health: gpu.Health{FabricState: gpu.Known(2), FabricHealthy: gpu.Known(0)}},
			[]string{"NVLink 3, 7 down", "fabric not ready"}},
		{"a registered fabric with degraded bandwidth", gpu.Device{Health: gpu.Health{FabricState: gpu.Known(3), FabricHealthy: gpu.Known(0)}},
			[]string{"fabric degraded"}},
	} {
		if got := Health(&c.d); !slices.Equal(got, c.want) {
			t.Errorf("%s: Health = %q, want %q", c.what, got, c.want)
		}
	}
}

// The demo node shows its three unhealthy GPUs, and only those.
func TestHealthLinesOfTheDemo(t *testing.T) {
	snap, err := simulated.Demo().Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"GPU 3: PCIe x8 of x16", "GPU 4: at power cap", "GPU 6: needs GPU reset, row remap pending, XID 48, 63"}
	if got := HealthLines(snap); !slices.Equal(got, want) {
		t.Errorf("HealthLines(demo) = %q, want %q", got, want)
	}
}

// The table's header names the GPUs with a problem; a table without headers (for scripts) has the rows alone.
func TestTableNamesUnhealthyGPUs(t *testing.T) {
	r := result()
	r.Snapshot.Devices[0].PCIe = gpu.PCIe{Width: gpu.Known(8), MaxWidth: gpu.Known(16)}
	for _, headers := range []bool{true, false} {
		var buf strings.Builder
		if err := WriteTable(&buf, r.Snapshot, Rows(r), Table{Headers: headers}); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(buf.String(), "# GPU 1: PCIe x8 of x16\n"); got != headers {
			t.Errorf("headers %v: health line shown %v:\n%s", headers, got, buf.String())
		}
	}
}
