package collector

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// implausibleDesc counts the device values left out: a value outside its family's range (families.Range), or a
// counter's that grew faster than it can, is left out (absent, as an unknown value is) for that reading. A counter
// that went back is written: a driver reload restarts it, and Prometheus reads that as a reset.
var implausibleDesc = prometheus.NewDesc("gpu_pod_exporter_implausible_values_total", implausibleHelp,
	[]string{"family", "reason"}, nil)

const implausibleHelp = "Values of device families left out of readings because they were outside the family's " +
	"range (reason out_of_range: a driver's \"not available\" such as 0xFFFFFFFF, or garbage) or a counter grew faster " +
	"than it can (jump); only for families that had any."

// plausibility decides, once per reading, which device values are written: it keeps each rate-checked counter's last
// value, and counts what it left out. Scrapes that share a reading make the same decisions; only the first to write
// a reading counts.
type plausibility struct {
	mu       sync.Mutex
	newest   time.Time // the newest reading seen
	counters map[counterKey]*counterState
	left     map[leftOut]uint64
}

// counterMemory is how long a counter's last value is kept after the reading it was last read in. A counter absent
// from some readings (unknown, or out of its range) is checked against it when it comes back, with the growth the
// time between allows, so that a wrong value after a gap is not taken as the count to go on from; one gone for
// longer (its GPU left the node) is forgotten, which bounds the state by the counters of the last hour.
const counterMemory = time.Hour

// counterKey is one counter series: its family's row, its GPU, and its one label value beyond gpu and uuid.
type counterKey struct {
	row         int
	uuid, label string
}

// counterState is a counter's value at a reading, and whether that reading's value jumped.
type counterState struct {
	v    float64
	at   time.Time
	jump bool
}

type leftOut struct{ family, reason string }

func newPlausibility() *plausibility {
	return &plausibility{counters: make(map[counterKey]*counterState), left: make(map[leftOut]uint64)}
}

// reading tells of a reading taken at at, and reports whether it is new: the scrape that writes it first counts.
// The counters not read in the last counterMemory are forgotten.
func (p *plausibility) reading(at time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !at.After(p.newest) {
		return false
	}
	p.newest = at
	for k, c := range p.counters {
		if at.Sub(c.at) > counterMemory {
			delete(p.counters, k)
		}
	}
	return true
}

// check reports whether v, a value of family f (row row) of GPU uuid at the reading of time at, is written; one left
// out is counted when count is set.
func (p *plausibility) check(f *deviceFamily, row int, uuid, label string, v float64, at time.Time, count bool) bool {
	reason := ""
	switch {
	case !f.Range.Holds(v):
		reason = "out_of_range"
	case f.Range.Rate > 0 && p.jumped(counterKey{row, uuid, label}, v, at, f.Range.Rate):
		reason = "jump"
	default:
		return true
	}
	if count {
		p.mu.Lock()
		p.left[leftOut{f.Name, reason}]++
		p.mu.Unlock()
	}
	return false
}

// jumped reports whether a counter grew faster than rate a second since its last reading. A value that jumped is
// left out of its reading and the next ones count from it: a real jump costs one reading, a wrong value is undone
// by the next, which then reads as a reset. A reading older than the newest is not judged.
func (p *plausibility) jumped(k counterKey, v float64, at time.Time, rate float64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.counters[k]
	switch {
	case c == nil:
		p.counters[k] = &counterState{v: v, at: at}
		return false
	case at.Equal(c.at):
		return c.jump // decided for this reading by the scrape that wrote it first
	case at.Before(c.at):
		return false
	}
	dt := max(at.Sub(c.at).Seconds(), 1)
	*c = counterState{v: v, at: at, jump: v-c.v > rate*dt}
	return c.jump
}

// jumpedAt reports whether the counter's value at the reading of time at was left out as a jump: what a field
// written from the same value (--compat=dcgm's) follows.
func (p *plausibility) jumpedAt(k counterKey, at time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.counters[k]
	return c != nil && c.at.Equal(at) && c.jump
}

// Describe implements prometheus.Collector.
func (p *plausibility) Describe(ch chan<- *prometheus.Desc) { ch <- implausibleDesc }

// Collect implements prometheus.Collector.
func (p *plausibility) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	keys := make([]leftOut, 0, len(p.left))
	for k := range p.left {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b leftOut) int {
		return cmp.Or(cmp.Compare(a.family, b.family), cmp.Compare(a.reason, b.reason))
	})
	counts := make([]uint64, len(keys))
	for i, k := range keys {
		counts[i] = p.left[k]
	}
	p.mu.Unlock()
	for i, k := range keys {
		ch <- prometheus.MustNewConstMetric(implausibleDesc, prometheus.CounterValue, float64(counts[i]), k.family, k.reason)
	}
}
