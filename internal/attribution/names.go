package attribution

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/cgroup"
)

// names asks the runtimes for containers' names and caches the answers per container ID.
//
// A name is kept while its container has GPU processes: the cache holds only the containers of the last complete
// snapshot, so it is bounded by the node's GPU containers and a removed container's entry goes at the next scrape.
// A container that no runtime knows, or that could not be looked up, is left unasked for NegativeTTL.
// Each container has at most one lookup in flight, all lookups together at most MaxConcurrentLookups, and a scrape
// waits for them at most LookupBudget; a slower lookup completes in the background and serves the next scrape.
type names struct {
	logger      *slog.Logger
	metrics     *metrics
	chains      map[lookupHint][]resolverRef
	all         []resolverRef
	podLabels   map[string]bool
	budget      time.Duration
	timeout     time.Duration
	negativeTTL time.Duration
	now         func() time.Time
	sem         chan struct{}

	ctx    context.Context // ends at close: background lookups stop
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	entries map[string]*entry
	down    []bool // per resolver (index in all): its last call failed
}

// resolverRef is one configured resolver and its index in names.all (resolvers may share a name, e.g. several CRI
// endpoints).
type resolverRef struct {
	index int
	r     Resolver
}

// lookupHint is what the cgroup tells about how to name a container.
type lookupHint struct {
	runtime string
	inPod   bool
}

// entry is the cache state of one container ID. Its fields other than done are guarded by names.mu.
type entry struct {
	done    chan struct{} // closed when the lookup has ended
	named   *named        // the answer; nil while pending or when no runtime could name the container
	partial bool          // named is incomplete (ErrIncomplete): it is used, and looked up again at expires
	prev    *named        // a partial answer of the entry this one replaces, served while this lookup runs
	expires time.Time     // when an unanswered or partial lookup may be retried
	seen    time.Time     // when a snapshot last listed the container
}

// staleAfter drops the entries of containers that no snapshot listed for this long, complete or not.
const staleAfter = 5 * time.Minute

// named is what the runtimes told about a container, ready to be applied to identities.
type named struct {
	Container
}

func newNames(cfg Config, m *metrics) *names {
	n := &names{
		logger:      cfg.Logger,
		metrics:     m,
		podLabels:   make(map[string]bool, len(cfg.PodLabels)),
		budget:      cfg.LookupBudget,
		timeout:     cfg.LookupTimeout,
		negativeTTL: cfg.NegativeTTL,
		now:         cfg.Now,
		sem:         make(chan struct{}, cfg.MaxConcurrentLookups),
		entries:     make(map[string]*entry),
		down:        make([]bool, len(cfg.Resolvers)),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	for _, k := range cfg.PodLabels {
		n.podLabels[k] = true
	}
	for i, r := range cfg.Resolvers {
		n.all = append(n.all, resolverRef{i, r})
	}
	n.chains = make(map[lookupHint][]resolverRef)
	for _, rt := range []string{cgroup.RuntimeContainerd, cgroup.RuntimeCRIO, cgroup.RuntimeDocker, cgroup.RuntimePodman, ""} {
		for _, inPod := range []bool{false, true} {
			h := lookupHint{rt, inPod}
			n.chains[h] = n.chainFor(h)
		}
	}
	return n
}

// chainFor orders the resolvers to ask for a container:
//   - containerd and CRI-O containers are Kubernetes': the CRI;
//   - Docker containers: Docker, then the CRI (cri-dockerd names Kubernetes containers that run on Docker);
//   - Podman containers: Podman;
//   - a container of unknown runtime in a pod: the CRI first, then the others;
//   - any other: every resolver, in the configured order.
func (n *names) chainFor(h lookupHint) []resolverRef {
	named := func(names ...string) []resolverRef {
		var out []resolverRef
		for _, name := range names {
			for _, ref := range n.all {
				if ref.r.Name() == name {
					out = append(out, ref)
				}
			}
		}
		return out
	}
	switch h.runtime {
	case cgroup.RuntimeContainerd, cgroup.RuntimeCRIO:
		return named(ResolverCRI)
	case cgroup.RuntimeDocker:
		return named(ResolverDocker, ResolverCRI)
	case cgroup.RuntimePodman:
		return named(ResolverPodman)
	}
	if !h.inPod {
		return n.all
	}
	chain := named(ResolverCRI)
	for _, ref := range n.all {
		if ref.r.Name() != ResolverCRI {
			chain = append(chain, ref)
		}
	}
	return chain
}

// lookup names the containers in want. It starts lookups for those not cached, waits for them within the budget,
// and returns the names known by then, and the containers whose lookup has ended without a name. When complete is
// true (the snapshot lists every GPU process), entries of containers not in want are dropped.
func (n *names) lookup(ctx context.Context, want map[string]lookupHint, complete bool) (map[string]named, map[string]bool) {
	now := n.now()
	var waits []chan struct{}
	n.mu.Lock()
	for id, h := range want {
		e := n.entries[id]
		if e != nil {
			e.seen = now
		}
		if e != nil && (isOpen(e.done) || now.Before(e.expires) || e.named != nil && !e.partial) {
			if isOpen(e.done) {
				waits = append(waits, e.done)
			}
			continue
		}
		chain, known := n.chains[h]
		if !known {
			chain = n.chains[lookupHint{"", h.inPod}]
		}
		if len(chain) == 0 || n.ctx.Err() != nil {
			continue // no runtime to ask: the cgroup labels are all there is
		}
		var prev *named
		if e != nil && e.partial {
			prev = e.named
		}
		e = &entry{done: make(chan struct{}), seen: now, prev: prev}
		n.entries[id] = e
		waits = append(waits, e.done)
		n.wg.Add(1)
		go n.resolve(id, e, chain)
	}
	for id, e := range n.entries {
		if _, ok := want[id]; ok || isOpen(e.done) {
			// A lookup in flight stays until it ends, so that a container that comes back meanwhile is not
			// looked up twice at once; the next scrape drops it.
			continue
		}
		// A container missing from an incomplete snapshot may still be there; past staleAfter it is gone in any
		// case, which keeps the cache bounded on a node whose process lists keep failing.
		if complete || now.Sub(e.seen) > staleAfter {
			delete(n.entries, id)
		}
	}
	n.mu.Unlock()

	if len(waits) > 0 {
		n.wait(ctx, waits)
	}

	out := make(map[string]named, len(want))
	var unnamed map[string]bool
	n.mu.Lock()
	for id := range want {
		e := n.entries[id]
		switch {
		case e == nil:
		case e.named != nil:
			out[id] = *e.named
		case e.prev != nil:
			out[id] = *e.prev // a partial answer being refreshed
		case !isOpen(e.done):
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

// resolve asks the chain's resolvers in turn until one knows the container, and stores the answer in e.
func (n *names) resolve(id string, e *entry, chain []resolverRef) {
	defer n.wg.Done()
	var answer *named
	partial := false
	defer func() {
		n.mu.Lock()
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
	case <-n.ctx.Done():
		return
	}
	for _, ref := range chain {
		c, err := n.call(ref, id)
		if err == nil || errors.Is(err, ErrIncomplete) {
			// An incomplete answer (names without pod labels) beats none; it is looked up again after the
			// negative TTL rather than kept for the container's life.
			answer = &named{Container: c}
			answer.PodLabels = n.allowed(c.PodLabels)
			partial = err != nil
			return
		}
		if n.ctx.Err() != nil {
			return
		}
	}
}

// call makes one runtime call under its own deadline, counts it, and logs when the runtime changes between
// answering and failing.
func (n *names) call(ref resolverRef, id string) (Container, error) {
	ctx, cancel := context.WithTimeout(n.ctx, n.timeout)
	defer cancel()
	start := time.Now()
	c, err := ref.r.Resolve(ctx, id)
	elapsed := time.Since(start)

	name := ref.r.Name()
	result := "success"
	switch {
	case err == nil:
	case errors.Is(err, ErrNotFound):
		result = "not_found"
	case errors.Is(err, ErrUnavailable):
		// No socket: a runtime that is not installed (or not started yet) is not failing. No call was made.
		n.metrics.requests.WithLabelValues(name, "unavailable").Inc()
		n.logger.Debug("container runtime not present", "resolver", name, "container_id", id, "err", err)
		return c, err
	default:
		result = "error"
	}
	n.metrics.requests.WithLabelValues(name, result).Inc()
	n.metrics.duration.WithLabelValues(name).Observe(elapsed.Seconds())

	failed := result == "error"
	n.mu.Lock()
	changed := n.down[ref.index] != failed
	n.down[ref.index] = failed
	n.mu.Unlock()
	switch {
	case changed && failed:
		n.logger.Warn("container runtime lookup failed; processes keep their cgroup labels until it answers",
			"resolver", name, "container_id", id, "err", err)
	case changed:
		n.logger.Info("container runtime answers again", "resolver", name)
	case failed:
		n.logger.Debug("container runtime lookup failed", "resolver", name, "container_id", id, "err", err)
	}
	return c, err
}

// allowed keeps the allowlisted pod labels. The map is shared by every identity of the container: read-only.
func (n *names) allowed(labels map[string]string) map[string]string {
	if len(n.podLabels) == 0 || len(labels) == 0 {
		return nil
	}
	out := make(map[string]string)
	for k, v := range labels {
		if n.podLabels[k] {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// counts returns the cache's entries by state, for self-metrics.
func (n *names) counts() (resolved, unresolved, pending int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.entries {
		switch {
		case isOpen(e.done):
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

// applyOuterTo names a container nested in a pod's container (Docker-in-Docker in a pod) by the pod's container,
// which the CRI knows: namespace, pod and container name. The identity keeps its own container ID and runtime.
func (c named) applyOuterTo(id *Identity) {
	id.Namespace = c.Namespace
	id.Pod = c.Pod
	id.Container = c.Name
	if id.PodUID == "" {
		id.PodUID = c.PodUID
	}
	id.PodLabels = c.PodLabels
}

// applyTo puts the runtime's names into an identity whose cgroup-derived fields are already set.
func (c named) applyTo(id *Identity) {
	id.Namespace = c.Namespace
	id.Pod = c.Pod // a Podman pod's name for a plain container
	id.Container = c.Name
	if id.PodUID == "" {
		id.PodUID = c.PodUID
	}
	if id.Runtime == "" {
		id.Runtime = c.Runtime
	}
	id.PodLabels = c.PodLabels
}

func isOpen(done chan struct{}) bool {
	select {
	case <-done:
		return false
	default:
		return true
	}
}
