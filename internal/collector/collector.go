// Package collector turns one attributed reading of the node into Prometheus metrics: one file per concern
// (devices, MIG instances, processes, workloads), all fed from the same reading and registered in one place.
package collector

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
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
	// CompatHostname is the Hostname label of --compat=dcgm.
	CompatHostname string
	// Allocations are the kubelet's GPU allocations (gpu_allocation_*, gpu_unrequested_use); nil: not exported.
	Allocations allocation.Source
}

// part is one concern's metrics.
type part interface {
	descs() []*desc
	update(b *batch, r *reading.Reading)
}

// Gatherer is the exporter's one source of metrics: each gathering takes one reading, builds every part's
// families from it, then gathers the self-metrics, so that they describe the reading just served.
type Gatherer struct {
	reader *reading.Reader
	self   *prometheus.Registry
	parts  []part

	seed maphash.Seed
	mu   sync.Mutex
	last carried // what the last gathering left for the next
	// The slabs of gatherings not released yet, by their families, and those of the last released one, for the next
	// gathering to cut its series from.
	lent  map[**dto.MetricFamily]slabs
	spare slabs
}

// maxLent bounds the gatherings whose slabs are kept for a Release that may never come (a caller that gathers and
// does not release): past it, a gathering's slabs are left to the garbage collector.
const maxLent = 4

// New returns the collector. self are the self-metrics of the pieces behind the reader (attribution, resolvers);
// more can be registered with Registerer.
func New(reader *reading.Reader, opts Options, self ...prometheus.Collector) *Gatherer {
	labels := newPodLabels(opts.PodLabels, opts.ProcessUser)
	parts := []part{newDeviceMetrics()}
	if opts.Processes {
		parts = append(parts, newProcessMetrics(labels))
	}
	parts = append(parts, newWorkloadMetrics(labels), newAccountingMetrics(labels))
	if opts.Allocations != nil {
		parts = append(parts, newAllocationMetrics(opts.Allocations))
	}
	parts = append(parts, compatParts(opts)...)
	var descs []*desc
	for _, p := range parts {
		descs = append(descs, p.descs()...)
	}
	shareLayouts(descs)
	reg := prometheus.NewRegistry()
	reg.MustRegister(append([]prometheus.Collector{reader}, self...)...)
	return &Gatherer{reader: reader, self: reg, parts: parts, seed: maphash.MakeSeed(), lent: make(map[**dto.MetricFamily]slabs)}
}

// Registerer is where the exporter's other self-metrics (build information, Go runtime, HTTP handler) go: they are
// served with the GPU series.
func (c *Gatherer) Registerer() prometheus.Registerer { return c.self }

// Families lists the names of the GPU families the collector can write (not the self-metrics).
func (c *Gatherer) Families() []string {
	var names []string
	for _, p := range c.parts {
		for _, d := range p.descs() {
			names = append(names, d.name)
		}
	}
	return names
}

// Gather implements prometheus.Gatherer. A failed or timed-out reading leaves out the GPU series; the
// self-metrics say why. A series that cannot be written is left out and named in the error, which the exposition
// logs; the rest is served.
func (c *Gatherer) Gather() ([]*dto.MetricFamily, error) {
	var gpu []*dto.MetricFamily
	var errs []error
	var used slabs
	if r, err := c.reader.Read(context.Background()); err == nil {
		c.mu.Lock()
		b := newBatch(c.last, c.seed)
		b.spare, c.spare = c.spare, slabs{}
		c.mu.Unlock()
		for _, p := range c.parts {
			p.update(b, r)
		}
		var err error
		gpu, err = b.gather()
		errs = append(errs, err)
		used = b.used
		c.mu.Lock()
		c.last = b.carry()
		c.mu.Unlock()
	}
	self, err := c.self.Gather()
	errs = append(errs, err)
	// Both lists are sorted by name; a name in both is a bug that a test guards against, and the GPU family wins.
	mfs := make([]*dto.MetricFamily, 0, len(gpu)+len(self))
	for len(gpu) > 0 || len(self) > 0 {
		switch {
		case len(self) == 0 || len(gpu) > 0 && gpu[0].GetName() < self[0].GetName():
			mfs, gpu = append(mfs, gpu[0]), gpu[1:]
		case len(gpu) == 0 || self[0].GetName() < gpu[0].GetName():
			mfs, self = append(mfs, self[0]), self[1:]
		default:
			errs = append(errs, fmt.Errorf("%s is both a GPU family and a self-metric", self[0].GetName()))
			self = self[1:]
		}
	}
	if len(used.metrics) > 0 && len(mfs) > 0 {
		c.mu.Lock()
		if len(c.lent) >= maxLent {
			clear(c.lent)
		}
		c.lent[&mfs[0]] = used
		c.mu.Unlock()
	}
	return mfs, errors.Join(errs...)
}

// Release implements exposition.Releaser: the series of mfs, a gathering's that nothing uses any more, are written
// over by a later gathering instead of being allocated anew (a tenth of a large node's scrape).
func (c *Gatherer) Release(mfs []*dto.MetricFamily) {
	if len(mfs) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if used, ok := c.lent[&mfs[0]]; ok {
		delete(c.lent, &mfs[0])
		c.spare = used
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
