// Package collector turns one attributed reading of the node into Prometheus metrics: one file per concern
// (devices, MIG instances, processes, workloads), all fed from the same reading and registered in one place.
package collector

import (
	"context"
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// Options selects what is exported.
type Options struct {
	// Processes enables the per-PID series (--collector.processes).
	Processes bool
	// PodLabels is the allowlist of pod labels exported as label_<key> on process and workload series.
	PodLabels []string
	// ProcessUser adds the process owner's user name as "user" to process and workload series
	// (--collector.process-user).
	ProcessUser bool
	// Compat lists the compatibility outputs to add (--compat): CompatNvidiasmi, CompatDCGM. See docs/compat.md.
	Compat []string
	// CompatHostname is the host label of --compat=dcgm: the node's name.
	CompatHostname string
	// CompatDCGM tunes --compat=dcgm: the dcgm-exporter version whose names it writes, the estimate before Hopper.
	CompatDCGM DCGMOptions
	// Allocations are the kubelet's GPU allocations (gpu_allocation_*, gpu_unrequested_use); nil: not exported.
	Allocations allocation.Source
}

// part is one concern's metrics.
type part interface {
	descs() []*series.Desc
	update(b *series.Batch, r *reading.Reading)
}

// Gatherer is the exporter's one source of metrics: each gathering takes one reading, builds every part's
// families from it, then gathers the self-metrics, so that they describe the reading just served.
type Gatherer struct {
	reader    *reading.Reader
	self      *prometheus.Registry
	parts     []part
	series    *series.Engine
	plausible *plausibility // the device values left out, a self-metric of the collector's own
}

// New returns the collector. self are the self-metrics of the pieces behind the reader (attribution, resolvers);
// more can be registered with Registerer.
func New(reader *reading.Reader, opts Options, self ...prometheus.Collector) *Gatherer {
	labels := newPodLabels(opts.PodLabels, opts.ProcessUser)
	devices := newDeviceMetrics()
	parts := []part{devices}
	if opts.Processes {
		parts = append(parts, newProcessMetrics(labels))
	}
	parts = append(parts, newWorkloadMetrics(labels), newAccountingMetrics(labels))
	if opts.Allocations != nil {
		parts = append(parts, newAllocationMetrics(opts.Allocations))
	}
	parts = append(parts, compatParts(opts, devices.plausible)...)
	var descs []*series.Desc
	for _, p := range parts {
		descs = append(descs, p.descs()...)
	}
	engine := series.NewEngine(descs...)
	reg := prometheus.NewRegistry()
	reg.MustRegister(append([]prometheus.Collector{reader, engine, devices.plausible}, self...)...)
	return &Gatherer{reader: reader, self: reg, parts: parts, series: engine, plausible: devices.plausible}
}

// DescribeSelf describes the collector's own self-metrics, which are served only once they have a series.
func (c *Gatherer) DescribeSelf(ch chan<- *prometheus.Desc) { c.plausible.Describe(ch) }

// Registerer is where the exporter's other self-metrics (build information, Go runtime, HTTP handler) go: they are
// served with the GPU series.
func (c *Gatherer) Registerer() prometheus.Registerer { return c.self }

// Families lists the names of the GPU families the collector can write (not the self-metrics).
func (c *Gatherer) Families() []string {
	var names []string
	for _, d := range c.series.Descs() {
		names = append(names, d.Name())
	}
	return names
}

// Lend gathers once and lends the gathering to the caller, who releases it when done (exposition.Lender). A failed
// or timed-out reading leaves out the GPU series; the self-metrics say why. A series that cannot be written is left
// out and named in the error, which the exposition logs; the rest is served.
func (c *Gatherer) Lend() (*series.Gathering, error) {
	var b *series.Batch
	if r, err := c.reader.Read(context.Background()); err == nil {
		b = c.series.Batch()
		for _, p := range c.parts {
			p.update(b, r)
		}
	}
	self, err := c.self.Gather()
	if b == nil {
		return series.FromFamilies(self), err
	}
	g, gpuErr := b.Gather(self)
	return g, errors.Join(gpuErr, err)
}

// Gather implements prometheus.Gatherer, with a gathering that is never released.
func (c *Gatherer) Gather() ([]*dto.MetricFamily, error) {
	g, err := c.Lend()
	return g.Families(), err
}

func itoa(i int) string { return strconv.Itoa(i) }
