package families

import (
	"math"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Each family is in the table once, with a finite range, the unit its name ends with, and a growth bound only on
// a counter.
func TestTheTable(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range All {
		if seen[f.Name] {
			t.Errorf("%s: twice", f.Name)
		}
		seen[f.Name] = true
		r := f.Range
		if r.Min > r.Max || math.IsInf(r.Min, 0) || math.IsInf(r.Max, 0) || r.Rate < 0 {
			t.Errorf("%s: range %+v", f.Name, r)
		}
		base, counter := strings.CutSuffix(f.Name, "_total")
		if f.Unit != "" && !strings.HasSuffix(base, "_"+f.Unit) {
			t.Errorf("%s: unit %q is not what the name ends with", f.Name, f.Unit)
		}
		if r.Rate > 0 && !counter {
			t.Errorf("%s: a growth bound on a gauge", f.Name)
		}
	}
}

// A value outside the family's range, NaN or infinite, is unknown; one inside is itself.
func TestKnown(t *testing.T) {
	for v, want := range map[float64]bool{0.5: true, 1: true, 0: true, -0.1: false, 42949672.95: false, math.NaN(): false, math.Inf(1): false} {
		if got := Utilization.Known(gpu.Known(v)); got.Valid != want || want && got.V != v {
			t.Errorf("utilization %v: %+v", v, got)
		}
	}
	if Temperature.Known(gpu.Value{}).Valid {
		t.Error("an unknown value became known")
	}
}
