package attribution

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/cgroup"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
)

// resolvers routes a container to the resolvers of its runtime, and makes each call: under its own deadline,
// counted in the self-metrics, logged when a runtime starts or stops answering, and not at all while a runtime
// that timed out is backed off from.
type resolvers struct {
	all     []resolverRef
	chains  map[lookupHint][]resolverRef
	timeout time.Duration
	metrics *metrics
	logger  *slog.Logger
	now     func() time.Time
	health  []logstate.State // per resolver (index in all): "down" while its last call failed
	backoff []backoff        // per resolver (index in all)
}

// maxBackoff bounds how long a runtime that keeps timing out is left unasked.
const maxBackoff = time.Minute

// backoff spares a runtime that times out, and the exporter the goroutines that would wait on it: after a timeout
// the runtime is not asked for one timeout, then for twice as long after each further one, up to maxBackoff. When
// the time is up one call probes it while the others still skip it; the first call that does not time out ends
// the backoff.
type backoff struct {
	mu       sync.Mutex
	timeouts int       // consecutive timeouts
	until    time.Time // no call before
	probing  bool      // a call is in flight after the backoff time
}

// allow reports whether a call may be made now.
func (b *backoff) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timeouts == 0 {
		return true
	}
	if now.Before(b.until) || b.probing {
		return false
	}
	b.probing = true
	return true
}

// done records how an allowed call ended: answered (anything but a timeout), timed out, or abandoned (its lookup
// was cancelled: it says nothing about the runtime).
func (b *backoff) done(now time.Time, timedOut, abandoned bool, base time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
	switch {
	case abandoned:
	case !timedOut:
		b.timeouts = 0
	case now.Before(b.until):
		// A call started before the backoff did, timing out with the one that began it: one outage, one step.
	default:
		b.timeouts++
		b.until = now.Add(min(base<<min(b.timeouts-1, 16), maxBackoff))
	}
}

// errBackoff is the error of a call that was not made because its runtime is backed off from.
var errBackoff = errors.New("container runtime timed out recently: not asked")

// resolverRef is one configured resolver and its index in resolvers.all (resolvers may share a name, e.g. several
// CRI endpoints).
type resolverRef struct {
	index int
	r     runtime.Resolver
}

// lookupHint is what the cgroup tells about how to name a container.
type lookupHint struct {
	runtime string
	inPod   bool
}

func newResolvers(cfg Config, m *metrics) *resolvers {
	rs := &resolvers{
		timeout: cfg.LookupTimeout,
		metrics: m,
		logger:  cfg.Logger,
		now:     cfg.Now,
		health:  make([]logstate.State, len(cfg.Resolvers)),
		backoff: make([]backoff, len(cfg.Resolvers)),
		chains:  make(map[lookupHint][]resolverRef),
	}
	for i, r := range cfg.Resolvers {
		rs.all = append(rs.all, resolverRef{i, r})
	}
	for _, rt := range []string{cgroup.RuntimeContainerd, cgroup.RuntimeCRIO, cgroup.RuntimeDocker, cgroup.RuntimePodman, ""} {
		for _, inPod := range []bool{false, true} {
			h := lookupHint{rt, inPod}
			rs.chains[h] = rs.chainFor(h)
		}
	}
	return rs
}

// chain returns the resolvers to ask for a container, in order; a runtime the routing does not know is treated
// as an unknown one.
func (rs *resolvers) chain(h lookupHint) []resolverRef {
	if chain, ok := rs.chains[h]; ok {
		return chain
	}
	return rs.chains[lookupHint{"", h.inPod}]
}

// chainFor orders the resolvers to ask for a container:
//   - containerd and CRI-O containers are Kubernetes': the CRI;
//   - Docker containers: Docker, then the CRI (cri-dockerd names Kubernetes containers that run on Docker);
//   - Podman containers: Podman;
//   - a container of unknown runtime in a pod: the CRI first, then the others;
//   - any other: every resolver, in the configured order.
func (rs *resolvers) chainFor(h lookupHint) []resolverRef {
	named := func(names ...string) []resolverRef {
		var out []resolverRef
		for _, name := range names {
			for _, ref := range rs.all {
				if ref.r.Name() == name {
					out = append(out, ref)
				}
			}
		}
		return out
	}
	switch h.runtime {
	case cgroup.RuntimeContainerd, cgroup.RuntimeCRIO:
		return named(runtime.ResolverCRI)
	case cgroup.RuntimeDocker:
		return named(runtime.ResolverDocker, runtime.ResolverCRI)
	case cgroup.RuntimePodman:
		return named(runtime.ResolverPodman)
	}
	if !h.inPod {
		return rs.all
	}
	chain := named(runtime.ResolverCRI)
	for _, ref := range rs.all {
		if ref.r.Name() != runtime.ResolverCRI {
			chain = append(chain, ref)
		}
	}
	return chain
}

// call makes one runtime call under its own deadline (and ctx's), counts it, and logs when the runtime changes
// between answering and failing. While the runtime is backed off from, it makes no call and returns errBackoff.
func (rs *resolvers) call(ctx context.Context, ref resolverRef, id string) (runtime.Container, error) {
	name := ref.r.Name()
	b := &rs.backoff[ref.index]
	if !b.allow(rs.now()) {
		rs.metrics.requests.WithLabelValues(name, "backoff").Inc()
		rs.logger.Debug("container runtime backed off from after a timeout", "resolver", name, "container_id", id)
		return runtime.Container{}, errBackoff
	}
	callCtx, cancel := context.WithTimeout(ctx, rs.timeout)
	defer cancel()
	start := time.Now()
	c, err := ref.r.Resolve(callCtx, id)
	elapsed := time.Since(start)
	if err != nil && ctx.Err() != nil {
		// The lookup was cancelled (its container is gone, or the exporter stops): neither the runtime's answer
		// nor its failure.
		b.done(rs.now(), false, true, rs.timeout)
		rs.logger.Debug("container runtime lookup abandoned", "resolver", name, "container_id", id, "err", err)
		return c, err
	}
	// Timed out: the call's own deadline passed.
	b.done(rs.now(), err != nil && errors.Is(callCtx.Err(), context.DeadlineExceeded), false, rs.timeout)

	result := "success"
	switch {
	case err == nil:
	case errors.Is(err, runtime.ErrNotFound):
		result = "not_found"
	case errors.Is(err, runtime.ErrUnavailable):
		// No socket: a runtime that is not installed (or not started yet) is not failing. No call was made.
		rs.metrics.requests.WithLabelValues(name, "unavailable").Inc()
		rs.logger.Debug("container runtime not present", "resolver", name, "container_id", id, "err", err)
		return c, err
	default:
		result = "error"
	}
	rs.metrics.requests.WithLabelValues(name, result).Inc()
	rs.metrics.duration.WithLabelValues(name).Observe(elapsed.Seconds())

	failed := result == "error"
	state := ""
	if failed {
		state = "down"
	}
	_, changed := rs.health[ref.index].Set(state)
	switch {
	case changed && failed:
		rs.logger.Warn("container runtime lookup failed; processes keep their cgroup labels until it answers",
			"resolver", name, "container_id", id, "err", err)
	case changed:
		rs.logger.Info("container runtime answers again", "resolver", name)
	case failed:
		rs.logger.Debug("container runtime lookup failed", "resolver", name, "container_id", id, "err", err)
	}
	return c, err
}
