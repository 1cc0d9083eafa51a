package cri

import "github.com/prometheus/client_golang/prometheus"

// The pod cache's self-metrics: what it holds, against podCacheSize and podCacheBytes.
var (
	podCacheEntriesDesc = prometheus.NewDesc("gpu_pod_exporter_resolver_pod_cache_entries",
		"Pod sandboxes the resolver keeps, so that the containers of one pod cost one sandbox lookup: the pods of the last complete reading's processes.",
		nil, prometheus.Labels{"resolver": "cri"})
	podCacheBytesDesc = prometheus.NewDesc("gpu_pod_exporter_resolver_pod_cache_bytes",
		"Estimated memory of the kept pod sandboxes' names and allowlisted labels.",
		nil, prometheus.Labels{"resolver": "cri"})
)

// Describe implements prometheus.Collector.
func (r *Resolver) Describe(ch chan<- *prometheus.Desc) {
	ch <- podCacheEntriesDesc
	ch <- podCacheBytesDesc
}

// Collect implements prometheus.Collector.
func (r *Resolver) Collect(ch chan<- prometheus.Metric) {
	entries, bytes := r.pods.usage()
	ch <- prometheus.MustNewConstMetric(podCacheEntriesDesc, prometheus.GaugeValue, float64(entries))
	ch <- prometheus.MustNewConstMetric(podCacheBytesDesc, prometheus.GaugeValue, float64(bytes))
}

var _ prometheus.Collector = (*Resolver)(nil)
