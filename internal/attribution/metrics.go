package attribution

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/selfmetrics"
)

// metrics are the Attributor's self-metrics. The Attributor is a prometheus.Collector, so that the caller registers
// it once and the metrics live and die with it (no global registry).
type metrics struct {
	requests       *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	budgetExceeded prometheus.Counter
	procfsErrors   *prometheus.CounterVec
	cacheEntries   *prometheus.Desc
}

func newMetrics(resolvers []runtime.Resolver) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_pod_exporter_resolver_requests_total",
			Help: "Container runtime lookups, by resolver and result (success, not_found, error, " +
				"unavailable: the runtime's socket does not exist, so it was not asked; " +
				"backoff: the runtime timed out recently, so it was not asked).",
		}, []string{"resolver", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpu_pod_exporter_resolver_request_duration_seconds",
			Help:    "Duration of container runtime lookups, by resolver.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"resolver"}),
		budgetExceeded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_pod_exporter_attribution_lookup_budget_exceeded_total",
			Help: "Attributions that stopped waiting for container runtime lookups at the lookup budget; " +
				"their containers had cgroup-derived labels only.",
		}),
		procfsErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_pod_exporter_attribution_procfs_errors_total",
			Help: "GPU processes whose procfs files could not be read, by reason " +
				"(exited: the process ended before it was read; other: procfs not readable).",
		}, []string{"reason"}),
		cacheEntries: prometheus.NewDesc(
			"gpu_pod_exporter_resolver_cache_entries",
			"Containers in the name cache, by state (resolved, unresolved: no runtime could name it, pending: lookup in flight).",
			[]string{"state"}, nil),
	}
	// Start the series at zero so that rate() and absent() work from the first scrape.
	for _, r := range resolvers {
		for _, result := range []string{"success", "not_found", "error", "unavailable", "backoff"} {
			m.requests.WithLabelValues(r.Name(), result)
		}
	}
	for _, reason := range []string{"exited", "other"} {
		m.procfsErrors.WithLabelValues(reason)
	}
	return m
}

// set is all the metrics, with the entries of the name cache n, and those of the resolvers that have their own
// (the CRI's pod cache).
func (m *metrics) set(n *names, resolvers []runtime.Resolver) selfmetrics.Set {
	s := selfmetrics.Set{m.requests, m.duration, m.budgetExceeded, m.procfsErrors, cacheEntries{m.cacheEntries, n}}
	for _, r := range resolvers {
		if c, ok := r.(prometheus.Collector); ok {
			s = append(s, c)
		}
	}
	return s
}

// cacheEntries is the gauge of the name cache's entries by state, read when collected.
type cacheEntries struct {
	desc  *prometheus.Desc
	names *names
}

func (c cacheEntries) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c cacheEntries) Collect(ch chan<- prometheus.Metric) {
	resolved, unresolved, pending := c.names.counts()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(resolved), "resolved")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(unresolved), "unresolved")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(pending), "pending")
}

// Describe implements prometheus.Collector.
func (a *Attributor) Describe(ch chan<- *prometheus.Desc) { a.self.Describe(ch) }

// Collect implements prometheus.Collector.
func (a *Attributor) Collect(ch chan<- prometheus.Metric) { a.self.Collect(ch) }

var _ prometheus.Collector = (*Attributor)(nil)
