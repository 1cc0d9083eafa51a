// Package cri names Kubernetes containers through the Container Runtime Interface (containerd, CRI-O, cri-dockerd)
// over gRPC on the runtime's unix socket.
package cri

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/socket"
)

const (
	// maxRecvMsgSize bounds one CRI response. Non-verbose statuses are a few KiB; annotations are capped at
	// 256 KiB by the API server, so 4 MiB leaves room and still bounds a misbehaving runtime.
	maxRecvMsgSize = 4 << 20
	// reconnectMaxDelay caps gRPC's reconnect backoff (120 s by default), so names come back within seconds
	// of a restarted runtime instead of minutes.
	reconnectMaxDelay = 5 * time.Second
	// podCacheTTL and podCacheSize bound the per-endpoint cache of pod sandboxes: a sandbox's labels never
	// change, so the TTL only exists to forget pods that are gone.
	podCacheTTL  = 10 * time.Minute
	podCacheSize = 4096
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

	mu        sync.Mutex
	endpoints []*endpoint          // those asked, in order
	dialed    map[string]*endpoint // every candidate endpoint ever found, by name; closed by Close
}

var _ attribution.Resolver = (*Resolver)(nil)

// endpoint is one runtime socket and what was learned from it.
type endpoint struct {
	name   string // as configured, e.g. unix:///run/containerd/containerd.sock; used in errors
	conn   *grpc.ClientConn
	client runtimeapi.RuntimeServiceClient
	pods   *podCache

	mu          sync.Mutex
	runtime     string // what the runtime calls itself, as docs/reference.md names runtimes; see runtimeName
	runtimeDone bool
}

// Config configures a Resolver.
type Config struct {
	// Endpoints are the CRI sockets to ask, in turn (unix:///path or a bare /path). Empty: those of
	// DefaultEndpoints whose socket exists, looked for again (one stat each) at most every socket.RecheckInterval
	// when a lookup comes, so that a runtime which starts after the exporter is found; while there is none, Resolve
	// answers attribution.ErrUnavailable.
	Endpoints []string
	Logger    *slog.Logger
}

// New returns a Resolver. It does not connect: the first Resolve does.
func New(cfg Config) (*Resolver, error) {
	return newResolver(cfg.Endpoints, DefaultEndpoints(), cfg.Logger, socket.RecheckInterval, time.Now)
}

func newResolver(endpoints, candidates []string, logger *slog.Logger, every time.Duration, now func() time.Time) (*Resolver, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Resolver{logger: logger}
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
		ep, err := dial(e)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.endpoints = append(r.endpoints, ep)
	}
	return r, nil
}

// dial creates a client for one endpoint without connecting.
func dial(name string) (*endpoint, error) {
	path, err := socket.Path(name)
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %w", err)
	}
	conn, err := socket.DialGRPC(path, maxRecvMsgSize, reconnectMaxDelay)
	if err != nil {
		return nil, fmt.Errorf("creating CRI client for %s: %w", name, err)
	}
	return &endpoint{
		name:   name,
		conn:   conn,
		client: runtimeapi.NewRuntimeServiceClient(conn),
		pods:   newPodCache(podCacheSize, podCacheTTL, time.Now),
	}, nil
}

// Name implements attribution.Resolver.
func (r *Resolver) Name() string { return attribution.ResolverCRI }

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
			if ep, err = dial(name); err != nil {
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

// Resolve implements attribution.Resolver. Each endpoint is asked in turn until one knows the container;
// ErrNotFound means every endpoint answered that it does not, and any endpoint that failed to answer makes
// the result an error instead, since that runtime may well own the container. With no socket to ask, the answer
// is attribution.ErrUnavailable.
func (r *Resolver) Resolve(ctx context.Context, containerID string) (attribution.Container, error) {
	eps := r.active()
	if len(eps) == 0 {
		return attribution.Container{}, fmt.Errorf("no CRI socket among %s: %w",
			strings.Join(r.candidates, ", "), attribution.ErrUnavailable)
	}
	var errs []error
	for _, ep := range eps {
		c, err := ep.resolve(ctx, containerID)
		if err == nil || errors.Is(err, attribution.ErrIncomplete) {
			return c, err
		}
		if !errors.Is(err, attribution.ErrNotFound) {
			errs = append(errs, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) > 0 {
		return attribution.Container{}, errors.Join(errs...)
	}
	return attribution.Container{}, attribution.ErrNotFound
}

func (ep *endpoint) resolve(ctx context.Context, id string) (attribution.Container, error) {
	resp, err := ep.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if isNotFound(err) {
		// The ID may be a pod sandbox's (the pause container): those are not containers to the CRI.
		return ep.resolveSandbox(ctx, id)
	}
	if err != nil {
		return attribution.Container{}, fmt.Errorf("CRI ContainerStatus on %s: %w", ep.name, err)
	}
	st := resp.GetStatus()
	if st == nil {
		return attribution.Container{}, fmt.Errorf("CRI ContainerStatus on %s: empty status for %s", ep.name, id)
	}
	c := attribution.KubernetesNames(st.GetLabels())
	c.Runtime = ep.runtimeName(ctx)
	if c.Name == "" {
		// Not created by kubelet (crictl, a test harness): the CRI metadata name is all there is.
		c.Name = st.GetMetadata().GetName()
	}
	if c.PodUID == "" {
		return c, nil
	}
	p, ok, err := ep.pod(ctx, c.PodUID)
	if err != nil {
		// The container's names are known: keep them, without the pod's labels, for now.
		return c, fmt.Errorf("%w: %w", attribution.ErrIncomplete, err)
	}
	if ok {
		c.PodLabels = maps.Clone(p.labels)
		c.Namespace = cmp.Or(c.Namespace, p.namespace)
		c.Pod = cmp.Or(c.Pod, p.name)
	}
	return c, nil
}

// resolveSandbox names a pod sandbox (pause container) ID: the pod, with no container name.
func (ep *endpoint) resolveSandbox(ctx context.Context, id string) (attribution.Container, error) {
	resp, err := ep.client.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if isNotFound(err) {
		return attribution.Container{}, attribution.ErrNotFound
	}
	if err != nil {
		return attribution.Container{}, fmt.Errorf("CRI PodSandboxStatus on %s: %w", ep.name, err)
	}
	st := resp.GetStatus()
	if st == nil {
		return attribution.Container{}, fmt.Errorf("CRI PodSandboxStatus on %s: empty status for %s", ep.name, id)
	}
	p := podFromSandbox(st.GetMetadata(), st.GetLabels())
	if p.uid != "" {
		ep.pods.put(p.uid, p)
	}
	return attribution.Container{Namespace: p.namespace, Pod: p.name, PodUID: p.uid, PodLabels: maps.Clone(p.labels),
		Runtime: ep.runtimeName(ctx)}, nil
}

// runtimeName asks the runtime once what it is: with the cgroupfs driver a pod's cgroup path does not say. A
// runtime that does not answer is asked again next time; one that answers with a name docs/reference.md does not know, or
// does not implement Version, is left unnamed. The call is made outside ep.mu, so that lookups do not queue
// behind it; concurrent first lookups may each ask, and agree.
func (ep *endpoint) runtimeName(ctx context.Context) string {
	ep.mu.Lock()
	done, runtime := ep.runtimeDone, ep.runtime
	ep.mu.Unlock()
	if done {
		return runtime
	}
	resp, err := ep.client.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil && status.Code(err) != codes.Unimplemented {
		return ""
	}
	switch name := resp.GetRuntimeName(); name {
	case "containerd", "docker":
		runtime = name
	case "cri-o":
		runtime = "crio"
	}
	ep.mu.Lock()
	ep.runtimeDone, ep.runtime = true, runtime
	ep.mu.Unlock()
	return runtime
}

// pod returns the pod with this UID, from the cache or the runtime. ok is false when the runtime has no sandbox
// for it (the sandbox was removed while a container lingers).
//
// The CRI's ContainerStatus does not say which sandbox a container belongs to, but kubelet labels every sandbox
// with its pod's UID, so one ListPodSandbox filtered on that label answers in a single call.
func (ep *endpoint) pod(ctx context.Context, uid string) (pod, bool, error) {
	if p, ok := ep.pods.get(uid); ok {
		return p, true, nil
	}
	resp, err := ep.client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{attribution.LabelPodUID: uid}},
	})
	if err != nil {
		return pod{}, false, fmt.Errorf("CRI ListPodSandbox on %s: %w", ep.name, err)
	}
	// A pod whose sandbox was recreated has several until kubelet removes the old ones; the newest is current.
	var newest *runtimeapi.PodSandbox
	for _, s := range resp.GetItems() {
		if s.GetMetadata().GetUid() != uid && s.GetLabels()[attribution.LabelPodUID] != uid {
			continue // a runtime that ignored the filter
		}
		if newest == nil || s.GetCreatedAt() > newest.GetCreatedAt() {
			newest = s
		}
	}
	if newest == nil {
		return pod{}, false, nil
	}
	p := podFromSandbox(newest.GetMetadata(), newest.GetLabels())
	p.uid = uid
	ep.pods.put(uid, p)
	return p, true, nil
}

// podFromSandbox reads a pod's identity from its sandbox. A sandbox's labels are the pod's labels plus
// kubelet's io.kubernetes.* ones, which are dropped.
func podFromSandbox(md *runtimeapi.PodSandboxMetadata, labels map[string]string) pod {
	p := pod{
		namespace: cmp.Or(md.GetNamespace(), labels[attribution.LabelPodNamespace]),
		name:      cmp.Or(md.GetName(), labels[attribution.LabelPodName]),
		uid:       cmp.Or(md.GetUid(), labels[attribution.LabelPodUID]),
	}
	for k, v := range labels {
		if strings.HasPrefix(k, attribution.KubernetesLabelPrefix) {
			continue
		}
		if p.labels == nil {
			p.labels = make(map[string]string, len(labels))
		}
		p.labels[k] = v
	}
	return p
}

// isNotFound reports whether err is the runtime saying it does not know the ID. containerd and CRI-O answer
// codes.NotFound; cri-dockerd passes Docker's error through as codes.Unknown.
func isNotFound(err error) bool {
	if err == nil {
		return false
	}
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.NotFound:
		return true
	case codes.Unknown:
		return strings.Contains(s.Message(), "No such container")
	}
	return false
}
