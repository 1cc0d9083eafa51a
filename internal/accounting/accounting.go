// Package accounting turns consecutive attributed readings of the node into who-pays signals: each GPU's board
// power split among the workloads on it, and per-workload counters of energy, SM-seconds and memory byte-seconds
// whose increases, with the unattributed remainder, add up to the board's own.
//
// The method, its limits and how it compares with Kepler's are in docs/accounting.md. In short, for each GPU and
// each reading k:
//   - shares: a process's weight is its SM utilization when the GPU reports per-process utilization and the
//     weights sum to more than 0, else its memory; a workload's share is its processes' weight over all the GPU's
//     processes (all MIG instances together). A GPU with no weight (idle, or nothing reported) has no shares.
//   - power: board power x share per workload; the rest (all of it without shares) is unattributed.
//   - energy of the interval since the GPU's previous reading: the driver's energy counter delta, else the
//     trapezoid of the two power readings times the elapsed time (the one known power if only one is). It is split
//     by the shares of reading k, which describe that interval (NVML's per-process utilization is an average over
//     the time since it was last asked); the remainder goes to the unattributed counter, so that the sum is exact.
//     A power reading or counter delta beyond what the GPU can draw (its enforced limit with a margin) is unknown,
//     so that one absurd reading cannot make the counters infinite or NaN for good.
//   - a workload seen for the first time starts its counters at 0 and gets nothing of that first interval (it went
//     to unattributed): when in the interval it started is unknown, and a counter that is born at 0 is one whose
//     whole increase Prometheus sees.
//   - SM-seconds and memory byte-seconds add the workload's value at reading k times the interval.
//
// A reading that failed or timed out never reaches the ledger; the next good one spans the gap with one interval,
// so nothing is lost or counted twice. A GPU missing from a reading keeps its state until it is back.
package accounting

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// Ledger accumulates the accounts of every GPU across readings. It is safe for concurrent use.
type Ledger struct {
	mu   sync.Mutex
	last time.Time // time of the newest reading observed
	gpus map[string]*GPU
}

// New returns an empty ledger.
func New() *Ledger { return &Ledger{gpus: make(map[string]*GPU)} }

// GPU is the account of one GPU after the latest reading that listed it.
type GPU struct {
	Index int
	UUID  string
	// PowerWatts is the board power of the latest reading; UnattributedPowerWatts is what no workload's share
	// covers. Both are unknown when the board power is.
	PowerWatts             gpu.Value
	UnattributedPowerWatts gpu.Value
	// UnattributedEnergyJoules counts the board's energy that went to no workload since the GPU was first seen.
	UnattributedEnergyJoules float64
	// Workloads are the workloads on the GPU at the latest reading, in the order they arrived.
	Workloads []*Workload

	present    bool // in the latest reading
	listed     bool // its process list was read in the latest reading
	lastTime   time.Time
	lastEnergy gpu.Value
	lastPower  gpu.Value
	byKey      map[attribution.WorkloadKey]*Workload
}

// Workload is the account of one workload (one identity) on one GPU.
type Workload struct {
	Identity attribution.Identity
	// PowerWatts is the workload's share of the board power at the latest reading; unknown when the board power
	// is, or when the GPU's process list could not be read.
	PowerWatts gpu.Value
	// EnergyJoules is the workload's share of the board's energy since the workload arrived on the GPU.
	EnergyJoules float64
	// SMSeconds is the integral of the workload's SM utilization over time, in GPU-seconds; unknown until the GPU
	// has reported per-process utilization for the workload.
	SMSeconds gpu.Value
	// MemoryByteSeconds is the integral of the memory the workload holds on the GPU over time; unknown until the
	// GPU has reported the workload's memory.
	MemoryByteSeconds gpu.Value

	// Per-reading scratch.
	seen       bool
	arrived    bool // first seen in this reading
	weight     float64
	sm, memory gpu.Value
}

// Observe accounts one reading. A reading that is not newer than the last one observed (a scrape that shares a
// reading another scrape already accounted, or one that lost a race with a newer reading) changes nothing and
// Observe returns false.
func (l *Ledger) Observe(r *reading.Reading) bool {
	snap := r.Snapshot
	l.mu.Lock()
	defer l.mu.Unlock()
	if !snap.Time.After(l.last) {
		return false
	}
	l.last = snap.Time
	for _, g := range l.gpus {
		g.present = false
	}
	for i := range snap.Devices {
		d := &snap.Devices[i]
		g, ok := l.gpus[d.UUID]
		if !ok {
			g = &GPU{UUID: d.UUID, byKey: make(map[attribution.WorkloadKey]*Workload)}
			l.gpus[d.UUID] = g
		}
		g.observe(d, snap.Time, r.Owner)
	}
	return true
}

// Each calls f with each GPU of the latest reading, in index order, while holding the ledger: f must not keep
// the GPU or call the ledger.
func (l *Ledger) Each(f func(*GPU)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	gpus := make([]*GPU, 0, len(l.gpus))
	for _, g := range l.gpus {
		if g.present {
			gpus = append(gpus, g)
		}
	}
	slices.SortFunc(gpus, func(a, b *GPU) int { return a.Index - b.Index })
	for _, g := range gpus {
		f(g)
	}
}

func (g *GPU) observe(d *gpu.Device, now time.Time, owner func(gpu.Process) attribution.Owner) {
	g.Index, g.present, g.listed = d.Index, true, d.ProcessesListed
	ceiling := ceilingWatts(d)
	power := plausible(d.PowerUsageWatts, ceiling)
	energy, haveEnergy := 0.0, false
	dt := 0.0
	if !g.lastTime.IsZero() {
		dt = now.Sub(g.lastTime).Seconds()
		if dt > 0 {
			energy, haveEnergy = intervalEnergy(g.lastEnergy, d.EnergyJoules, g.lastPower, power, dt, ceiling)
		}
	}
	g.lastTime, g.lastEnergy, g.lastPower = now, d.EnergyJoules, power
	g.PowerWatts = power
	g.UnattributedPowerWatts = power

	if !d.ProcessesListed {
		// Who was on the GPU is unknown: the interval is nobody's, and the workloads keep their counters until a
		// reading lists the processes again.
		if haveEnergy {
			g.UnattributedEnergyJoules += energy
		}
		for _, w := range g.Workloads {
			w.PowerWatts = gpu.Value{}
		}
		return
	}

	for _, w := range g.Workloads {
		w.seen, w.arrived, w.weight, w.sm, w.memory = false, false, 0, gpu.Value{}, gpu.Value{}
	}
	bySM := useSM(d.Processes)
	total := 0.0
	for _, p := range d.Processes {
		o := owner(p)
		key := o.Identity.Key()
		w, ok := g.byKey[key]
		if !ok {
			w = &Workload{Identity: o.Identity, arrived: true}
			g.byKey[key] = w
			g.Workloads = append(g.Workloads, w)
		}
		// The key's labels stay; the rest (allowlisted pod labels) follows the latest reading.
		w.Identity, w.seen = o.Identity, true
		add(&w.sm, p.SMUtilizationRatio)
		add(&w.memory, p.UsedMemoryBytes)
		weight := finite(p.UsedMemoryBytes)
		if bySM {
			weight = finite(p.SMUtilizationRatio)
		}
		w.weight += weight
		total += weight
	}
	// Workloads gone from a reading that lists the GPU's processes are gone: their series end, and the ledger
	// holds no more than what is on the GPUs now.
	g.Workloads = slices.DeleteFunc(g.Workloads, func(w *Workload) bool {
		if !w.seen {
			delete(g.byKey, w.Identity.Key())
		}
		return !w.seen
	})

	// Shares as value x weight / total (fewer roundings than value x (weight / total)); the last workload with a
	// share gets what is left, so that on a GPU with shares the workloads add up to the board exactly and
	// unattributed holds no rounding dust.
	var lastPower, lastEnergy *Workload
	for _, w := range g.Workloads {
		if w.weight > 0 {
			lastPower = w
			if !w.arrived {
				lastEnergy = w
			}
		}
	}
	givenPower, given := 0.0, 0.0
	for _, w := range g.Workloads {
		if !power.Valid {
			w.PowerWatts = gpu.Value{}
		} else {
			p := 0.0
			switch {
			case w == lastPower:
				p = max(power.V-givenPower, 0)
			case total > 0:
				p = power.V * w.weight / total
			}
			w.PowerWatts = gpu.Known(p)
			givenPower += p
		}
		if w.arrived {
			touch(&w.SMSeconds, w.sm)
			touch(&w.MemoryByteSeconds, w.memory)
			continue
		}
		if haveEnergy {
			e := 0.0
			switch {
			case w == lastEnergy && lastEnergy == lastPower:
				e = max(energy-given, 0)
			case total > 0:
				e = energy * w.weight / total
			}
			w.EnergyJoules += e
			given += e
		}
		if dt > 0 {
			integrate(&w.SMSeconds, w.sm, dt)
			integrate(&w.MemoryByteSeconds, w.memory, dt)
		} else {
			touch(&w.SMSeconds, w.sm)
			touch(&w.MemoryByteSeconds, w.memory)
		}
	}
	if power.Valid {
		g.UnattributedPowerWatts = gpu.Known(max(power.V-givenPower, 0))
	}
	if haveEnergy {
		g.UnattributedEnergyJoules += max(energy-given, 0)
	}
}

// Readings beyond what a GPU can draw are a driver's or a file's fault, not energy: one of them would put +Inf or
// NaN in counters that then stay so, and break every sum over them. A GPU's average power over an interval stays
// under its enforced limit; the margin leaves room for the limit's own transients. Without a limit, the ceiling is
// the most the power family can hold (families.Watts), above any GPU board made, as the exporter's series and
// views bound it.
const limitMargin = 2

var maxBoardWatts = families.Power.Range.Max

// ceilingWatts is the most power the accounts believe of d.
func ceilingWatts(d *gpu.Device) float64 {
	if l := d.PowerLimitWatts; l.Valid && isFinite(l.V) && l.V > 0 {
		return min(l.V*limitMargin, maxBoardWatts)
	}
	return maxBoardWatts
}

// plausible is a power reading the accounts can use: unknown when it is not finite, negative, or above ceiling.
func plausible(p gpu.Value, ceiling float64) gpu.Value {
	if !p.Valid || !isFinite(p.V) || p.V < 0 || p.V > ceiling {
		return gpu.Value{}
	}
	return p
}

// intervalEnergy is the board's energy between two readings dt seconds apart: the energy counter's delta when
// both readings have it, it did not go back (the driver was reloaded) and it is no more than the GPU could draw in
// the interval; else the trapezoid of the power readings, which plausible has already bounded.
func intervalEnergy(prevE, curE, prevP, curP gpu.Value, dt, ceiling float64) (float64, bool) {
	if prevE.Valid && curE.Valid && curE.V >= prevE.V && curE.V-prevE.V <= ceiling*dt {
		return curE.V - prevE.V, true
	}
	a, b := finite(prevP), finite(curP)
	switch {
	case prevP.Valid && curP.Valid:
		return (a + b) / 2 * dt, true
	case curP.Valid:
		return b * dt, true
	case prevP.Valid:
		return a * dt, true
	}
	return 0, false
}

// useSM reports whether shares go by SM utilization: some process reports it, and the reports sum to more than 0.
func useSM(ps []gpu.Process) bool {
	sum := 0.0
	for _, p := range ps {
		sum += finite(p.SMUtilizationRatio)
	}
	return sum > 0
}

// finite is a reading as a weight: unknown, negative, NaN and infinite readings weigh nothing, so that one bad
// value cannot make every share NaN.
func finite(v gpu.Value) float64 {
	if !v.Valid || !isFinite(v.V) || v.V < 0 {
		return 0
	}
	return v.V
}

func isFinite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func add(sum *gpu.Value, v gpu.Value) {
	if v.Valid {
		sum.V += finite(v)
		sum.Valid = true
	}
}

// integrate adds v x dt to the counter when v is known; the counter becomes known at the first known value.
func integrate(c *gpu.Value, v gpu.Value, dt float64) {
	if v.Valid {
		c.V += v.V * dt
		c.Valid = true
	}
}

// touch makes the counter known (at 0 if new) once the workload has a known value.
func touch(c *gpu.Value, v gpu.Value) {
	if v.Valid {
		c.Valid = true
	}
}
