package rate

import (
	"sync"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func at(seconds float64) time.Time { return t0.Add(time.Duration(seconds * float64(time.Second))) }

func TestRate(t *testing.T) {
	r := New[string]()
	steps := []struct {
		what string
		v    gpu.Value
		at   float64
		want gpu.Value
	}{
		{"the first reading has no rate", gpu.Known(1000), 0, gpu.Value{}},
		{"the increase over the interval", gpu.Known(4000), 2, gpu.Known(1500)},
		{"the same reading again (another scrape) gives the same rate", gpu.Known(4000), 2, gpu.Known(1500)},
		{"an older reading than the newest has none", gpu.Known(1000), 1, gpu.Value{}},
		{"a counter that stands still is 0", gpu.Known(4000), 3, gpu.Known(0)},
		{"a counter that went back (driver reload) has no rate", gpu.Known(100), 4, gpu.Value{}},
		{"and starts again from there", gpu.Known(600), 5, gpu.Known(500)},
		{"an unknown value has no rate", gpu.Value{}, 6, gpu.Value{}},
		{"nor does the reading after it", gpu.Known(700), 7, gpu.Value{}},
		{"until two known readings follow each other", gpu.Known(1700), 9, gpu.Known(500)},
	}
	for _, s := range steps {
		if got := r.Rate("GPU-a", s.v, at(s.at)); got != s.want {
			t.Errorf("%s: Rate(%v at %vs) = %v, want %v", s.what, s.v, s.at, got, s.want)
		}
	}
}

// A counter not read in a reading (its GPU is gone) is forgotten, so that the tracker holds only the counters of the
// newest two readings, and starts again without a rate when it comes back.
func TestRateForgetsCountersNotRead(t *testing.T) {
	r := New[int]()
	for k := range 100 {
		r.Rate(k, gpu.Known(0), at(0))
	}
	r.Rate(0, gpu.Known(10), at(1))
	if got := r.size(); got != 100 {
		t.Fatalf("after the second reading: %d counters, want those of both readings (100)", got)
	}
	r.Rate(0, gpu.Known(20), at(2))
	if got := r.size(); got != 1 {
		t.Errorf("after a third reading of counter 0 only: %d counters, want 1", got)
	}
	if got := r.Rate(1, gpu.Known(5), at(2)); got.Valid {
		t.Errorf("a counter back after a reading without it: rate %v, want none", got)
	}
	if got := r.Rate(0, gpu.Known(20), at(2)); got != gpu.Known(10) {
		t.Errorf("counter 0 kept its rate: %v, want 10", got)
	}
}

// Scrapes that share a reading call Rate at once; each gets the reading's rate.
func TestRateConcurrentScrapesAgree(t *testing.T) {
	r := New[string]()
	r.Rate("GPU-a", gpu.Known(0), at(0))
	var wg sync.WaitGroup
	got := make([]gpu.Value, 8)
	for i := range got {
		wg.Go(func() { got[i] = r.Rate("GPU-a", gpu.Known(30), at(3)) })
	}
	wg.Wait()
	for i, g := range got {
		if g != gpu.Known(10) {
			t.Errorf("scrape %d: %v, want 10", i, g)
		}
	}
}
