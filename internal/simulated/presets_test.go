package simulated

import (
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Every built-in node parses, and the AMD and mixed ones have the vendors and allocations they are for.
func TestPresets(t *testing.T) {
	if got := Presets(); len(got) < 3 || got[0] != "" {
		t.Fatalf("presets %q: want \"\" (--demo) first, amd and mixed", got)
	}
	vendors := map[string][]string{
		"":      {gpu.VendorNVIDIA},
		"amd":   {gpu.VendorAMD},
		"mixed": {gpu.VendorNVIDIA, gpu.VendorAMD, gpu.VendorIntel},
	}
	for _, name := range Presets() {
		s, err := Preset(name)
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		snap, err := s.Snapshot(t.Context())
		if err != nil || len(snap.Errors) != 0 {
			t.Fatalf("%q: %v %v", name, err, snap.Errors)
		}
		seen := map[string]bool{}
		for _, d := range snap.Devices {
			seen[d.Vendor] = true
		}
		for _, v := range vendors[name] {
			if !seen[v] {
				t.Errorf("%q has no %s GPU", name, v)
			}
		}
		if !s.HasAllocations() {
			t.Errorf("%q has no allocations", name)
		}
	}
	if _, err := Preset("nope"); err == nil {
		t.Error("an unknown preset opened")
	}
}
