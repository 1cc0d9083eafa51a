// Package rate turns counters read at consecutive readings into per-second rates: a counter's increase between
// two readings over the time between them. DCGM reports some counters this way (its NVLink bandwidth), and a
// compatibility output that follows it needs the reading before; the state lives here, not in what writes the
// series.
//
// A rate is absent, never 0, where it cannot be known: on a counter's first reading, after a reading where it was
// unknown, when it went back (a driver reload or a wrap restarts it), and for a reading older than the newest.
// Scrapes that share a reading get the same rate.
package rate

import (
	"sync"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Tracker keeps each counter's last two readings, by key. It is safe for concurrent use. It holds the counters of
// the newest two readings only: a counter that was not read in one (its GPU is gone) is forgotten.
type Tracker[K comparable] struct {
	mu       sync.Mutex
	newest   time.Time
	counters map[K]*counter
}

type sample struct {
	v  float64
	at time.Time
}

type counter struct {
	prev, cur sample
	hasPrev   bool
}

// New returns a Tracker that knows no counter yet.
func New[K comparable]() *Tracker[K] { return &Tracker[K]{counters: make(map[K]*counter)} }

// Rate records counter k's value v, read at time at (the reading's), and returns its increase per second since the
// reading before.
func (t *Tracker[K]) Rate(k K, v gpu.Value, at time.Time) gpu.Value {
	t.mu.Lock()
	defer t.mu.Unlock()
	if at.After(t.newest) {
		for key, c := range t.counters {
			if c.cur.at.Before(t.newest) {
				delete(t.counters, key)
			}
		}
		t.newest = at
	}
	c, ok := t.counters[k]
	switch {
	case !v.Valid:
		delete(t.counters, k)
		return gpu.Value{}
	case !ok:
		t.counters[k] = &counter{cur: sample{v.V, at}}
		return gpu.Value{}
	case at.After(c.cur.at):
		*c = counter{prev: c.cur, cur: sample{v.V, at}, hasPrev: true}
	case at.Before(c.cur.at):
		return gpu.Value{}
	}
	dt := c.cur.at.Sub(c.prev.at).Seconds()
	if !c.hasPrev || c.cur.v < c.prev.v || dt <= 0 {
		return gpu.Value{}
	}
	return gpu.Known((c.cur.v - c.prev.v) / dt)
}

// size is the number of counters the tracker holds.
func (t *Tracker[K]) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.counters)
}
