package main

import (
	"context"
	"log/slog"
	"path"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/socket"
)

// kubeletFlags configure where GPU allocations come from.
type kubeletFlags struct {
	endpoint    string
	endpointSet bool
	interval    time.Duration
	timeout     time.Duration
	resources   []string
}

func (f *kubeletFlags) register(app flagHost) {
	app.Flag("kubelet.pod-resources-endpoint", "kubelet PodResources API socket, for GPU allocations "+
		"(gpu_allocation_*, gpu_unrequested_use). Empty: off. Default: "+kubelet.DefaultEndpoint+" when it exists; a simulated node file's allocations: key when not set.").
		Default(kubelet.DefaultEndpoint).IsSetByUser(&f.endpointSet).StringVar(&f.endpoint)
	durationFlag(app, "kubelet.refresh-interval", "How often GPU allocations are read from the kubelet.",
		kubelet.DefaultInterval, &f.interval)
	durationFlag(app, "kubelet.timeout", "Deadline of one call to the kubelet PodResources API.",
		kubelet.DefaultTimeout, &f.timeout)
	app.Flag("kubelet.gpu-resources", "Extended resource names of GPUs, or globs (comma-separated, repeatable), for device plugin "+
		"allocations; DRA claims of "+kubelet.NVIDIADRADriver+" are read regardless. Default: nvidia.com/gpu,nvidia.com/mig-*.").PlaceHolder("NAME,...").StringsVar(&f.resources)
}

// check validates the endpoint's syntax and the resource globs before anything starts.
func (f *kubeletFlags) check() error {
	if _, err := checkSocketFlag("kubelet.pod-resources-endpoint", f.endpoint); err != nil {
		return err
	}
	for _, r := range splitList(f.resources) {
		if _, err := path.Match(r, ""); err != nil {
			return flagError("kubelet.gpu-resources", "%q: %v", r, err)
		}
	}
	return nil
}

// warnings: an endpoint given by flag whose socket is not there (yet). The default one is simply off without it.
func (f *kubeletFlags) warnings() []string {
	if !f.endpointSet {
		return nil
	}
	if missing, _ := checkSocketFlag("kubelet.pod-resources-endpoint", f.endpoint); missing != "" {
		return []string{"--kubelet.pod-resources-endpoint: no socket at " + missing + " yet; allocations are " +
			"absent and gpu_pod_exporter_kubelet_up is 0 until it appears"}
	}
	return nil
}

// allocationOffer is a GPU source that can stand in for the kubelet: a simulated node file with allocations.
type allocationOffer interface {
	allocation.Source
	HasAllocations() bool
	Allocatable() map[string]int
}

// allocations is what kubeletFlags.start built.
type allocations struct {
	source allocation.Source      // nil: allocations are not exported
	self   []prometheus.Collector // the kubelet client's self-metrics
	stop   func()                 // stops the client; never nil
	// describe says where allocations come from, for the startup summary.
	describe string
}

// start begins refreshing allocations in the background. A kubelet that is absent or down is not an error (the
// client retries and says so in gpu_pod_exporter_kubelet_up); a malformed endpoint or resource glob is. The demo
// node has no kubelet, so the default endpoint is not tried there.
//
// A source that offers allocations (a simulated node) stands in for the kubelet unless an endpoint is given, and
// gives them, with the kubelet client's self-metrics as a kubelet that answers, when its file has any; without one, a default socket that does not exist (a node without
// Kubernetes) turns allocations off rather than failing a call every interval.
func (f *kubeletFlags) start(ctx context.Context, logger *slog.Logger, offer allocationOffer) (allocations, error) {
	off := allocations{stop: func() {}, describe: "off"}
	if offer != nil && !f.endpointSet {
		if offer.HasAllocations() {
			off.source = offer
			off.self = []prometheus.Collector{kubelet.StandIn(offer.Allocatable())}
			off.describe = "simulated"
		}
		return off, nil
	}
	if f.endpoint == "" || !f.endpointSet && !defaultSocketExists(f.endpoint) {
		return off, nil
	}
	c, err := kubelet.New(kubelet.Config{
		Endpoint: f.endpoint, Resources: splitList(f.resources), Interval: f.interval, Timeout: f.timeout, Logger: logger,
	})
	if err != nil {
		return allocations{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	return allocations{source: c, self: []prometheus.Collector{c}, describe: f.endpoint, stop: func() {
		cancel()
		wg.Wait()
		c.Close()
	}}, nil
}

func defaultSocketExists(endpoint string) bool {
	path, err := socket.Path(endpoint)
	return err == nil && socket.Exists(path)
}
