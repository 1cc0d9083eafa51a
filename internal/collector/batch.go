package collector

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
)

// desc is one family the collector writes: what prometheus.Desc is to client_golang's collectors, for the series
// this package builds straight into client_model's types.
type desc struct {
	name, help string
	labels     []string // label names, in the order the parts pass their values
	order      []int    // the values' indexes in exposition order: by label name, as client_golang writes them
	err        error    // an invalid name or label name: every series of the family is refused with it
}

func newDesc(name, help string, labels []string) *desc {
	d := &desc{name: name, help: help, labels: labels, order: make([]int, len(labels))}
	if !model.LegacyValidation.IsValidMetricName(name) {
		d.err = fmt.Errorf("%q is not a valid metric name", name)
	}
	for i, l := range labels {
		if !model.LegacyValidation.IsValidLabelName(l) || strings.HasPrefix(l, model.ReservedLabelPrefix) || slices.Contains(labels[:i], l) {
			d.err = cmp.Or(d.err, fmt.Errorf("%s: label name %q is not valid, reserved or repeated", name, l))
		}
		d.order[i] = i
	}
	slices.SortFunc(d.order, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
	return d
}

var (
	gaugeType   = dto.MetricType_GAUGE
	counterType = dto.MetricType_COUNTER
)

// batch builds the families of one reading. It replaces client_golang's registry for the GPU series: a large node
// writes tens of thousands of them per scrape, and the registry's per-series checks, hashes and sorting were half of
// a scrape's CPU. Here each family is sorted as the registry sorts it, with the label sets of one process (or
// workload) ranked once for all its families, and a repeated series is refused as the registry refuses it.
type batch struct {
	families []*family
	byDesc   map[*desc]*family
	layouts  map[*desc]*layout
	errs     []error

	// The label set of the last series: the next series with the same label names and values (the next family of
	// the same process) shares it.
	last *labelSet

	// Series and label sets are cut from slabs: an allocation per hundreds of them instead of three each.
	metrics  []dto.Metric
	gauges   []gaugeValue
	counters []counterValue
	pairs    []dto.LabelPair
	pointers []*dto.LabelPair
	strings  []string
}

type family struct {
	desc   *desc
	typ    *dto.MetricType
	series []series
}

type series struct {
	labels *labelSet
	metric *dto.Metric
	n      int // the order written, which decides between series with the same labels
}

type gaugeValue struct {
	gauge dto.Gauge
	v     float64
}

type counterValue struct {
	counter dto.Counter
	v       float64
}

// labelSet is one set of label values, shared by the series of every family with the same label names.
type labelSet struct {
	layout *layout
	values []string // in the order of desc.labels
	pairs  []*dto.LabelPair
	rank   int // position among the layout's label sets, in exposition order; equal values have equal ranks
}

// layout is the label names of some families, and every label set written with them.
type layout struct {
	labels []string
	order  []int
	sets   []*labelSet
	ranked bool
}

const slab = 256

func newBatch() *batch {
	return &batch{byDesc: make(map[*desc]*family), layouts: make(map[*desc]*layout)}
}

func (b *batch) gauge(d *desc, v float64, labels ...string) {
	b.add(d, &gaugeType, v, labels)
}

func (b *batch) counter(d *desc, v float64, labels ...string) {
	b.add(d, &counterType, v, labels)
}

// add writes one series. A series that cannot be written (a label value that is not UTF-8) is left out and named in
// the gathering's error, which fails that series alone.
func (b *batch) add(d *desc, typ *dto.MetricType, v float64, labels []string) {
	f := b.byDesc[d]
	if f == nil {
		f = &family{desc: d, typ: typ}
		b.byDesc[d] = f
		b.families = append(b.families, f)
	}
	switch {
	case d.err != nil:
		if len(f.series) == 0 && len(b.errs) < maxErrors {
			b.errs = append(b.errs, d.err)
		}
		return
	case f.typ != typ:
		b.fail(fmt.Errorf("%s is written both as a gauge and as a counter", d.name))
		return
	case len(labels) != len(d.labels):
		b.fail(fmt.Errorf("%s: %d label values for %d labels", d.name, len(labels), len(d.labels)))
		return
	}
	set := b.last
	if set == nil || !slices.Equal(set.layout.labels, d.labels) || !slices.Equal(set.values, labels) {
		for _, l := range labels {
			if !utf8.ValidString(l) {
				b.fail(fmt.Errorf("%s: label value %q is not valid UTF-8", d.name, l))
				return
			}
		}
		set = b.newLabelSet(b.layoutOf(d), labels)
		b.last = set
	}
	m := cut(&b.metrics, slab)
	m.Label = set.pairs
	if typ == &gaugeType {
		g := cut(&b.gauges, slab)
		g.v = v
		g.gauge.Value = &g.v
		m.Gauge = &g.gauge
	} else {
		c := cut(&b.counters, slab)
		c.v = v
		c.counter.Value = &c.v
		m.Counter = &c.counter
	}
	f.series = append(f.series, series{labels: set, metric: m, n: len(f.series)})
}

// cut takes one element from a slab, which it refills with n new ones when empty.
func cut[T any](from *[]T, n int) *T {
	if len(*from) == 0 {
		*from = make([]T, n)
	}
	e := &(*from)[0]
	*from = (*from)[1:]
	return e
}

// cutN takes n elements from a slab of label values or pairs, as one slice.
func cutN[T any](from *[]T, n int) []T {
	if len(*from) < n {
		*from = make([]T, max(n, slab*8))
	}
	s := (*from)[:n:n]
	*from = (*from)[n:]
	return s
}

// maxErrors bounds the errors of one gathering: a driver that names every process in bytes that are not UTF-8
// must not make the error as large as the exposition.
const maxErrors = 16

func (b *batch) fail(err error) {
	if len(b.errs) < maxErrors {
		b.errs = append(b.errs, err)
	}
}

func (b *batch) layoutOf(d *desc) *layout {
	if l := b.layouts[d]; l != nil {
		return l
	}
	for _, l := range b.layouts {
		if slices.Equal(l.labels, d.labels) {
			b.layouts[d] = l
			return l
		}
	}
	l := &layout{labels: d.labels, order: d.order}
	b.layouts[d] = l
	return l
}

func (b *batch) newLabelSet(l *layout, values []string) *labelSet {
	n := len(values)
	s := &labelSet{layout: l, values: cutN(&b.strings, n)}
	copy(s.values, values)
	pairs := cutN(&b.pairs, n)
	s.pairs = cutN(&b.pointers, n)
	for i, j := range l.order {
		pairs[i].Name, pairs[i].Value = &l.labels[j], &s.values[j]
		s.pairs[i] = &pairs[i]
	}
	l.sets = append(l.sets, s)
	l.ranked = false
	return s
}

// rank orders the layout's label sets as the registry orders series: by label values, in exposition order.
func (l *layout) rank() {
	if l.ranked {
		return
	}
	sets := slices.Clone(l.sets)
	slices.SortFunc(sets, l.compare)
	for i, s := range sets {
		s.rank = i
		if i > 0 && l.compare(sets[i-1], s) == 0 {
			s.rank = sets[i-1].rank
		}
	}
	l.ranked = true
}

func (l *layout) compare(a, b *labelSet) int {
	for _, j := range l.order {
		if c := strings.Compare(a.values[j], b.values[j]); c != 0 {
			return c
		}
	}
	return 0
}

// gather returns the batch's families sorted by name, their series sorted by label values, each family once. A
// series written twice with the same labels is kept the first time, as the registry keeps it, and named in the
// error.
func (b *batch) gather() ([]*dto.MetricFamily, error) {
	mfs := make([]*dto.MetricFamily, 0, len(b.families))
	for _, f := range b.families {
		if len(f.series) == 0 {
			continue
		}
		for _, s := range f.series {
			s.labels.layout.rank()
		}
		slices.SortFunc(f.series, func(x, y series) int { return cmp.Or(cmp.Compare(x.labels.rank, y.labels.rank), cmp.Compare(x.n, y.n)) })
		mf := &dto.MetricFamily{Name: &f.desc.name, Help: &f.desc.help, Type: f.typ, Metric: make([]*dto.Metric, 0, len(f.series))}
		for i, s := range f.series {
			if i > 0 && s.labels.rank == f.series[i-1].labels.rank {
				b.fail(fmt.Errorf("collected metric %s %s was collected before with the same name and label values", f.desc.name, s.labels))
				continue
			}
			mf.Metric = append(mf.Metric, s.metric)
		}
		mfs = append(mfs, mf)
	}
	slices.SortFunc(mfs, func(x, y *dto.MetricFamily) int { return strings.Compare(x.GetName(), y.GetName()) })
	return mfs, errors.Join(b.errs...)
}

// String writes the label set as the exposition would, for errors.
func (s *labelSet) String() string {
	var sb strings.Builder
	sb.WriteByte('{')
	for i, p := range s.pairs {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, "%s=%q", p.GetName(), p.GetValue())
	}
	sb.WriteByte('}')
	return sb.String()
}
