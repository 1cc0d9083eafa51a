// Package kubelet reads GPU allocations from the kubelet's PodResources API (v1): which container the kubelet gave
// which GPU, time-sliced replica or MIG device, through a device plugin or a DRA ResourceClaim. A background loop refreshes them on an interval, each call with a
// deadline, so that scrapes read the latest copy and never dial the kubelet themselves.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/selfmetrics"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/socket"
)

// DefaultEndpoint is where the kubelet serves the PodResources API.
const DefaultEndpoint = "unix:///var/lib/kubelet/pod-resources/kubelet.sock"

// Defaults for the zero values of Config.
const (
	DefaultInterval = 10 * time.Second
	DefaultTimeout  = 5 * time.Second
	// maxRecvMsgSize bounds one List answer. The kubelet's own limit is 16 MiB; a node with many pods and CPU
	// assignments can exceed gRPC's default of 4 MiB.
	maxRecvMsgSize = 16 << 20
)

// MaxAllocations bounds the allocations of one reading; those past it are left out, counted, and logged once. A
// device plugin allocates each of its devices to one container at most, and a node has a few hundred (time-sliced
// replicas included), so that only a kubelet gone wrong comes near; each allocation costs the exporter series and
// memory.
const MaxAllocations = 16384

// Allocation is one device of one GPU resource that the kubelet allocated to one container.
type Allocation struct {
	Namespace, Pod, Container string
	// Resource is the device plugin's resource (nvidia.com/gpu, nvidia.com/mig-1g.10gb), or the DRA driver
	// (gpu.nvidia.com).
	Resource string
	// DeviceID is the device as the device plugin, or the DRA driver (its device name), named it.
	DeviceID string
	Device   DeviceRef
	// Claim is the ResourceClaim that gave the device; nil for device plugin allocations.
	Claim *Claim
}

// Claim is where a DRA allocation comes from. Several pods may share one claim: each of their containers that
// references it has an Allocation of its own.
type Claim struct {
	Name, Namespace string
	Pool            string // the driver's pool of the device; NVIDIA's driver names it after the node
}

// Allocations is one reading of the PodResources API, restricted to the configured GPU resources.
type Allocations struct {
	Time  time.Time
	Items []Allocation
}

// Config configures a Client. Zero values take the defaults.
type Config struct {
	Endpoint  string        // unix:///path or /path; default DefaultEndpoint
	Resources []string      // resource names or path.Match globs; default DefaultResources
	Interval  time.Duration // between refreshes; default DefaultInterval
	Timeout   time.Duration // deadline of one API call; default DefaultTimeout
	Logger    *slog.Logger
}

// Client keeps the latest allocations. It is safe for concurrent use.
type Client struct {
	cfg    Config
	path   string
	conn   *grpc.ClientConn
	client podresources.PodResourcesListerClient

	mu        sync.Mutex
	latest    Allocations
	available bool
	state     logstate.State // the state last logged: "" before the first refresh, then "up", "no-socket" or "down"
	capped    logstate.State // "capped" while the last reading had allocations past MaxAllocations, logged when it changes

	*selfMetrics
}

// selfMetrics are a kubelet client's own series.
type selfMetrics struct {
	up          prometheus.Gauge
	errors      *prometheus.CounterVec
	allocatable *prometheus.GaugeVec
	duration    prometheus.Gauge
	draIgnored  *prometheus.GaugeVec
	dropped     prometheus.Gauge
	self        selfmetrics.Set // all of the above
}

func newSelfMetrics() *selfMetrics {
	m := &selfMetrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpu_pod_exporter_kubelet_up",
			Help: "1 if the last read of the kubelet PodResources API succeeded, 0 if it failed (no socket, kubelet down); allocation series are absent while 0.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_pod_exporter_kubelet_errors_total",
			Help: "Failed calls to the kubelet PodResources API, by call (list, get_allocatable_resources).",
		}, []string{"call"}),
		allocatable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_pod_exporter_kubelet_allocatable_devices",
			Help: "Devices of each GPU resource that the kubelet can allocate on this node (GetAllocatableResources).",
		}, []string{"resource"}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpu_pod_exporter_kubelet_refresh_duration_seconds",
			Help: "How long the last read of the kubelet PodResources API took.",
		}),
		draIgnored: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_pod_exporter_kubelet_dra_devices_ignored",
			Help: "DRA devices allocated to containers in the last PodResources reading that are not read as GPU allocations, by reason: " +
				"other_driver (not " + NVIDIADRADriver + "), vfio (a GPU passed through to a VM, which NVML does not see), " +
				"unknown_name (a " + NVIDIADRADriver + " device name of no known form).",
		}, []string{"reason"}),
		dropped: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpu_pod_exporter_kubelet_allocations_dropped",
			Help: fmt.Sprintf("GPU allocations of the last PodResources reading left out because it listed more than %d.", MaxAllocations),
		}),
	}
	m.self = selfmetrics.Set{m.up, m.errors, m.allocatable, m.duration, m.draIgnored, m.dropped}
	for _, call := range []string{"list", "get_allocatable_resources"} {
		m.errors.WithLabelValues(call)
	}
	m.setDRAIgnored(draIgnored{})
	return m
}

// StandIn is the self-metrics of a kubelet that a simulated node stands in for, as after a read that succeeded at
// once: up, no failed call, no DRA device ignored or allocation dropped, and the devices the node file says are
// allocatable.
func StandIn(allocatable map[string]int) prometheus.Collector {
	m := newSelfMetrics()
	m.up.Set(1)
	for r, n := range allocatable {
		m.allocatable.WithLabelValues(r).Set(float64(n))
	}
	return m.self
}

// New returns a Client for the endpoint. It does not connect: the first refresh does, and a kubelet that is not
// there yet is retried on every refresh.
func New(cfg Config) (*Client, error) {
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultEndpoint
	}
	if len(cfg.Resources) == 0 {
		cfg.Resources = DefaultResources
	}
	for _, pattern := range cfg.Resources {
		if _, err := path.Match(pattern, ""); err != nil {
			return nil, fmt.Errorf("kubelet resource name %q: %w", pattern, err)
		}
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	sock, err := socket.Path(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("kubelet PodResources endpoint %w", err)
	}
	// Reconnect within about one interval of the kubelet coming back.
	conn, err := socket.DialGRPC(sock, maxRecvMsgSize, cfg.Interval)
	if err != nil {
		return nil, fmt.Errorf("creating the PodResources client for %s: %w", cfg.Endpoint, err)
	}
	c := &Client{
		cfg:         cfg,
		path:        sock,
		conn:        conn,
		client:      podresources.NewPodResourcesListerClient(conn),
		selfMetrics: newSelfMetrics(),
	}
	return c, nil
}

// Run refreshes the allocations now and then every interval until ctx ends.
func (c *Client) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		c.Refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Refresh reads the allocations once. On failure the allocations become unavailable: stale allocations would
// report pods that are gone as holding GPUs, and call a pod's new GPUs unrequested.
func (c *Client) Refresh(ctx context.Context) error {
	start := time.Now()
	allocs, err := c.read(ctx)
	c.duration.Set(time.Since(start).Seconds())

	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.available = false
		c.latest = Allocations{}
		c.up.Set(0)
		c.draIgnored.Reset()
		c.dropped.Set(0)
		state := "down"
		if errors.Is(err, fs.ErrNotExist) {
			state = "no-socket"
		}
		c.logChange(state, err)
		return err
	}
	c.latest, c.available = allocs, true
	c.up.Set(1)
	c.logChange("up", nil)
	return nil
}

// logChange logs when the API becomes available or unavailable, never once per refresh. A kubelet that stops
// fails one way and then another (its connection drops, then its socket goes): that is one outage, one line.
func (c *Client) logChange(state string, err error) {
	prev, changed := c.state.Set(state)
	if !changed {
		return
	}
	switch {
	case err != nil && (prev == "down" || prev == "no-socket"):
	case err == nil:
		c.cfg.Logger.Info("reading GPU allocations from the kubelet", "endpoint", c.cfg.Endpoint)
	case prev == "" && state == "no-socket":
		// Not a Kubernetes node, or the socket is not mounted: worth one line, not an error.
		c.cfg.Logger.Info("no kubelet PodResources socket: GPU allocation metrics are off until it appears", "endpoint", c.cfg.Endpoint)
	default:
		c.cfg.Logger.Warn("kubelet PodResources API unavailable: GPU allocation metrics are off until it answers", "err", err)
	}
}

func (c *Client) read(ctx context.Context) (Allocations, error) {
	// A missing socket is the common case off Kubernetes; say so rather than print gRPC's connection error.
	if err := socket.Check(c.path); err != nil {
		c.errors.WithLabelValues("list").Inc()
		return Allocations{}, fmt.Errorf("kubelet PodResources socket %s: %w", c.path, err)
	}
	callCtx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	now := time.Now()
	resp, err := c.client.List(callCtx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		c.errors.WithLabelValues("list").Inc()
		return Allocations{}, fmt.Errorf("listing pod resources from %s: %w", c.cfg.Endpoint, err)
	}
	var r listing
	for _, pod := range resp.GetPodResources() {
		for _, ctr := range pod.GetContainers() {
			for _, dev := range ctr.GetDevices() {
				if !c.gpuResource(dev.GetResourceName()) {
					continue
				}
				for _, id := range dev.GetDeviceIds() {
					r.add(Allocation{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: ctr.GetName(),
						Resource: dev.GetResourceName(), DeviceID: id, Device: ParseDeviceID(id)})
				}
			}
			r.addDynamic(pod, ctr)
		}
	}
	c.setDRAIgnored(r.ignored)
	c.setDropped(r.dropped)
	c.readAllocatable(ctx)
	return Allocations{Time: now, Items: r.items}, nil
}

// listing is the GPU allocations of one List answer, as they are read.
type listing struct {
	items   []Allocation
	dropped int // past MaxAllocations
	ignored draIgnored
}

// add adds an allocation, or counts it past MaxAllocations.
func (r *listing) add(a Allocation) {
	if len(r.items) >= MaxAllocations {
		r.dropped++
		return
	}
	r.items = append(r.items, a)
}

// setDropped says how many allocations the last reading left out, and logs when it starts and stops leaving some out.
func (c *Client) setDropped(n int) {
	c.dropped.Set(float64(n))
	state := ""
	if n > 0 {
		state = "capped"
	}
	if _, changed := c.capped.Set(state); !changed {
		return
	}
	if n > 0 {
		c.cfg.Logger.Warn("the kubelet lists more GPU allocations than the exporter reads: the others are left out",
			"max", MaxAllocations, "dropped", n)
	} else {
		c.cfg.Logger.Info("the kubelet lists GPU allocations within the limit again", "max", MaxAllocations)
	}
}

// draIgnored counts the DRA devices that are not GPU allocations, by reason.
type draIgnored struct{ otherDriver, vfio, unknownName int }

func (m *selfMetrics) setDRAIgnored(n draIgnored) {
	m.draIgnored.WithLabelValues("other_driver").Set(float64(n.otherDriver))
	m.draIgnored.WithLabelValues("vfio").Set(float64(n.vfio))
	m.draIgnored.WithLabelValues("unknown_name").Set(float64(n.unknownName))
}

// addDynamic adds the container's DRA devices (PodResources dynamic_resources, Kubernetes 1.27+, on by default
// since 1.34) that NVIDIA's GPU driver allocated, and counts the others. A device shared with other containers or
// pods through one claim is an allocation of each; a share of a device (share_id, consumable capacity) is an
// allocation of the device.
func (r *listing) addDynamic(pod *podresources.PodResources, ctr *podresources.ContainerResources) {
	for _, dr := range ctr.GetDynamicResources() {
		for _, res := range dr.GetClaimResources() {
			if res.GetDriverName() != NVIDIADRADriver {
				r.ignored.otherDriver++
				continue
			}
			ref, kind := ParseDRADeviceName(res.GetDeviceName())
			switch kind {
			case DRAVFIO:
				r.ignored.vfio++
				continue
			case DRAUnknown:
				r.ignored.unknownName++
				continue
			}
			r.add(Allocation{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: ctr.GetName(),
				Resource: res.GetDriverName(), DeviceID: res.GetDeviceName(), Device: ref,
				Claim: &Claim{Name: dr.GetClaimName(), Namespace: dr.GetClaimNamespace(), Pool: res.GetPoolName()}})
		}
	}
}

// readAllocatable updates the allocatable device counts. It is informational: when it fails (kubelets before 1.23
// without the feature gate answer Unimplemented) the allocations from List are still used.
func (c *Client) readAllocatable(ctx context.Context) {
	callCtx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, err := c.client.GetAllocatableResources(callCtx, &podresources.AllocatableResourcesRequest{})
	if err != nil {
		if status.Code(err) != codes.Unimplemented {
			c.errors.WithLabelValues("get_allocatable_resources").Inc()
		}
		c.allocatable.Reset()
		return
	}
	counts := make(map[string]int)
	for _, dev := range resp.GetDevices() {
		if c.gpuResource(dev.GetResourceName()) {
			counts[dev.GetResourceName()] += len(dev.GetDeviceIds())
		}
	}
	c.allocatable.Reset()
	for r, n := range counts {
		c.allocatable.WithLabelValues(r).Set(float64(n))
	}
}

func (c *Client) gpuResource(name string) bool {
	for _, pattern := range c.cfg.Resources {
		if ok, _ := path.Match(pattern, name); ok {
			return true
		}
	}
	return false
}

// Allocations returns the latest allocations, and false when the kubelet could not be read: then nothing is
// known about allocations, which is not the same as no allocations.
func (c *Client) Allocations() (Allocations, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.latest, c.available
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Describe implements prometheus.Collector for the client's self-metrics.
func (c *Client) Describe(ch chan<- *prometheus.Desc) { c.self.Describe(ch) }

// Collect implements prometheus.Collector for the client's self-metrics.
func (c *Client) Collect(ch chan<- prometheus.Metric) { c.self.Collect(ch) }
