package attribution

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// hungResolver never answers while hang is set (until the call's context ends), and names every container
// otherwise. It counts its calls, those in flight and the most that ever were.
type hungResolver struct {
	hang     atomic.Bool
	calls    atomic.Int32
	inFlight atomic.Int32
	peak     atomic.Int32
}

func (r *hungResolver) Name() string { return runtime.ResolverCRI }

func (r *hungResolver) Resolve(ctx context.Context, id string) (runtime.Container, error) {
	r.calls.Add(1)
	n := r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	for p := r.peak.Load(); n > p && !r.peak.CompareAndSwap(p, n); p = r.peak.Load() {
	}
	if r.hang.Load() {
		<-ctx.Done()
		return runtime.Container{}, ctx.Err()
	}
	return runtime.Container{Namespace: "n", Pod: "p", Name: "c-" + id[:6]}, nil
}

// lookups is how many lookups of a are in flight, running or waiting for a runtime call: each is one goroutine,
// until it has ended.
func lookups(a *Attributor) int {
	a.names.mu.Lock()
	defer a.names.mu.Unlock()
	return a.names.inFlight
}

// waitLookupsEnded waits until no lookup of a is in flight.
func waitLookupsEnded(t *testing.T, a *Attributor) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, "the lookups in flight to end", func() bool { return lookups(a) == 0 })
}

// A lookup of a container that a complete snapshot no longer lists is cancelled at once, not left to run (or wait
// for a free slot) until the runtime's timeout; an abandoned call is neither a runtime error nor logged.
func TestLookupOfGoneContainerIsCancelled(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(5, "gone", crioCgroup(puid(5), cid(5)))
	cri := &hungResolver{}
	cri.hang.Store(true)
	logs := &testkit.Logs{}
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: time.Millisecond,
		LookupTimeout: time.Hour, Logger: slog.New(logs)})
	a.Attribute(t.Context(), snapshot(5))
	done := pendingDone(t, a, cid(5))
	a.Attribute(t.Context(), snapshot())
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the lookup of a container gone from a complete snapshot still runs")
	}
	waitLookupsEnded(t, a)
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_cache_entries", map[string]string{"state": "pending"}); v != 0 {
		t.Errorf("cache_entries{pending} = %v, want 0", v)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_requests_total", map[string]string{"resolver": "cri", "result": "error"}); v != 0 {
		t.Errorf("requests_total{error} = %v for an abandoned call, want 0", v)
	}
	if n := logs.CountAtLeast(slog.LevelInfo); n != 0 {
		t.Errorf("%d log records for an abandoned lookup, want 0", n)
	}
}

// A runtime that never answers, while containers keep coming: lookups in flight (each a goroutine) stay within
// MaxPendingLookups, runtime calls within MaxConcurrentLookups, and the deferral is logged once. The snapshots are
// incomplete (a device's process list fails), so that no container counts as gone and they all pile up.
func TestPendingLookupsAreBounded(t *testing.T) {
	const maxPending, maxCalls, containers = 16, 4, 200
	p := newProcFS(t)
	for i := 1; i <= containers; i++ {
		p.writeProc(uint32(i), "w", crioCgroup(puid(i), cid(i)))
	}
	cri := &hungResolver{}
	cri.hang.Store(true)
	logs := &testkit.Logs{}
	a := New(Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: time.Millisecond, LookupTimeout: time.Hour,
		MaxPendingLookups: maxPending, MaxConcurrentLookups: maxCalls, Logger: slog.New(logs)})

	var pids []uint32
	for i := 1; i <= containers; i++ {
		pids = append(pids, uint32(i))
		if i%10 != 0 {
			continue
		}
		snap := snapshot(pids...)
		snap.Devices = append(snap.Devices, gpu.Device{Index: 1, UUID: "GPU-1"}) // not listed: incomplete
		owners := a.Attribute(t.Context(), snap)
		if got := owners[uint32(i)].Identity; got.ContainerID != cid(i) || got.PodUID != puid(i) {
			t.Fatalf("container %d: %+v, want its cgroup labels", i, got)
		}
		if v := metricValue(t, a, "gpu_pod_exporter_resolver_cache_entries", map[string]string{"state": "pending"}); v > maxPending {
			t.Fatalf("after %d containers, cache_entries{pending} = %v, want at most %d", i, v, maxPending)
		}
		if n := lookups(a); n > maxPending {
			t.Fatalf("after %d containers, %d lookups in flight, want at most %d", i, n, maxPending)
		}
	}
	if n := cri.peak.Load(); n > maxCalls {
		t.Errorf("%d runtime calls at once, want at most %d", n, maxCalls)
	}
	if n := logs.Count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings about deferred lookups, want 1", n)
	}

	// Once the containers are gone (a complete snapshot), their lookups end and the room is back.
	a.Attribute(t.Context(), snapshot())
	waitLookupsEnded(t, a)
	cri.hang.Store(false)
	owners := a.Attribute(t.Context(), snapshot(1))
	if got := owners[1].Identity; got.Pod != "p" {
		t.Errorf("after the backlog: %+v, want the runtime's names", got)
	}
	a.Close()
	if n, calls := lookups(a), cri.inFlight.Load(); n != 0 || calls != 0 {
		t.Errorf("after Close: %d lookups and %d runtime calls in flight, want none", n, calls)
	}
}

// A runtime whose calls time out is backed off from: the next containers are not sent to it (and do not wait for
// it) for one timeout, then twice as long after a probe that times out again; the first probe that answers ends it.
func TestBackoffFromRuntimeThatTimesOut(t *testing.T) {
	p := newProcFS(t)
	for i := 1; i <= 6; i++ {
		p.writeProc(uint32(i), "w", crioCgroup(puid(i), cid(i)))
	}
	cri := &hungResolver{}
	cri.hang.Store(true)
	clk := newClock()
	const timeout = 20 * time.Millisecond
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: time.Minute,
		LookupTimeout: timeout, NegativeTTL: time.Hour, Now: clk.Now})
	requests := func(result string) float64 {
		return metricValue(t, a, "gpu_pod_exporter_resolver_requests_total", map[string]string{"resolver": "cri", "result": result})
	}

	a.Attribute(t.Context(), snapshot(1)) // times out
	a.Attribute(t.Context(), snapshot(2)) // backed off: not asked
	if c, b := cri.calls.Load(), requests("backoff"); c != 1 || b != 1 {
		t.Fatalf("during the backoff: %d calls (want 1), %v backed off (want 1)", c, b)
	}
	clk.Advance(timeout)
	a.Attribute(t.Context(), snapshot(3)) // the probe, which times out: twice as long
	clk.Advance(timeout)
	a.Attribute(t.Context(), snapshot(4))
	if c, b := cri.calls.Load(), requests("backoff"); c != 2 || b != 2 {
		t.Fatalf("after a second timeout: %d calls (want 2), %v backed off (want 2)", c, b)
	}
	clk.Advance(timeout)
	cri.hang.Store(false)
	owners := a.Attribute(t.Context(), snapshot(5)) // the probe answers
	owners6 := a.Attribute(t.Context(), snapshot(6))
	if owners[5].Identity.Pod != "p" || owners6[6].Identity.Pod != "p" {
		t.Errorf("after the runtime answers again: %+v, %+v", owners[5].Identity, owners6[6].Identity)
	}
	if c := cri.calls.Load(); c != 4 {
		t.Errorf("%d calls, want 4", c)
	}
}
