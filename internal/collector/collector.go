// Package collector turns one attributed reading of the node into Prometheus metrics: one file per concern
// (devices, MIG instances, processes, workloads), all fed from the same reading and registered in one place.
package collector

import (
	"context"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/scrape"
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
	Allocations AllocationSource
}

// part is one concern's metrics.
type part interface {
	describe(ch chan<- *prometheus.Desc)
	update(ch chan<- prometheus.Metric, r *scrape.Result)
}

// Collector is the exporter's one registered collector. Each scrape takes one reading and hands it to every
// part, then writes the self-metrics, so that they describe the reading just served.
type Collector struct {
	scraper *scrape.Scraper
	self    []prometheus.Collector
	parts   []part
}

// New returns the collector. self are the self-metrics of the pieces behind the scraper (attribution, resolvers),
// collected after each reading.
func New(scraper *scrape.Scraper, opts Options, self ...prometheus.Collector) *Collector {
	labels := newPodLabels(opts.PodLabels, opts.ProcessUser)
	parts := []part{newDeviceMetrics(), newMIGMetrics()}
	if opts.Processes {
		parts = append(parts, newProcessMetrics(labels))
	}
	parts = append(parts, newWorkloadMetrics(labels), newSharingMetrics(), newAccountingMetrics(labels))
	if opts.Allocations != nil {
		parts = append(parts, newAllocationMetrics(opts.Allocations))
	}
	parts = append(parts, compatParts(opts)...)
	return &Collector{scraper: scraper, self: append([]prometheus.Collector{scraper}, self...), parts: parts}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, p := range c.parts {
		p.describe(ch)
	}
	for _, s := range c.self {
		s.Describe(ch)
	}
}

// Collect implements prometheus.Collector. A failed or timed-out reading leaves out the GPU series; the
// self-metrics say why.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if r, err := c.scraper.Scrape(context.Background()); err == nil {
		for _, p := range c.parts {
			p.update(ch, r)
		}
	}
	for _, s := range c.self {
		s.Collect(ch)
	}
}

func gauge(ch chan<- prometheus.Metric, desc *prometheus.Desc, v float64, labels ...string) {
	constMetric(ch, desc, prometheus.GaugeValue, v, labels)
}

func counter(ch chan<- prometheus.Metric, desc *prometheus.Desc, v float64, labels ...string) {
	constMetric(ch, desc, prometheus.CounterValue, v, labels)
}

// constMetric sends one series. A series that cannot be built (a label value that is not UTF-8) is reported as
// an invalid metric, which fails that series alone; a panic here would end the whole collection.
func constMetric(ch chan<- prometheus.Metric, desc *prometheus.Desc, t prometheus.ValueType, v float64, labels []string) {
	m, err := prometheus.NewConstMetric(desc, t, v, labels...)
	if err != nil {
		m = prometheus.NewInvalidMetric(desc, err)
	}
	ch <- m
}

func itoa(i int) string { return strconv.Itoa(i) }
