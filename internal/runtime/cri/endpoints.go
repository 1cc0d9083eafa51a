// Package cri names Kubernetes containers through the Container Runtime Interface (containerd, CRI-O, cri-dockerd)
// over gRPC on the runtime's unix socket.
package cri

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/socket"
)

const (
	// maxRecvMsgSize bounds one CRI response. Non-verbose statuses are a few KiB; annotations are capped at
	// 256 KiB by the API server, so 4 MiB leaves room and still bounds a misbehaving runtime.
	maxRecvMsgSize = 4 << 20
	// reconnectMaxDelay caps gRPC's reconnect backoff (120 s by default), so names come back within seconds
	// of a restarted runtime instead of minutes.
	reconnectMaxDelay = 5 * time.Second
	// podCacheTTL, podCacheSize and podCacheBytes bound the cache of pod sandboxes. Pods are forgotten when a
	// complete reading has no process in them (KeepPods); a sandbox's labels never change, so the TTL only
	// forgets pods on a node whose readings are never complete. An entry with the allowlisted labels is a few
	// hundred bytes: 4 MiB is room for every pod the size allows, and bounds a runtime whose sandboxes carry
	// megabytes of names.
	podCacheTTL   = 10 * time.Minute
	podCacheSize  = 4096
	podCacheBytes = 4 << 20
)

// DefaultEndpoints are the sockets New probes, in order, when it is given none: containerd, CRI-O, cri-dockerd
// and k3s's bundled containerd.
func DefaultEndpoints() []string {
	return []string{
		"unix:///run/containerd/containerd.sock",
		"unix:///run/crio/crio.sock",
		"unix:///var/run/crio/crio.sock",
		"unix:///run/cri-dockerd.sock",
		"unix:///var/run/cri-dockerd.sock",
		"unix:///run/k3s/containerd/containerd.sock",
	}
}

// Resolver names containers through one or more CRI endpoints. It is safe for concurrent use.
type Resolver struct {
	logger *slog.Logger
	// candidates are the sockets looked for when no endpoint was given, and watch looks for them; both are nil
	// when endpoints were given, and then endpoints never change.
	candidates []string
	watch      *socket.Watch
	byPath     map[string]string // candidate endpoint by socket path

	// podLabels are the pod labels kept of a sandbox; pods holds the sandboxes of every endpoint.
	podLabels runtime.LabelAllowlist
	pods      *podCache

	mu        sync.Mutex
	endpoints []*endpoint          // those asked, in order
	dialed    map[string]*endpoint // every candidate endpoint ever found, by name; closed by Close
}

var (
	_ runtime.Resolver = (*Resolver)(nil)
	_ runtime.PodCache = (*Resolver)(nil)
)

// endpoint is one runtime socket and what was learned from it.
type endpoint struct {
	name   string // as configured, e.g. unix:///run/containerd/containerd.sock; used in errors
	conn   *grpc.ClientConn
	client runtimeapi.RuntimeServiceClient
	// podLabels and pods are the resolver's.
	podLabels runtime.LabelAllowlist
	pods      *podCache

	mu          sync.Mutex
	runtime     string // what the runtime calls itself, as docs/reference.md names runtimes; see runtimeName
	runtimeDone bool
}

// Config configures a Resolver.
type Config struct {
	// Endpoints are the CRI sockets to ask, in turn (unix:///path or a bare /path). Empty: those of
	// DefaultEndpoints whose socket exists, looked for again (one stat each) at most every socket.RecheckInterval
	// when a lookup comes, so that a runtime which starts after the exporter is found; while there is none, Resolve
	// answers runtime.ErrUnavailable.
	Endpoints []string
	// PodLabels is the allowlist of pod label keys (--kubernetes.pod-labels): the only labels of a pod that the
	// resolver keeps and returns. Empty: none.
	PodLabels []string
	Logger    *slog.Logger
}

// New returns a Resolver. It does not connect: the first Resolve does.
func New(cfg Config) (*Resolver, error) {
	return newResolver(cfg, DefaultEndpoints(), socket.RecheckInterval, time.Now)
}

func newResolver(cfg Config, candidates []string, every time.Duration, now func() time.Time) (*Resolver, error) {
	logger, endpoints := cfg.Logger, cfg.Endpoints
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Resolver{
		logger:    logger,
		podLabels: runtime.NewLabelAllowlist(cfg.PodLabels),
		pods:      newPodCache(podCacheSize, podCacheBytes, podCacheTTL, now),
	}
	if len(endpoints) == 0 {
		r.candidates = slices.Clone(candidates)
		r.byPath = make(map[string]string)
		var paths []string
		for _, c := range candidates {
			if path, err := socket.Path(c); err == nil && r.byPath[path] == "" {
				r.byPath[path] = c
				paths = append(paths, path)
			}
		}
		r.watch = socket.NewWatch(paths, every, now)
		r.dialed = make(map[string]*endpoint)
		found, _ := r.watch.Found()
		r.mu.Lock()
		eps := r.use(found)
		r.mu.Unlock()
		if len(eps) == 0 {
			logger.Info("no CRI socket found yet: Kubernetes pods get pod_uid and container_id but no names "+
				"until one appears", "probed", strings.Join(candidates, ","))
		}
		return r, nil
	}
	for _, e := range endpoints {
		ep, err := r.dial(e)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.endpoints = append(r.endpoints, ep)
	}
	return r, nil
}

// dial creates a client for one endpoint without connecting.
func (r *Resolver) dial(name string) (*endpoint, error) {
	path, err := socket.Path(name)
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %w", err)
	}
	conn, err := socket.DialGRPC(path, maxRecvMsgSize, reconnectMaxDelay)
	if err != nil {
		return nil, fmt.Errorf("creating CRI client for %s: %w", name, err)
	}
	return &endpoint{
		name:      name,
		conn:      conn,
		client:    runtimeapi.NewRuntimeServiceClient(conn),
		podLabels: r.podLabels,
		pods:      r.pods,
	}, nil
}

// active returns the endpoints to ask. Without configured endpoints it looks for the candidates' sockets again
// when the last look is socket.RecheckInterval old: one stat per candidate, and only when a lookup comes.
func (r *Resolver) active() []*endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watch == nil {
		return r.endpoints
	}
	if found, looked := r.watch.Found(); looked {
		return r.use(found)
	}
	return r.endpoints
}

// use makes the candidates whose sockets were found (by path) the endpoints to ask, dialling those new, and logs
// when the set changes. r.mu is held.
func (r *Resolver) use(paths []string) []*endpoint {
	found := make([]string, 0, len(paths))
	eps := make([]*endpoint, 0, len(paths))
	for _, path := range paths {
		name := r.byPath[path]
		found = append(found, name)
		ep := r.dialed[name]
		if ep == nil {
			var err error
			if ep, err = r.dial(name); err != nil {
				r.logger.Warn("cannot create CRI client", "endpoint", name, "err", err)
				continue
			}
			r.dialed[name] = ep
		}
		eps = append(eps, ep)
	}
	if !slices.Equal(found, endpointNames(r.endpoints)) && len(found) > 0 {
		r.logger.Info("found CRI sockets", "endpoints", strings.Join(found, ","))
	} else if len(found) == 0 && len(r.endpoints) > 0 {
		r.logger.Info("CRI sockets gone", "endpoints", strings.Join(endpointNames(r.endpoints), ","))
	}
	r.endpoints = eps
	return eps
}

func endpointNames(eps []*endpoint) []string {
	names := make([]string, len(eps))
	for i, ep := range eps {
		names[i] = ep.name
	}
	return names
}

// KeepPods implements runtime.PodCache: the sandboxes of other pods are forgotten.
func (r *Resolver) KeepPods(uids map[string]bool) { r.pods.keep(uids) }

// Close releases the gRPC connections.
func (r *Resolver) Close() error {
	r.mu.Lock()
	all := r.endpoints
	if r.watch != nil {
		all = nil
		for _, ep := range r.dialed {
			all = append(all, ep)
		}
	}
	r.mu.Unlock()
	var errs []error
	for _, ep := range all {
		if err := ep.conn.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing CRI client for %s: %w", ep.name, err))
		}
	}
	return errors.Join(errs...)
}
