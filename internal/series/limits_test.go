package series

import (
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

var truncated = regexp.MustCompile(`…\[truncated [0-9a-f]{16}\]$`)

// podValues writes one series of d per pod, and returns the pod label of each series gathered, in order.
func podValues(t *testing.T, e *Engine, d *Desc, pods []string) (*Gathering, []string) {
	t.Helper()
	b := e.Batch()
	for i, pod := range pods {
		b.Gauge(d, float64(i), pod, "0")
	}
	g := gather(t, b)
	var got []string
	for _, mf := range g.Families() {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pod" {
					got = append(got, l.GetValue())
				}
			}
		}
	}
	return g, got
}

// A label value over the cap is served cut, at a character boundary, with a visible mark; values that differ only
// past the cut stay apart; a value is cut the same way in every gathering and by every engine, so that its series
// keeps its identity; values within the cap are untouched.
func TestLongLabelValuesAreTruncated(t *testing.T) {
	long := strings.Repeat("a", 1<<20)
	pods := []string{
		long + "x",
		long + "y",
		strings.Repeat("é", MaxLabelValueBytes), // two bytes each: the cut falls inside one, and moves before it
		strings.Repeat("b", MaxLabelValueBytes), // at the cap exactly
		"short",
	}
	d := NewDesc("gpu_process_memory_used_bytes", "h", []string{"pod", "gpu"})
	e := NewEngine(d)
	g, got := podValues(t, e, d, pods)
	if len(got) != len(pods) {
		t.Fatalf("%d series, want %d: %.200q", len(got), len(pods), got)
	}
	var cut []string
	for _, v := range got {
		if !utf8.ValidString(v) || len(v) > MaxLabelValueBytes {
			t.Errorf("value of %d bytes (valid UTF-8: %v), want at most %d", len(v), utf8.ValidString(v), MaxLabelValueBytes)
		}
		if truncated.MatchString(v) {
			cut = append(cut, v)
			if len(v) < MaxLabelValueBytes-utf8.UTFMax+1 {
				t.Errorf("a value over the cap was cut to %d bytes, want the cap less at most part of a character", len(v))
			}
		} else if !slices.Contains(pods, v) {
			t.Errorf("value %.40q... is neither written nor marked as truncated", v)
		}
	}
	if len(cut) != 3 {
		t.Errorf("%d values truncated, want the 3 over the cap", len(cut))
	}
	text1 := text(t, g)
	g.Release()

	// The next gathering, and another engine (another run), serve the same values.
	if _, again := podValues(t, e, d, pods); !slices.Equal(again, got) {
		t.Error("the next gathering truncates otherwise")
	}
	d2 := NewDesc("gpu_process_memory_used_bytes", "h", []string{"pod", "gpu"})
	g2, _ := podValues(t, NewEngine(d2), d2, pods)
	if text(t, g2) != text1 {
		t.Error("another engine truncates otherwise")
	}
}

// A family is cut at the cap, keeping the series written first; the others are counted and the family named once
// in the gathering's error. Other families are untouched.
func TestSeriesPerFamilyAreCapped(t *testing.T) {
	big, small := NewDesc("gpu_big", "h", []string{"pid"}), NewDesc("gpu_small", "h", []string{"pid"})
	e := NewEngine(big, small)
	e.maxSeries = 10
	for round := 1; round <= 2; round++ {
		b := e.Batch()
		for pid := range 25 {
			b.Gauge(big, 1, string(rune('a'+pid)))
		}
		for pid := range 5 {
			b.Gauge(small, 1, string(rune('a'+pid)))
		}
		g, err := b.Gather(nil)
		if err == nil || strings.Count(err.Error(), "gpu_big") != 1 || strings.Contains(err.Error(), "gpu_small") {
			t.Errorf("error %v, want gpu_big named once", err)
		}
		for _, mf := range g.Families() {
			var pids []string
			for _, m := range mf.GetMetric() {
				pids = append(pids, m.GetLabel()[0].GetValue())
			}
			want := map[string]string{"gpu_big": "abcdefghij", "gpu_small": "abcde"}[mf.GetName()]
			if strings.Join(pids, "") != want {
				t.Errorf("%s: series %v, want %s", mf.GetName(), pids, want)
			}
		}
		if got := e.Dropped(big); got != uint64(15*round) {
			t.Errorf("round %d: %d series of gpu_big dropped, want %d", round, got, 15*round)
		}
		if got := e.Dropped(small); got != 0 {
			t.Errorf("%d series of gpu_small dropped", got)
		}
		g.Release()
	}
}

// A value over the cap costs what is served, not its own length again: one long value (a simulated node file may
// give a thousand GPUs the same name through a YAML alias) must not be copied, or leave its length as unused
// capacity, in each label set that holds it.
func TestLongLabelValueIsNotCopiedPerSeries(t *testing.T) {
	long := strings.Repeat("n", 1<<20)
	d := NewDesc("gpu_info", "h", []string{"gpu", "name"})
	e := NewEngine(d)
	const sets = 64
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b := e.Batch()
	for i := range sets {
		b.Gauge(d, 1, strconv.Itoa(i), long)
	}
	g := gather(t, b)
	runtime.ReadMemStats(&after)
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > sets*8*MaxLabelValueBytes {
		t.Errorf("%d label sets of one 1 MiB value allocated %d MiB, want at most %d KiB (the value as served, per set)",
			sets, allocated>>20, sets*8*MaxLabelValueBytes>>10)
	}
	g.Release()
}
