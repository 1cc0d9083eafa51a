package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/simulated"
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
	app.Flag("kubelet.gpu-resources", "Extended resource names of GPUs, or globs (comma-separated, repeatable). "+
		"Default: nvidia.com/gpu,nvidia.com/mig-*.").PlaceHolder("NAME,...").StringsVar(&f.resources)
	return f
}

// start begins refreshing allocations in the background and sets opts.Allocations. It returns the client's
// self-metrics and a function that stops it. A kubelet that is absent or down is not an error (the client retries
// and says so in gpu_pod_exporter_kubelet_up); a malformed endpoint or resource glob is. The demo node has no
// kubelet, so the default endpoint is not tried there.
//
// A simulated node file with allocations stands in for the kubelet unless an endpoint is given; without one, a
// default socket that does not exist (a node without Kubernetes) turns allocations off rather than failing a call
// every interval.
func (f *kubeletFlags) start(ctx context.Context, logger *slog.Logger, source gpu.Source, opts *collector.Options) ([]prometheus.Collector, func(), error) {
	if sim, ok := source.(*simulated.Source); ok && !f.endpointSet {
		if sim.HasAllocations() {
			opts.Allocations = sim
		}
		return nil, func() {}, nil
	}
	if f.endpoint == "" || !f.endpointSet && !defaultSocketExists(f.endpoint) {
		return nil, func() {}, nil
	}
	c, err := kubelet.New(kubelet.Config{
		Endpoint: f.endpoint, Resources: splitList(f.resources), Interval: f.interval, Timeout: f.timeout, Logger: logger,
	})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	opts.Allocations = c
	return []prometheus.Collector{c}, func() {
		cancel()
		wg.Wait()
		c.Close()
	}, nil
}

func defaultSocketExists(endpoint string) bool {
	path, err := socket.Path(endpoint)
	return err == nil && socket.Exists(path)
}
