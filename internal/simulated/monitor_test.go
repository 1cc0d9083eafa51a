package simulated

import (
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// A simulated NVIDIA GPU has a performance monitor where its file gives the monitor's readings, its own or a GPU
// instance's; the others have none, and AMD and Intel GPUs, which have no such monitor, leave it unknown.
func TestSimulatedPerformanceMonitor(t *testing.T) {
	for _, preset := range []string{"", "mixed"} {
		src, err := Preset(preset)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := src.Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range snap.Devices {
			hasReadings := d.Profiling != nil
			for _, m := range d.MIG {
				hasReadings = hasReadings || m.Profiling != nil
			}
			want := gpu.Known(0)
			switch {
			case d.Vendor != gpu.VendorNVIDIA:
				want = gpu.Value{}
			case hasReadings:
				want = gpu.Known(1)
			}
			if d.PerformanceMonitor != want {
				t.Errorf("--demo=%s GPU %d (%s): performance monitor %+v, want %+v", preset, d.Index, d.Name, d.PerformanceMonitor, want)
			}
		}
	}
}
