package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
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

func registerKubelet(app flagGroup) *kubeletFlags {
	f := &kubeletFlags{}
	app.Flag("kubelet.pod-resources-endpoint", "kubelet PodResources API socket, for GPU allocations "+
		"(gpu_allocation_*, gpu_unrequested_use). Empty: off. Default: "+kubelet.DefaultEndpoint+" when it exists; a simulated node file's allocations: key when not set.").
		Default(kubelet.DefaultEndpoint).IsSetByUser(&f.endpointSet).StringVar(&f.endpoint)
	app.Flag("kubelet.refresh-interval", "How often GPU allocations are read from the kubelet.").
		Default(kubelet.DefaultInterval.String()).DurationVar(&f.interval)
	app.Flag("kubelet.timeout", "Deadline of one call to the kubelet PodResources API.").
		Default(kubelet.DefaultTimeout.String()).DurationVar(&f.timeout)
	app.Flag("kubelet.gpu-resources", "Extended resource names of GPUs, or globs (comma-separated, repeatable), for device plugin "+
		"allocations; DRA claims of "+kubelet.NVIDIADRADriver+" are read regardless. Default: nvidia.com/gpu,nvidia.com/mig-*.").PlaceHolder("NAME,...").StringsVar(&f.resources)
	return f
}

// allocationOffer is a GPU source that can stand in for the kubelet: a simulated node file with allocations.
type allocationOffer interface {
	collector.AllocationSource
	HasAllocations() bool
}

// allocations is what kubeletFlags.start built.
type allocations struct {
	source collector.AllocationSource // nil: allocations are not exported
	self   []prometheus.Collector     // the kubelet client's self-metrics
	stop   func()                     // stops the client; never nil
}

// start begins refreshing allocations in the background. A kubelet that is absent or down is not an error (the
// client retries and says so in gpu_pod_exporter_kubelet_up); a malformed endpoint or resource glob is. The demo
// node has no kubelet, so the default endpoint is not tried there.
//
// A source that offers allocations (a simulated node) stands in for the kubelet unless an endpoint is given, and
// gives them when its file has any; without one, a default socket that does not exist (a node without
// Kubernetes) turns allocations off rather than failing a call every interval.
func (f *kubeletFlags) start(ctx context.Context, logger *slog.Logger, offer allocationOffer) (allocations, error) {
	off := allocations{stop: func() {}}
	if offer != nil && !f.endpointSet {
		if offer.HasAllocations() {
			off.source = offer
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
	return allocations{source: c, self: []prometheus.Collector{c}, stop: func() {
		cancel()
		wg.Wait()
		c.Close()
	}}, nil
}

func defaultSocketExists(endpoint string) bool {
	path, err := socket.Path(endpoint)
	return err == nil && socket.Exists(path)
}
