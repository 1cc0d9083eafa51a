// Package selfmetrics keeps the exporter's own metrics of one component (the reader, the attributor, the kubelet
// client) in one list, so that what the component describes and what it collects cannot drift apart.
package selfmetrics

import "github.com/prometheus/client_golang/prometheus"

// Set is one component's self-metrics, a prometheus.Collector of them all.
type Set []prometheus.Collector

// Describe implements prometheus.Collector.
func (s Set) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (s Set) Collect(ch chan<- prometheus.Metric) {
	for _, c := range s {
		c.Collect(ch)
	}
}
