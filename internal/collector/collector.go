// Package collector turns one attributed reading of the node into Prometheus metrics: one file per concern
// (devices, MIG instances, processes, workloads), all fed from the same reading and registered in one place.
package collector

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

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
	if s, ok := newSeries(desc, t, v, labels); ok {
		ch <- s
		return
	}
	m, err := prometheus.NewConstMetric(desc, t, v, labels...)
	if err != nil {
		m = prometheus.NewInvalidMetric(desc, err)
	}
	ch <- m
}

// series is what prometheus.NewConstMetric builds, in five allocations instead of three per label, and in two when
// it has the labels of the series before it (the five families of one process): a large node sends tens of
// thousands of series per scrape, and NewConstMetric's label pairs were 40% of a scrape's CPU.
type series struct {
	desc   *prometheus.Desc
	gauge  bool
	value  float64
	labels []*dto.LabelPair
}

func (s *series) Desc() *prometheus.Desc { return s.desc }

func (s *series) Write(m *dto.Metric) error {
	m.Label = s.labels
	if s.gauge {
		m.Gauge = &dto.Gauge{Value: &s.value}
	} else {
		m.Counter = &dto.Counter{Value: &s.value}
	}
	return nil
}

// labelOrder is how a Desc's labels are exposed: names in exposition order, and for each, the index of its value
// among the variable label values, or -1 for a constant label.
type labelOrder struct {
	pairs     []dto.LabelPair // names, and the values of constant labels
	index     []int
	variables int // how many label values the Desc takes
	// layout is the same pointer for every Desc with the same names, constant labels and order: the families of
	// one process (or one workload) share it, and so can share the label pairs of their series.
	layout *string
}

// layouts interns labelOrder.layout.
var layouts sync.Map // string → *string

// lastPairs are the label pairs of the last series built: the next series of the same layout and values (the
// next family of the same process) shares them rather than building its own. Label pairs are never changed once
// built, so sharing them between series, gatherings or goroutines is safe; the lock only keeps this cache whole.
var lastPairs struct {
	sync.Mutex
	layout *string
	values []string
	labels []*dto.LabelPair
}

// labelOrders holds the labelOrder of every Desc seen, learnt from client_golang itself (NewConstMetric with
// placeholder values) so that the order and the constant labels are its own. Descs are created once, with the
// collector, so this stays small; should a part ever create Descs per scrape, maxLabelOrders bounds it, and the
// Descs beyond go through NewConstMetric.
var labelOrders sync.Map // *prometheus.Desc → *labelOrder, nil for a Desc that NewConstMetric refuses

var labelOrderCount atomic.Int32

const maxLabelOrders = 4096

func orderOf(desc *prometheus.Desc, n int) *labelOrder {
	if o, ok := labelOrders.Load(desc); ok {
		return o.(*labelOrder)
	}
	if labelOrderCount.Load() >= maxLabelOrders {
		return nil
	}
	placeholders := make([]string, n)
	for i := range placeholders {
		placeholders[i] = "\x00" + strconv.Itoa(i) // no real label value looks like this
	}
	var o *labelOrder
	var m dto.Metric
	if c, err := prometheus.NewConstMetric(desc, prometheus.GaugeValue, 0, placeholders...); err == nil && c.Write(&m) == nil {
		o = &labelOrder{variables: n}
		seen := make([]bool, n)
		for _, p := range m.Label {
			i := -1
			for j, ph := range placeholders {
				if p.GetValue() == ph && !seen[j] {
					i = j
					seen[j] = true
					break
				}
			}
			o.pairs = append(o.pairs, dto.LabelPair{Name: p.Name, Value: p.Value})
			o.index = append(o.index, i)
		}
		var key strings.Builder
		for k := range o.pairs {
			key.WriteString(o.pairs[k].GetName())
			key.WriteByte(0)
			if o.index[k] < 0 {
				key.WriteString(o.pairs[k].GetValue())
			} else {
				key.WriteString(strconv.Itoa(o.index[k]))
			}
			key.WriteByte(0xff)
		}
		k := key.String()
		l, _ := layouts.LoadOrStore(k, &k)
		o.layout = l.(*string)
	}
	if _, loaded := labelOrders.LoadOrStore(desc, o); !loaded {
		labelOrderCount.Add(1)
	}
	return o
}

// newSeries builds a series the way NewConstMetric would, or reports false where NewConstMetric has to say why
// not (a label value that is not UTF-8, a wrong number of values).
func newSeries(desc *prometheus.Desc, t prometheus.ValueType, v float64, labels []string) (*series, bool) {
	o := orderOf(desc, len(labels))
	if o == nil || len(labels) != o.variables || t != prometheus.GaugeValue && t != prometheus.CounterValue {
		return nil, false
	}
	s := &series{desc: desc, gauge: t == prometheus.GaugeValue, value: v}
	lastPairs.Lock()
	defer lastPairs.Unlock()
	if lastPairs.layout == o.layout && slices.Equal(lastPairs.values, labels) {
		s.labels = lastPairs.labels
		return s, true
	}
	for _, l := range labels {
		if !utf8.ValidString(l) {
			return nil, false
		}
	}
	values := append([]string(nil), labels...)
	pairs := make([]dto.LabelPair, len(o.pairs))
	s.labels = make([]*dto.LabelPair, len(o.pairs))
	for i := range pairs {
		pairs[i].Name = o.pairs[i].Name
		if j := o.index[i]; j >= 0 {
			pairs[i].Value = &values[j]
		} else {
			pairs[i].Value = o.pairs[i].Value
		}
		s.labels[i] = &pairs[i]
	}
	lastPairs.layout, lastPairs.values, lastPairs.labels = o.layout, values, s.labels
	return s, true
}

func itoa(i int) string { return strconv.Itoa(i) }
