package accounting

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const gib = 1 << 30

// proc is a process of the pod named owner.
type proc struct {
	pid    uint32
	owner  string
	sm     gpu.Value
	memory gpu.Value
	mig    bool
}

// readingAt builds a reading at t0+seconds of one or more devices, with each process owned by the pod its owner names.
func readingAt(seconds float64, devices ...gpu.Device) *reading.Reading {
	owners := map[uint32]attribution.Owner{}
	return &reading.Reading{Snapshot: &gpu.Snapshot{Time: t0.Add(time.Duration(seconds * float64(time.Second))), Devices: devices}, Owners: owners}
}

func device(index int, power, energy gpu.Value, procs ...proc) gpu.Device {
	d := gpu.Device{Index: index, UUID: fmt.Sprintf("GPU-%d", index), PowerUsageWatts: power, EnergyJoules: energy, ProcessesListed: true}
	for _, p := range procs {
		d.Processes = append(d.Processes, gpu.Process{PID: p.pid, Name: p.owner, SMUtilizationRatio: p.sm, UsedMemoryBytes: p.memory, MIG: p.mig})
	}
	return d
}

// attribute names each process's owner after its Name: the pod of that name in namespace "ns".
func attribute(r *reading.Reading) *reading.Reading {
	for _, d := range r.Snapshot.Devices {
		for _, p := range d.Processes {
			r.Owners[p.PID] = attribution.Owner{Name: p.Name, Identity: attribution.Identity{Namespace: "ns", Pod: p.Name}}
		}
	}
	return r
}

func observe(t *testing.T, l *Ledger, r *reading.Reading) {
	t.Helper()
	if !l.Observe(attribute(r)) {
		t.Fatalf("reading at %s not observed", r.Snapshot.Time)
	}
}

// account is the ledger's view of one GPU, by pod.
type account struct {
	power, unattributedPower gpu.Value
	unattributedEnergy       float64
	workloads                map[string]Workload
}

func accounts(l *Ledger) map[string]account {
	out := map[string]account{}
	l.Each(func(g *GPU) {
		a := account{power: g.PowerWatts, unattributedPower: g.UnattributedPowerWatts, unattributedEnergy: g.UnattributedEnergyJoules, workloads: map[string]Workload{}}
		for _, w := range g.Workloads {
			a.workloads[w.Identity.Pod] = *w
		}
		out[g.UUID] = a
	})
	return out
}

func near(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

func wantValue(t *testing.T, what string, got gpu.Value, want float64) {
	t.Helper()
	if !got.Valid || !near(got.V, want) {
		t.Errorf("%s = %+v, want %g", what, got, want)
	}
}

func wantFloat(t *testing.T, what string, got, want float64) {
	t.Helper()
	if !near(got, want) {
		t.Errorf("%s = %g, want %g", what, got, want)
	}
}

var k = gpu.Known

// A GPU that reports per-process utilization splits by SM share: two processes of one pod add up, memory does
// not count, and the energy counter's delta is split by the shares of the later reading.
func TestSplitBySMShare(t *testing.T) {
	l := New()
	procs := []proc{
		{pid: 1, owner: "a", sm: k(0.3), memory: k(1 * gib)},
		{pid: 2, owner: "b", sm: k(0.1), memory: k(30 * gib)},
		{pid: 3, owner: "a", sm: k(0.2), memory: k(1 * gib)},
		{pid: 4, owner: "idle-notebook", sm: k(0), memory: k(20 * gib)},
	}
	observe(t, l, readingAt(0, device(0, k(250), k(1000), procs...)))
	a := accounts(l)["GPU-0"]
	// The first reading: power is split, counters start at 0.
	wantValue(t, "power a", a.workloads["a"].PowerWatts, 250*0.5/0.6)
	wantValue(t, "power b", a.workloads["b"].PowerWatts, 250*0.1/0.6)
	wantValue(t, "power idle", a.workloads["idle-notebook"].PowerWatts, 0)
	wantValue(t, "unattributed power", a.unattributedPower, 0)
	wantFloat(t, "energy a", a.workloads["a"].EnergyJoules, 0)
	wantValue(t, "sm-seconds a", a.workloads["a"].SMSeconds, 0)

	observe(t, l, readingAt(10, device(0, k(300), k(1000+3000), procs...)))
	a = accounts(l)["GPU-0"]
	wantValue(t, "power a", a.workloads["a"].PowerWatts, 250)
	wantValue(t, "power b", a.workloads["b"].PowerWatts, 50)
	wantFloat(t, "energy a", a.workloads["a"].EnergyJoules, 2500)
	wantFloat(t, "energy b", a.workloads["b"].EnergyJoules, 500)
	wantFloat(t, "energy idle", a.workloads["idle-notebook"].EnergyJoules, 0)
	wantFloat(t, "unattributed energy", a.unattributedEnergy, 0)
	wantValue(t, "sm-seconds a", a.workloads["a"].SMSeconds, 5)
	wantValue(t, "sm-seconds b", a.workloads["b"].SMSeconds, 1)
	wantValue(t, "sm-seconds idle", a.workloads["idle-notebook"].SMSeconds, 0)
	// The idle notebook's 20 GiB shows up in memory-time, not in GPU time.
	wantValue(t, "byte-seconds idle", a.workloads["idle-notebook"].MemoryByteSeconds, 20*gib*10)
	wantValue(t, "byte-seconds a", a.workloads["a"].MemoryByteSeconds, 2*gib*10)
}

// Without per-process utilization (nvidia-smi, MIG) or when it sums to 0, memory decides.
func TestSplitByMemoryShare(t *testing.T) {
	for name, sm := range map[string][2]gpu.Value{"not reported": {}, "all zero": {k(0), k(0)}} {
		t.Run(name, func(t *testing.T) {
			l := New()
			procs := []proc{{pid: 1, owner: "a", sm: sm[0], memory: k(3 * gib)}, {pid: 2, owner: "b", sm: sm[1], memory: k(1 * gib)}}
			observe(t, l, readingAt(0, device(0, k(200), k(0), procs...)))
			observe(t, l, readingAt(5, device(0, k(200), k(1000), procs...)))
			a := accounts(l)["GPU-0"]
			wantValue(t, "power a", a.workloads["a"].PowerWatts, 150)
			wantValue(t, "power b", a.workloads["b"].PowerWatts, 50)
			wantFloat(t, "energy a", a.workloads["a"].EnergyJoules, 750)
			wantFloat(t, "energy b", a.workloads["b"].EnergyJoules, 250)
			if sm[0].Valid {
				wantValue(t, "sm-seconds a", a.workloads["a"].SMSeconds, 0)
			} else if a.workloads["a"].SMSeconds.Valid {
				t.Errorf("sm-seconds without per-process utilization = %+v, want absent", a.workloads["a"].SMSeconds)
			}
		})
	}
}

// An idle GPU's power and energy are all unattributed; so are those of a GPU whose processes report nothing.
func TestIdleAndUnreportedGPU(t *testing.T) {
	l := New()
	observe(t, l, readingAt(0, device(0, k(70), k(0)), device(1, k(90), k(0), proc{pid: 1, owner: "a"})))
	observe(t, l, readingAt(10, device(0, k(70), k(700)), device(1, k(90), k(900), proc{pid: 1, owner: "a"})))
	as := accounts(l)
	wantValue(t, "idle unattributed power", as["GPU-0"].unattributedPower, 70)
	wantFloat(t, "idle unattributed energy", as["GPU-0"].unattributedEnergy, 700)
	wantValue(t, "unreported unattributed power", as["GPU-1"].unattributedPower, 90)
	wantFloat(t, "unreported unattributed energy", as["GPU-1"].unattributedEnergy, 900)
	w := as["GPU-1"].workloads["a"]
	wantValue(t, "unreported workload power", w.PowerWatts, 0)
	if w.SMSeconds.Valid || w.MemoryByteSeconds.Valid {
		t.Errorf("workload without readings has sm-seconds %+v, byte-seconds %+v, want both absent", w.SMSeconds, w.MemoryByteSeconds)
	}
}

// Without an energy counter the interval's energy is the trapezoid of the power readings; a counter that went
// back (the driver was reloaded) is not trusted for that interval.
func TestEnergyWithoutCounter(t *testing.T) {
	procs := []proc{{pid: 1, owner: "a", memory: k(gib)}}
	for name, tc := range map[string]struct {
		e0, e1 gpu.Value
		p0, p1 gpu.Value
		want   float64
	}{
		"no counter":            {p0: k(100), p1: k(300), want: 2000},
		"counter reset":         {e0: k(5e6), e1: k(10), p0: k(100), p1: k(300), want: 2000},
		"earlier power unknown": {p1: k(300), want: 3000},
		"later power unknown":   {p0: k(100), want: 1000},
		"counter only":          {e0: k(10), e1: k(1510), want: 1500},
	} {
		t.Run(name, func(t *testing.T) {
			l := New()
			observe(t, l, readingAt(0, device(0, tc.p0, tc.e0, procs...)))
			observe(t, l, readingAt(10, device(0, tc.p1, tc.e1, procs...)))
			wantFloat(t, "energy", accounts(l)["GPU-0"].workloads["a"].EnergyJoules, tc.want)
		})
	}
	l := New()
	observe(t, l, readingAt(0, device(0, gpu.Value{}, gpu.Value{}, procs...)))
	observe(t, l, readingAt(10, device(0, gpu.Value{}, gpu.Value{}, procs...)))
	a := accounts(l)["GPU-0"]
	if a.unattributedPower.Valid || a.workloads["a"].PowerWatts.Valid || a.workloads["a"].EnergyJoules != 0 || a.unattributedEnergy != 0 {
		t.Errorf("GPU without power or energy: %+v", a)
	}
}

// A workload that arrives starts at 0 and its first interval is unattributed; one that leaves is dropped, and
// the interval in which it left goes to those still there.
func TestWorkloadsJoinAndLeave(t *testing.T) {
	l := New()
	a := proc{pid: 1, owner: "a", sm: k(0.5)}
	b := proc{pid: 2, owner: "b", sm: k(0.5)}
	observe(t, l, readingAt(0, device(0, k(100), k(0), a)))
	observe(t, l, readingAt(10, device(0, k(100), k(1000), a, b)))
	acc := accounts(l)["GPU-0"]
	wantFloat(t, "a after b joined", acc.workloads["a"].EnergyJoules, 500)
	wantFloat(t, "b on arrival", acc.workloads["b"].EnergyJoules, 0)
	wantFloat(t, "unattributed on b's arrival", acc.unattributedEnergy, 500)
	wantValue(t, "b's power on arrival", acc.workloads["b"].PowerWatts, 50)
	observe(t, l, readingAt(20, device(0, k(100), k(2000), b)))
	acc = accounts(l)["GPU-0"]
	if _, ok := acc.workloads["a"]; ok {
		t.Error("a is still accounted after leaving")
	}
	wantFloat(t, "b after a left", acc.workloads["b"].EnergyJoules, 1000)
	wantFloat(t, "unattributed", acc.unattributedEnergy, 500)
	// a comes back: a new series, from 0.
	observe(t, l, readingAt(30, device(0, k(100), k(3000), a, b)))
	wantFloat(t, "a back", accounts(l)["GPU-0"].workloads["a"].EnergyJoules, 0)
	if n := len(l.gpus["GPU-0"].byKey); n != 2 {
		t.Errorf("ledger holds %d workloads, want 2", n)
	}
}

// A failed reading never reaches the ledger: the next one covers the gap, once. A GPU missing from a reading and
// a reading whose process list failed are handled the same way.
func TestFailedReadingInBetween(t *testing.T) {
	procs := []proc{{pid: 1, owner: "a", sm: k(0.75)}, {pid: 2, owner: "b", sm: k(0.25)}}
	l := New()
	observe(t, l, readingAt(0, device(0, k(100), k(0), procs...), device(1, k(100), k(0), procs...)))
	// 10 s: the reading failed as a whole (not observed). 20 s: GPU 1 failed.
	observe(t, l, readingAt(20, device(0, k(100), k(2000), procs...)))
	if _, ok := accounts(l)["GPU-1"]; ok {
		t.Error("a GPU missing from the latest reading is still served")
	}
	observe(t, l, readingAt(30, device(0, k(100), k(3000), procs...), device(1, k(100), k(3000), procs...)))
	for _, uuid := range []string{"GPU-0", "GPU-1"} {
		acc := accounts(l)[uuid]
		wantFloat(t, uuid+" a", acc.workloads["a"].EnergyJoules, 2250)
		wantFloat(t, uuid+" b", acc.workloads["b"].EnergyJoules, 750)
		wantValue(t, uuid+" a sm-seconds", acc.workloads["a"].SMSeconds, 0.75*30)
	}

	// The process list could not be read: the interval is unattributed, the workloads keep their counters and
	// come back without restarting.
	d := device(0, k(100), k(4000))
	d.ProcessesListed = false
	observe(t, l, readingAt(40, d))
	acc := accounts(l)["GPU-0"]
	wantFloat(t, "unattributed while unlisted", acc.unattributedEnergy, 1000)
	wantFloat(t, "a while unlisted", acc.workloads["a"].EnergyJoules, 2250)
	if acc.workloads["a"].PowerWatts.Valid {
		t.Error("a workload's power is known while the process list is not")
	}
	observe(t, l, readingAt(50, device(0, k(100), k(5000), procs...)))
	wantFloat(t, "a after the list is back", accounts(l)["GPU-0"].workloads["a"].EnergyJoules, 3000)
}

// A reading is accounted once: concurrent scrapes share one, and a late scrape with an older one changes nothing.
func TestReadingAccountedOnce(t *testing.T) {
	l := New()
	procs := []proc{{pid: 1, owner: "a", sm: k(1)}}
	observe(t, l, readingAt(0, device(0, k(100), k(0), procs...)))
	older := attribute(readingAt(5, device(0, k(100), k(500), procs...)))
	r := attribute(readingAt(10, device(0, k(100), k(1000), procs...)))
	observe(t, l, r)
	if l.Observe(r) || l.Observe(older) {
		t.Error("a reading was accounted twice, or an older one after a newer")
	}
	wantFloat(t, "energy", accounts(l)["GPU-0"].workloads["a"].EnergyJoules, 1000)
}

// On MIG the whole GPU's power is split across the processes of all its instances (by memory: NVML reports no
// per-process utilization on MIG).
func TestMIG(t *testing.T) {
	l := New()
	procs := []proc{
		{pid: 1, owner: "train", memory: k(18 * gib), mig: true},
		{pid: 2, owner: "serve", memory: k(6 * gib), mig: true},
	}
	observe(t, l, readingAt(0, device(0, k(240), k(0), procs...)))
	observe(t, l, readingAt(15, device(0, k(240), k(3600), procs...)))
	acc := accounts(l)["GPU-0"]
	wantValue(t, "train power", acc.workloads["train"].PowerWatts, 180)
	wantValue(t, "serve power", acc.workloads["serve"].PowerWatts, 60)
	wantFloat(t, "train energy", acc.workloads["train"].EnergyJoules, 2700)
	wantFloat(t, "serve energy", acc.workloads["serve"].EnergyJoules, 900)
	wantValue(t, "unattributed power", acc.unattributedPower, 0)
}

// Values a driver should not report but might (NaN, negative) weigh nothing instead of poisoning every share.
func TestBadValues(t *testing.T) {
	l := New()
	procs := []proc{{pid: 1, owner: "a", sm: k(math.NaN()), memory: k(-1)}, {pid: 2, owner: "b", sm: k(0.5), memory: k(gib)}}
	observe(t, l, readingAt(0, device(0, k(100), k(0), procs...)))
	observe(t, l, readingAt(10, device(0, k(100), k(1000), procs...)))
	acc := accounts(l)["GPU-0"]
	wantFloat(t, "a", acc.workloads["a"].EnergyJoules, 0)
	wantFloat(t, "b", acc.workloads["b"].EnergyJoules, 1000)
}

// An absurd reading (a power of 1e308 W, an energy counter that jumps by more than the GPU can draw) is unknown:
// the counters stay finite, and go on adding up once the readings are sane again.
func TestAbsurdReadings(t *testing.T) {
	procs := []proc{{pid: 1, owner: "a", sm: k(0.5)}, {pid: 2, owner: "b", sm: k(0.25)}}
	limited := func(power, energy gpu.Value) gpu.Device {
		d := device(0, power, energy, procs...)
		d.PowerLimitWatts = k(700)
		return d
	}
	for name, tc := range map[string]struct {
		absurd  gpu.Device
		unknown bool // the board power of the absurd reading is unknown
	}{
		// Power 1e308 W without a counter: the power is unknown, and the intervals around it take the other
		// reading's power, as when the driver gives none.
		"huge power":      {absurd: device(0, k(1e308), gpu.Value{}, procs...), unknown: true},
		"infinite power":  {absurd: device(0, k(math.Inf(1)), gpu.Value{}, procs...), unknown: true},
		"NaN power":       {absurd: device(0, k(math.NaN()), gpu.Value{}, procs...), unknown: true},
		"above the limit": {absurd: limited(k(5000), gpu.Value{}), unknown: true},
	} {
		t.Run(name, func(t *testing.T) {
			l := New()
			observe(t, l, readingAt(0, device(0, k(300), gpu.Value{}, procs...)))
			observe(t, l, readingAt(10, device(0, k(300), gpu.Value{}, procs...)))
			observe(t, l, readingAt(20, tc.absurd))
			a := accounts(l)["GPU-0"]
			if a.power.Valid != !tc.unknown || a.workloads["a"].PowerWatts.Valid != !tc.unknown {
				t.Errorf("board power %+v, a's %+v after an absurd reading", a.power, a.workloads["a"].PowerWatts)
			}
			observe(t, l, readingAt(30, device(0, k(300), gpu.Value{}, procs...)))
			observe(t, l, readingAt(40, device(0, k(300), gpu.Value{}, procs...)))
			a = accounts(l)["GPU-0"]
			// 40 s at 300 W (10-30 from the sane reading at either end): 12 kJ, two thirds to a, a third to b.
			wantFloat(t, "a", a.workloads["a"].EnergyJoules, 8000)
			wantFloat(t, "b", a.workloads["b"].EnergyJoules, 4000)
			wantFloat(t, "unattributed", a.unattributedEnergy, 0)
		})
	}
	// A counter that jumps by 5 MJ in 0.5 s (10 MW) on a 700 W GPU: the trapezoid of the power readings instead.
	l := New()
	observe(t, l, readingAt(0, limited(k(300), k(1000))))
	observe(t, l, readingAt(0.5, limited(k(300), k(1000+150))))
	observe(t, l, readingAt(1, limited(k(300), k(5e6))))
	observe(t, l, readingAt(2, limited(k(300), k(5e6+300))))
	a := accounts(l)["GPU-0"]
	// 150 J (counter) + 150 J (trapezoid, not 5 MJ) + 300 J (counter), two thirds to a.
	wantFloat(t, "a after a counter jump", a.workloads["a"].EnergyJoules, 400)
	wantFloat(t, "b after a counter jump", a.workloads["b"].EnergyJoules, 200)
	// A counter at +Inf, then back: the trapezoid, then the counter again from where it is.
	l = New()
	observe(t, l, readingAt(0, limited(k(300), k(1000))))
	observe(t, l, readingAt(1, limited(k(300), k(math.Inf(1)))))
	observe(t, l, readingAt(2, limited(k(300), k(1600))))
	observe(t, l, readingAt(3, limited(k(300), k(1900))))
	a = accounts(l)["GPU-0"]
	for pod, w := range a.workloads {
		if math.IsNaN(w.EnergyJoules) || math.IsInf(w.EnergyJoules, 0) {
			t.Errorf("%s: energy %g after an infinite counter", pod, w.EnergyJoules)
		}
	}
	// 300 J (trapezoid) + 300 J (trapezoid: a delta from +Inf is no delta) + 300 J (counter), two thirds to a.
	wantFloat(t, "a after an infinite counter", a.workloads["a"].EnergyJoules, 600)
}

// randomNode simulates a node over many readings: GPUs with and without energy counters and per-process
// utilization, MIG, workloads coming and going, readings that fail as a whole, GPUs and process lists that fail.
// At each reading it checks that workload and unattributed power add up to the board's and that no counter goes
// back; it returns the board energy over the run (from the GPUs' counters, or the power integral for GPUs without
// one) and what the ledger accounted for it (workloads, those that left included, plus unattributed).
func randomNode(t testing.TB, rng *rand.Rand, readings int) (board, accounted float64) {
	l := New()
	const gpus = 4
	var (
		boardEnergy, power     [gpus]float64
		hasCounter, hasSM, mig [gpus]bool
		seen                   [gpus]bool
		lastEnergy, lastPower  [gpus]float64
		lastElapsed            [gpus]time.Duration
	)
	for g := range gpus {
		hasCounter[g], hasSM[g], mig[g] = rng.IntN(3) > 0, rng.IntN(2) > 0, rng.IntN(4) == 0
		boardEnergy[g] = rng.Float64() * 1e9
	}
	type counters struct{ energy, sm, mem float64 }
	prev := map[string]map[string]counters{}
	gone := 0.0 // energy of workloads that left
	// Time is kept in whole nanoseconds, as a reading's timestamp is: the board's power integral below is then
	// over the very intervals the ledger sees.
	var elapsed time.Duration
	for range readings {
		step := time.Duration((0.5 + rng.Float64()*30) * float64(time.Second))
		dt := step.Seconds()
		elapsed += step
		var devices []gpu.Device
		for g := range gpus {
			p := 50 + rng.Float64()*650
			boardEnergy[g] += (power[g] + p) / 2 * dt
			power[g] = p
			if rng.IntN(20) == 0 {
				continue // this GPU could not be read
			}
			var procs []proc
			for i := range rng.IntN(6) {
				p := proc{pid: uint32(g*100 + i), owner: fmt.Sprintf("w%d", rng.IntN(8)), memory: k(float64(rng.IntN(40)) * gib), mig: mig[g]}
				if hasSM[g] && !mig[g] {
					p.sm = k(float64(rng.IntN(5)) / 10)
				}
				procs = append(procs, p)
			}
			energy := gpu.Value{}
			if hasCounter[g] {
				energy = k(boardEnergy[g])
			}
			d := device(g, k(power[g]), energy, procs...)
			d.ProcessesListed = rng.IntN(25) != 0
			devices = append(devices, d)
		}
		if rng.IntN(10) == 0 {
			continue // the whole reading failed or timed out: it never reaches the ledger
		}
		for _, d := range devices {
			g := d.Index
			if seen[g] {
				if hasCounter[g] {
					board += boardEnergy[g] - lastEnergy[g]
				} else {
					board += (lastPower[g] + power[g]) / 2 * (elapsed - lastElapsed[g]).Seconds()
				}
			}
			seen[g], lastEnergy[g], lastPower[g], lastElapsed[g] = true, boardEnergy[g], power[g], elapsed
		}
		r := readingAt(0, devices...)
		r.Snapshot.Time = t0.Add(elapsed)
		l.Observe(attribute(r))
		l.Each(func(g *GPU) {
			if g.PowerWatts.Valid && g.listed {
				sum := g.UnattributedPowerWatts.V
				for _, w := range g.Workloads {
					sum += w.PowerWatts.V
				}
				if !near(sum, g.PowerWatts.V) {
					t.Fatalf("GPU %d: workloads and unattributed power add up to %g W, board %g W", g.Index, sum, g.PowerWatts.V)
				}
			}
			now := map[string]counters{}
			for _, w := range g.Workloads {
				c := counters{w.EnergyJoules, w.SMSeconds.V, w.MemoryByteSeconds.V}
				if p, ok := prev[g.UUID][w.Identity.Pod]; ok && (c.energy < p.energy || c.sm < p.sm || c.mem < p.mem) {
					t.Fatalf("GPU %d, %s: counters went back from %+v to %+v", g.Index, w.Identity.Pod, p, c)
				}
				now[w.Identity.Pod] = c
			}
			for pod, c := range prev[g.UUID] {
				if _, ok := now[pod]; !ok {
					gone += c.energy
				}
			}
			prev[g.UUID] = now
		})
	}
	accounted = gone
	for _, g := range l.gpus {
		accounted += g.UnattributedEnergyJoules
		for _, w := range g.Workloads {
			accounted += w.EnergyJoules
		}
	}
	return board, accounted
}

// The "done when": over many readings, workload plus unattributed energy matches the GPUs' energy.
func TestEnergyClosureOverManyReadings(t *testing.T) {
	const readings = 20000
	rng := rand.New(rand.NewPCG(12, 2026))
	board, accounted := randomNode(t, rng, readings)
	rel := math.Abs(accounted-board) / board
	t.Logf("%d readings: board %.6g J, accounted %.6g J, relative error %.3g", readings, board, accounted, rel)
	if rel > 1e-9 {
		t.Errorf("relative closure error %g", rel)
	}
}

func FuzzEnergyClosure(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint16(50))
	f.Add(uint64(7), uint64(0), uint16(3))
	f.Fuzz(func(t *testing.T, a, b uint64, readings uint16) {
		board, accounted := randomNode(t, rand.New(rand.NewPCG(a, b)), int(readings%2000))
		if math.Abs(accounted-board) > 1e-9*math.Max(1, board) {
			t.Errorf("board %g J, accounted %g J", board, accounted)
		}
	})
}

func BenchmarkObserve(b *testing.B) {
	// 8 GPUs with 256 processes of 32 workloads each, as the collector's benchmark node.
	var devices []gpu.Device
	for g := range 8 {
		var procs []proc
		for p := range 256 {
			procs = append(procs, proc{pid: uint32(g*1000 + p + 1), owner: fmt.Sprintf("job-%d-%d", g, p%32), sm: k(0.01), memory: k(1 << 28)})
		}
		devices = append(devices, device(g, k(400), k(1e8), procs...))
	}
	r := attribute(readingAt(0, devices...))
	l := New()
	l.Observe(r)
	b.ReportAllocs()
	for b.Loop() {
		r.Snapshot.Time = r.Snapshot.Time.Add(time.Second)
		l.Observe(r)
	}
}

// Without a power limit, the accounts believe what the power family can hold (its range in internal/families, as
// the exporter's gpu_power_usage_watts and the views bound it), and nothing above.
func TestPowerWithoutALimitIsTheFamilysRange(t *testing.T) {
	procs := []proc{{pid: 1, owner: "a", sm: k(1)}}
	for watts, believed := range map[float64]bool{7000: true, families.Power.Range.Max: true, families.Power.Range.Max + 1: false} {
		l := New()
		observe(t, l, readingAt(0, device(0, k(watts), gpu.Value{}, procs...)))
		if got := accounts(l)["GPU-0"].power; got.Valid != believed {
			t.Errorf("%v W without a limit: %+v, want believed %v", watts, got, believed)
		}
	}
}
