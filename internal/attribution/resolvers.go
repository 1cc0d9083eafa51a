package attribution

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/cgroup"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
)

// resolvers routes a container to the resolvers of its runtime, and makes each call: under its own deadline,
// counted in the self-metrics, and logged when a runtime starts or stops answering.
type resolvers struct {
	all     []resolverRef
	chains  map[lookupHint][]resolverRef
	timeout time.Duration
	metrics *metrics
	logger  *slog.Logger
	health  []logstate.State // per resolver (index in all): "down" while its last call failed
}

// resolverRef is one configured resolver and its index in resolvers.all (resolvers may share a name, e.g. several
// CRI endpoints).
type resolverRef struct {
	index int
	r     Resolver
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
		health:  make([]logstate.State, len(cfg.Resolvers)),
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
		return named(ResolverCRI)
	case cgroup.RuntimeDocker:
		return named(ResolverDocker, ResolverCRI)
	case cgroup.RuntimePodman:
		return named(ResolverPodman)
	}
	if !h.inPod {
		return rs.all
	}
	chain := named(ResolverCRI)
	for _, ref := range rs.all {
		if ref.r.Name() != ResolverCRI {
			chain = append(chain, ref)
		}
	}
	return chain
}

// call makes one runtime call under its own deadline (and ctx's), counts it, and logs when the runtime changes
// between answering and failing.
func (rs *resolvers) call(ctx context.Context, ref resolverRef, id string) (Container, error) {
	ctx, cancel := context.WithTimeout(ctx, rs.timeout)
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
