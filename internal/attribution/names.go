package attribution

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
)

// names asks the runtimes for containers' names and caches the answers per container ID.
//
// A name is kept while its container has GPU processes: the cache holds only the containers of the last complete
// snapshot, so it is bounded by the node's GPU containers and a removed container's entry goes at the next scrape.
// A container that no runtime knows, or that could not be looked up, is left unasked for NegativeTTL.
// Each container has at most one lookup in flight, all lookups together at most MaxConcurrentLookups runtime calls
// and MaxPendingLookups lookups (running or queued), and a scrape waits for them at most LookupBudget; a slower
// lookup completes in the background and serves the next scrape. A lookup of a container that a complete snapshot
// no longer lists is cancelled: on a node that churns containers while a runtime hangs, lookups must not pile up
// for containers that are gone.
type names struct {
	resolvers   *resolvers
	metrics     *metrics
	podLabels   runtime.LabelAllowlist
	budget      time.Duration
	negativeTTL time.Duration
	now         func() time.Time
	sem         chan struct{}
	maxPending  int
	logger      *slog.Logger
	backlog     logstate.State // "full" while new lookups are deferred for want of room

	ctx    context.Context // ends at close: background lookups stop
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	entries  map[string]*entry
	inFlight int // lookups started and not ended, including cancelled ones still unwinding
}

// entry is the cache state of one container ID. Its fields other than done are guarded by names.mu.
//
// An entry is pending while its lookup runs; then it is named (named set, complete or partial) or unnamed (named
// nil: no runtime knew the container or none could be asked). A partial or unnamed entry expires, and its
// container is looked up again; a partial answer is served meanwhile (prev).
type entry struct {
	done    chan struct{}      // closed when the lookup has ended
	cancel  context.CancelFunc // ends the lookup early: its container is gone
	named   *runtime.Container // the answer; nil while pending or when no runtime could name the container
	partial bool               // named is incomplete (ErrIncomplete): it is used, and looked up again at expires
	prev    *runtime.Container // a partial answer of the entry this one replaces, served while this lookup runs
	expires time.Time          // when an unanswered or partial lookup may be retried
	seen    time.Time          // when a snapshot last listed the container
}

// pending reports whether the entry's lookup is still running.
func (e *entry) pending() bool { return isOpen(e.done) }

// complete reports whether the entry has a full answer, kept for the container's life.
func (e *entry) complete() bool { return e.named != nil && !e.partial }

// current reports whether the entry serves as it is, without a new lookup: its lookup is running, its answer is
// complete, or it is too early to ask again.
func (e *entry) current(now time.Time) bool {
	return e.pending() || e.complete() || now.Before(e.expires)
}

// answer returns the names to use now: the lookup's, or while a refresh of a partial answer runs, the partial one.
func (e *entry) answer() (runtime.Container, bool) {
	switch {
	case e.named != nil:
		return *e.named, true
	case e.prev != nil:
		return *e.prev, true
	}
	return runtime.Container{}, false
}

// staleAfter drops the entries of containers that no snapshot listed for this long, complete or not.
const staleAfter = 5 * time.Minute

func newNames(cfg Config, m *metrics) *names {
	n := &names{
		resolvers:   newResolvers(cfg, m),
		metrics:     m,
		podLabels:   runtime.NewLabelAllowlist(cfg.PodLabels),
		budget:      cfg.LookupBudget,
		negativeTTL: cfg.NegativeTTL,
		now:         cfg.Now,
		sem:         make(chan struct{}, cfg.MaxConcurrentLookups),
		maxPending:  cfg.MaxPendingLookups,
		logger:      cfg.Logger,
		entries:     make(map[string]*entry),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	return n
}

// lookup names the containers in want. It starts lookups for those not cached, waits for them within the budget,
// and returns the names known by then, and the containers whose lookup has ended without a name. When complete is
// true (the snapshot lists every GPU process), entries of containers not in want are dropped, and their lookups
// cancelled.
func (n *names) lookup(ctx context.Context, want map[string]lookupHint, complete bool) (map[string]runtime.Container, map[string]bool) {
	now := n.now()
	var waits []chan struct{}
	deferred := 0
	n.mu.Lock()
	// Drop the gone first, so that their lookups make room for the new.
	for id, e := range n.entries {
		if _, ok := want[id]; ok {
			continue
		}
		// A container missing from an incomplete snapshot may still be there, and its lookup runs on; past
		// staleAfter it is gone in any case, which keeps the cache bounded on a node whose process lists keep
		// failing.
		if complete || now.Sub(e.seen) > staleAfter {
			e.cancel()
			delete(n.entries, id)
		}
	}
	for id, h := range want {
		e := n.entries[id]
		if e != nil {
			e.seen = now
			if e.current(now) {
				if e.pending() {
					waits = append(waits, e.done)
				}
				continue
			}
		}
		chain := n.resolvers.chain(h)
		if len(chain) == 0 || n.ctx.Err() != nil {
			continue // no runtime to ask: the cgroup labels are all there is
		}
		if n.inFlight >= n.maxPending {
			// A runtime that answers slower than containers come: the container keeps its cgroup labels (and an
			// expired partial answer) and is looked up at a later scrape, when there is room.
			deferred++
			continue
		}
		var prev *runtime.Container
		if e != nil && e.partial {
			prev = e.named
		}
		lctx, cancel := context.WithCancel(n.ctx)
		e = &entry{done: make(chan struct{}), cancel: cancel, seen: now, prev: prev}
		n.entries[id] = e
		waits = append(waits, e.done)
		n.inFlight++
		n.wg.Add(1)
		go n.resolve(lctx, id, e, chain)
	}
	inFlight := n.inFlight
	n.mu.Unlock()
	n.logBacklog(deferred, inFlight)

	if len(waits) > 0 {
		n.wait(ctx, waits)
	}

	out := make(map[string]runtime.Container, len(want))
	var unnamed map[string]bool
	n.mu.Lock()
	for id := range want {
		e := n.entries[id]
		if e == nil {
			continue
		}
		if c, ok := e.answer(); ok {
			out[id] = c
		} else if !e.pending() {
			if unnamed == nil {
				unnamed = make(map[string]bool)
			}
			unnamed[id] = true
		}
	}
	n.mu.Unlock()
	return out, unnamed
}

// wait blocks until every lookup in waits has ended, the budget is spent or ctx ends.
func (n *names) wait(ctx context.Context, waits []chan struct{}) {
	timer := time.NewTimer(n.budget)
	defer timer.Stop()
	for _, done := range waits {
		select {
		case <-done:
		case <-timer.C:
			n.metrics.budgetExceeded.Inc()
			return
		case <-ctx.Done():
			return
		}
	}
}

// logBacklog logs, once per change, that lookups are deferred because MaxPendingLookups are in flight.
func (n *names) logBacklog(deferred, inFlight int) {
	state := ""
	if deferred > 0 {
		state = "full"
	}
	if _, changed := n.backlog.Set(state); !changed {
		return
	}
	if state != "" {
		n.logger.Warn("container runtimes answer slower than containers come: new containers keep their cgroup "+
			"labels until the lookups in flight end", "in_flight", inFlight, "deferred", deferred)
	} else {
		n.logger.Info("container runtime lookups keep up again")
	}
}

// resolve asks the chain's resolvers in turn until one knows the container, and stores the answer in e. ctx ends
// when the container is gone or at close.
func (n *names) resolve(ctx context.Context, id string, e *entry, chain []resolverRef) {
	defer n.wg.Done()
	defer e.cancel()
	var answer *runtime.Container
	partial := false
	defer func() {
		n.mu.Lock()
		n.inFlight--
		if answer == nil && e.prev != nil {
			// The refresh of a partial answer failed: keep what was known and try again later.
			answer, partial = e.prev, true
		}
		e.named, e.partial, e.prev = answer, partial, nil
		if answer == nil || partial {
			e.expires = n.now().Add(n.negativeTTL)
		}
		n.mu.Unlock()
		close(e.done)
	}()

	select {
	case n.sem <- struct{}{}:
		defer func() { <-n.sem }()
	case <-ctx.Done():
		return
	}
	for _, ref := range chain {
		c, err := n.resolvers.call(ctx, ref, id)
		if err == nil || errors.Is(err, runtime.ErrIncomplete) {
			// An incomplete answer (names without pod labels) beats none; it is looked up again after the
			// negative TTL rather than kept for the container's life.
			c.PodLabels = n.podLabels.Keep(c.PodLabels)
			answer, partial = &c, err != nil
			return
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// counts returns the cache's entries by state, for self-metrics.
func (n *names) counts() (resolved, unresolved, pending int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.entries {
		switch {
		case e.pending():
			pending++
		case e.named != nil:
			resolved++
		default:
			unresolved++
		}
	}
	return resolved, unresolved, pending
}

func (n *names) close() {
	n.cancel()
	n.wg.Wait()
}

func isOpen(done chan struct{}) bool {
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// applyNames puts a runtime's names into an identity whose cgroup-derived fields are already set. outer is true
// when the container is the pod's container that holds the process's own (Docker-in-Docker in a pod): it names
// the pod and container, and the identity keeps its own container ID and runtime.
func applyNames(c runtime.Container, id *Identity, outer bool) {
	id.Namespace = c.Namespace
	id.Pod = c.Pod // a Podman pod's name for a plain container
	id.Container = c.Name
	if id.PodUID == "" {
		id.PodUID = c.PodUID
	}
	if !outer && id.Runtime == "" {
		id.Runtime = c.Runtime
	}
	id.PodLabels = c.PodLabels
}
