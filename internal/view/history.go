package view

import (
	"math"
	"time"
)

// HistorySpan is how far back the history goes, and HistoryPoints how many points cover it: a point per 10 s.
const (
	HistorySpan   = 5 * time.Minute
	HistoryPoints = 30
)

// History is the recent past of a reading's GPUs and workloads: HistoryPoints points each over the HistorySpan
// before the reading, the latest last, NaN where nothing was read. A node's top keeps it in memory (Recorder); the
// cluster's reads it with range queries, so that it is there from the first screen.
type History struct {
	// GPUs hold each GPU's utilization and memory used over total, by GPUKey.
	GPUs map[string]*GPUHistory
	// Workloads hold each workload's summed SM utilization, by Workload.Key.
	Workloads map[string][]float64
}

// GPUHistory is one GPU's past.
type GPUHistory struct {
	Utilization, Memory []float64
}

// GPUKey names a GPU in a History: its node and UUID.
func GPUKey(node, uuid string) string { return node + "\x00" + uuid }

// NewHistory is an empty history.
func NewHistory() *History {
	return &History{GPUs: map[string]*GPUHistory{}, Workloads: map[string][]float64{}}
}

// Points is an empty series of HistoryPoints.
func Points() []float64 {
	p := make([]float64, HistoryPoints)
	for i := range p {
		p[i] = math.NaN()
	}
	return p
}

// GPU returns a GPU's history, made when it has none.
func (h *History) GPU(key string) *GPUHistory {
	g := h.GPUs[key]
	if g == nil {
		g = &GPUHistory{Utilization: Points(), Memory: Points()}
		h.GPUs[key] = g
	}
	return g
}

// Forget leaves out the GPUs and workloads with no point in the span.
func (h *History) Forget() {
	for k, g := range h.GPUs {
		if empty(g.Utilization) && empty(g.Memory) {
			delete(h.GPUs, k)
		}
	}
	for k, w := range h.Workloads {
		if empty(w) {
			delete(h.Workloads, k)
		}
	}
}

// Recorder keeps a node's history in memory, from one reading to the next: each point is the mean of the readings
// in its 10 s.
type Recorder struct {
	history *History
	sums    map[string]*[2][HistoryPoints]float64 // per series, per point: sum and count
	last    int64                                 // the point of the latest reading, in steps since the epoch
}

// NewRecorder is a recorder with nothing recorded.
func NewRecorder() *Recorder { return &Recorder{sums: map[string]*[2][HistoryPoints]float64{}} }

const step = HistorySpan / HistoryPoints

// Record adds a reading to the history, and gives the reading the history so far.
func (rec *Recorder) Record(r *Reading) {
	now := r.Time.UnixNano() / int64(step)
	if rec.history == nil {
		rec.history = NewHistory()
		rec.last = now
	}
	if shift := now - rec.last; shift > 0 {
		rec.shift(int(min(shift, HistoryPoints)))
		rec.last = now
	}
	for i := range r.GPUs {
		g := &r.GPUs[i]
		key := GPUKey(g.Node, g.UUID)
		h := rec.history.GPU(key)
		rec.add(key+"\x00u", h.Utilization, g.Utilization.V, g.Utilization.Valid)
		if g.MemoryUsed.Valid && g.MemoryTotal.Valid && g.MemoryTotal.V > 0 {
			rec.add(key+"\x00m", h.Memory, g.MemoryUsed.V/g.MemoryTotal.V, true)
		}
	}
	for _, w := range Group(r.Processes, Workloads) {
		series := rec.history.Workloads[w.Key]
		if series == nil {
			series = Points()
			rec.history.Workloads[w.Key] = series
		}
		rec.add("w\x00"+w.Key, series, w.SM.V, w.SM.Valid)
	}
	r.History = rec.history
}

// add adds a value to the latest point of a series.
func (rec *Recorder) add(key string, series []float64, v float64, valid bool) {
	if !valid || math.IsNaN(v) || math.IsInf(v, 0) {
		return
	}
	s := rec.sums[key]
	if s == nil {
		s = new([2][HistoryPoints]float64)
		rec.sums[key] = s
	}
	last := HistoryPoints - 1
	s[0][last] += v
	s[1][last]++
	series[last] = s[0][last] / s[1][last]
}

// shift moves every series n points into the past.
func (rec *Recorder) shift(n int) {
	move := func(p []float64) {
		copy(p, p[n:])
		for i := len(p) - n; i < len(p); i++ {
			p[i] = math.NaN()
		}
	}
	// A GPU or workload gone for the whole span is forgotten: the history is bounded by what the span saw.
	for k, g := range rec.history.GPUs {
		move(g.Utilization)
		move(g.Memory)
		if empty(g.Utilization) && empty(g.Memory) {
			delete(rec.history.GPUs, k)
		}
	}
	for k, w := range rec.history.Workloads {
		move(w)
		if empty(w) {
			delete(rec.history.Workloads, k)
		}
	}
	for k, s := range rec.sums {
		copy(s[0][:], s[0][n:])
		copy(s[1][:], s[1][n:])
		for i := HistoryPoints - n; i < HistoryPoints; i++ {
			s[0][i], s[1][i] = 0, 0
		}
		if s[1] == ([HistoryPoints]float64{}) {
			delete(rec.sums, k)
		}
	}
}

func empty(p []float64) bool {
	for _, v := range p {
		if !math.IsNaN(v) {
			return false
		}
	}
	return true
}
