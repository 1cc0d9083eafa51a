// Package series is the exporter's series engine: a collector's parts write series into a Batch, which gathers
// them into families checked and ordered as client_golang's registry would, and the Gathering it makes is written
// in the text format byte for byte as expfmt writes it, or handed out as client_model's families.
//
// It exists because a large node writes tens of thousands of series per scrape: a registry's per-series checks,
// hashes and sorting, and expfmt's escaping of every label of every series, were most of a scrape's CPU. Here a
// series is a value and an index into its label set, which is checked, ordered and written out as text once, and
// is then shared by every family of the same process (or workload) and carried from one gathering to the next.
//
// # Lifetime
//
// An Engine is made once, with every family it will ever write. Then, for each gathering:
//
//   - A Batch is written by one goroutine, and gathered once.
//   - The Gathering it makes is lent, from Batch.Gather until Gathering.Release. Nothing changes it meanwhile, so
//     any number of scrapes may read it at once. After Release the caller must not touch it, nor anything it gave
//     (the client_model families of Families): the next gathering writes its series over that memory. A gathering
//     that is never released is left to the garbage collector, and costs only that.
//   - Label sets are shared between gatherings. A label set (its values, its text and its client_model label pairs)
//     is never changed once made; a batch takes from the last gathering the sets it writes again, so that only the
//     sets of the last gathering are kept, bounded by its series.
//
// # Limits
//
// The sources of series are trusted (the driver, the container runtimes, the kubelet) but not always sane: a pod
// named with a megabyte, a kubelet that lists a hundred thousand allocations. A gathering serves a label value of
// more than MaxLabelValueBytes truncated, with a mark and a digest of the whole value that keep it apart from other
// values truncated alike; and no more than MaxSeriesPerFamily series of a family, the first written, counting the
// others in the engine's self-metric (gpu_pod_exporter_series_dropped_total) and naming the family in the
// gathering's error.
package series

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
)

// Desc is one family a collector writes: what prometheus.Desc is to client_golang's collectors.
type Desc struct {
	name, help string
	labels     []string // label names, in the order the parts pass their values
	layout     *layout  // shared by the descs of an Engine with the same label names
	err        error    // an invalid name or label name: every series of the family is refused with it
	// The family's "# HELP" and "# TYPE" lines, as a gauge and as a counter.
	header [2]string

	engine *Engine // the engine it belongs to, and its index there
	index  int
}

// NewDesc describes a family: its name, help text and label names. An invalid name or label name is not an error
// here but on every gathering that writes the family, which then leaves it out, as a registry does.
func NewDesc(name, help string, labels []string) *Desc {
	order := make([]int, len(labels))
	d := &Desc{name: name, help: help, labels: labels, layout: &layout{labels: labels, order: order}}
	if !model.LegacyValidation.IsValidMetricName(name) {
		d.err = fmt.Errorf("%q is not a valid metric name", name)
	}
	for i, l := range labels {
		if !model.LegacyValidation.IsValidLabelName(l) || strings.HasPrefix(l, model.ReservedLabelPrefix) || slices.Contains(labels[:i], l) {
			d.err = cmp.Or(d.err, fmt.Errorf("%s: label name %q is not valid, reserved or repeated", name, l))
		}
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
	if d.err == nil {
		d.header = [2]string{header(name, help, dto.MetricType_GAUGE), header(name, help, dto.MetricType_COUNTER)}
	}
	return d
}

// Name is the family's name.
func (d *Desc) Name() string { return d.name }

// Labels are the family's label names, in the order its series give their values.
func (d *Desc) Labels() []string { return d.labels }

// layout is some families' label names, and the order in which the exposition writes them: by name, as
// client_golang writes them.
type layout struct {
	labels []string
	order  []int // indexes into labels
	index  int   // among its engine's layouts
}

// The limits of a gathering (see the package's doc). No legitimate value comes near: Kubernetes names are at most
// 253 bytes, systemd's unit names 255. Nor does a legitimate family: 2,048 processes on each of 8 GPUs make 16,384
// series of a per-process family.
const (
	MaxLabelValueBytes = 1024
	MaxSeriesPerFamily = 16384
)

// Engine writes the gatherings of a fixed set of families, each from what the last one left.
type Engine struct {
	descs   []*Desc   // by index
	byName  []int     // indexes of descs, in the order of the exposition
	layouts []*layout // by index
	seed    maphash.Seed
	// The limits, MaxLabelValueBytes and MaxSeriesPerFamily but in tests, and the series dropped by desc.
	maxValue, maxSeries int
	dropped             []atomic.Uint64

	mu    sync.Mutex
	last  carried    // what the last gathering left for the next
	spare [][]sample // by desc: the series of a released gathering, for the next one to write over
}

// NewEngine returns the engine of descs. Descs of the same label names share their label sets. Of two descs with
// one name, the second is refused on every gathering, since Prometheus refuses a scrape that has a family twice.
// A desc belongs to one engine.
func NewEngine(descs ...*Desc) *Engine {
	e := &Engine{descs: descs, seed: maphash.MakeSeed(), maxValue: MaxLabelValueBytes, maxSeries: MaxSeriesPerFamily,
		dropped: make([]atomic.Uint64, len(descs))}
	layouts := make(map[string]*layout)
	names := make(map[string]bool)
	for i, d := range descs {
		if d.engine != nil {
			panic(fmt.Sprintf("series: %s is a family of another engine", d.name))
		}
		d.engine, d.index = e, i
		key := strings.Join(d.labels, "\x00")
		if l, ok := layouts[key]; ok {
			d.layout = l
		} else {
			d.layout.index = len(e.layouts)
			layouts[key] = d.layout
			e.layouts = append(e.layouts, d.layout)
		}
		if names[d.name] {
			d.err = cmp.Or(d.err, fmt.Errorf("%s is written by two parts of the collector", d.name))
		}
		names[d.name] = true
		e.byName = append(e.byName, i)
	}
	slices.SortStableFunc(e.byName, func(a, b int) int { return strings.Compare(descs[a].name, descs[b].name) })
	return e
}

// Descs are the engine's families.
func (e *Engine) Descs() []*Desc { return e.descs }

// Dropped is how many series of d its gatherings have left out, past MaxSeriesPerFamily, since the engine was made.
// It counts as they are written, before the batch is gathered.
func (e *Engine) Dropped(d *Desc) uint64 {
	if d.engine != e {
		return 0
	}
	return e.dropped[d.index].Load()
}

var droppedDesc = prometheus.NewDesc("gpu_pod_exporter_series_dropped_total",
	fmt.Sprintf("Series left out of gatherings because their family had more than %d, by family; absent for a family that never had.",
		MaxSeriesPerFamily), []string{"family"}, nil)

// Describe implements prometheus.Collector for the engine's self-metric: the series it dropped.
func (e *Engine) Describe(ch chan<- *prometheus.Desc) { ch <- droppedDesc }

// Collect implements prometheus.Collector for the engine's self-metric, with a series for each family that had series
// dropped. Collected with the self-metrics of a gathering, after its batch is written, it counts that gathering.
func (e *Engine) Collect(ch chan<- prometheus.Metric) {
	for _, d := range e.descs {
		if n := e.Dropped(d); n > 0 {
			ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(n), d.name)
		}
	}
}

// carried is what a gathering leaves the next: its label sets and their ranks, and how many series each family
// had, to size the next one's at once.
type carried struct {
	rankings []*ranking // by layout
	sizes    []int      // by desc
}

// Batch starts a gathering.
func (e *Engine) Batch() *Batch {
	e.mu.Lock()
	last, spare := e.last, e.spare
	e.spare = nil
	e.mu.Unlock()
	b := &Batch{e: e, families: make([]family, len(e.descs)), layouts: make([]layoutSets, len(e.layouts))}
	for i := range b.layouts {
		ls := &b.layouts[i]
		ls.ranking = &ranking{}
		if i < len(last.rankings) {
			ls.prev = last.rankings[i]
			ls.sets = make([]*labelSet, 0, len(ls.prev.sets))
		}
	}
	for i := range b.families {
		if i < len(spare) && spare[i] != nil {
			b.families[i].samples = spare[i][:0]
		} else if i < len(last.sizes) {
			b.families[i].size = last.sizes[i]
		}
	}
	return b
}

// Batch is one gathering being written.
type Batch struct {
	e        *Engine
	families []family // by desc
	written  []int    // descs in the order first written
	errs     []error
	foreign  map[*Desc]bool // descs of another engine that were written, reported once

	layouts []layoutSets // by layout
	// The label set of the last series: the next series with the same layout and values (the next family of the
	// same process) takes it without a lookup.
	last    setRef
	hasLast bool

	counts []int    // scratch of sortByRank
	sorted []sample // scratch of sortByRank
}

type family struct {
	typ      dto.MetricType
	samples  []sample
	size     int  // the last gathering's series, to allocate samples at once
	written  bool // typ is set
	reported bool // the family's own error (an invalid desc, a second type) is in the errors already
}

// sample is one series: its value, and its label set's index among its layout's sets of the gathering
// (ranking.sets). It holds no pointer, so that the garbage collector need not look at it.
type sample struct {
	value float64
	set   int32
}

// Gauge writes a gauge series of d with the label values in the order of d's label names.
func (b *Batch) Gauge(d *Desc, v float64, labels ...string) {
	b.add(d, dto.MetricType_GAUGE, v, labels)
}

// Counter writes a counter series of d with the label values in the order of d's label names.
func (b *Batch) Counter(d *Desc, v float64, labels ...string) {
	b.add(d, dto.MetricType_COUNTER, v, labels)
}

// add writes one series. A series that cannot be written (a label value that is not UTF-8) is left out and named in
// the gathering's error, which fails that series alone.
func (b *Batch) add(d *Desc, typ dto.MetricType, v float64, labels []string) {
	if d.engine != b.e {
		if !b.foreign[d] {
			if b.foreign == nil {
				b.foreign = make(map[*Desc]bool)
			}
			b.foreign[d] = true
			b.fail(fmt.Errorf("%s is not a family of this collector", d.name))
		}
		return
	}
	f := &b.families[d.index]
	if !f.written {
		f.written, f.typ = true, typ
		if f.samples == nil {
			f.samples = make([]sample, 0, max(f.size, 1))
		}
		b.written = append(b.written, d.index)
	}
	switch {
	case d.err != nil:
		b.failOnce(f, d.err)
		return
	case f.typ != typ:
		b.failOnce(f, fmt.Errorf("%s is written both as a gauge and as a counter", d.name))
		return
	case len(labels) != len(d.labels):
		b.fail(fmt.Errorf("%s: %d label values for %d labels", d.name, len(labels), len(d.labels)))
		return
	case len(f.samples) >= b.e.maxSeries:
		b.e.dropped[d.index].Add(1)
		b.failOnce(f, fmt.Errorf("%s: more than %d series; the others are left out", d.name, b.e.maxSeries))
		return
	}
	ref, ok := b.last, b.hasLast && b.last.set.layout == d.layout && slices.Equal(b.last.set.values, labels)
	if !ok {
		if ref, ok = b.setOf(d, labels); !ok {
			return
		}
		b.last, b.hasLast = ref, true
	}
	f.samples = append(f.samples, sample{value: v, set: ref.index})
}

// setOf finds the label set of values in this gathering, or takes it from the last one, or builds it.
func (b *Batch) setOf(d *Desc, values []string) (setRef, bool) {
	ls := &b.layouts[d.layout.index]
	if ref, ok := ls.expected(values); ok {
		return ref, true
	}
	var h maphash.Hash
	h.SetSeed(b.e.seed)
	for _, v := range values {
		h.WriteString(v)
		h.WriteByte(0xff) // never in UTF-8
	}
	sum := h.Sum64()
	if ref, ok := ls.find(sum, values); ok {
		return ref, true
	}
	for _, v := range values {
		if !utf8.ValidString(v) {
			b.fail(fmt.Errorf("%s: label value %q is not valid UTF-8", d.name, v))
			return setRef{}, false
		}
	}
	return ls.add(newLabelSet(d.layout, values, sum, b.e.maxValue)), true
}

// Each calls f with every series written so far, in the order written, family by family: for views that read
// series back rather than serve them. values must not be kept.
func (b *Batch) Each(f func(d *Desc, values []string, v float64)) {
	for _, i := range b.written {
		d := b.e.descs[i]
		for _, s := range b.families[i].samples {
			f(d, b.layouts[d.layout.index].sets[s.set].shown, s.value)
		}
	}
}

// maxErrors bounds the errors of one gathering: a driver that names every process in bytes that are not UTF-8
// must not make the error as large as the exposition.
const maxErrors = 16

func (b *Batch) fail(err error) {
	if len(b.errs) < maxErrors {
		b.errs = append(b.errs, err)
	}
}

// failOnce reports an error of the family as a whole once, however many of its series it refuses: it must not
// crowd out the errors of other families.
func (b *Batch) failOnce(f *family, err error) {
	if !f.reported {
		f.reported = true
		b.fail(err)
	}
}

// Gather ends the batch: its families, sorted by name and their series by label values, each series once, merged
// with self, families gathered elsewhere (the exporter's self-metrics, from a registry: sorted by name). A series
// written twice with the same labels is kept the first time, as the registry keeps it, and named in the error; so
// is a family of self with the name of one of the batch's, which is left out. The batch is not used again.
func (b *Batch) Gather(self []*dto.MetricFamily) (*Gathering, error) {
	g := &Gathering{e: b.e, own: make([]gathered, 0, len(b.written))}
	for _, i := range b.e.byName {
		f := &b.families[i]
		if len(f.samples) == 0 {
			continue
		}
		d := b.e.descs[i]
		ls := &b.layouts[d.layout.index]
		r := ls.ranking
		r.rank(d.layout, ls.prev)
		b.sortByRank(f.samples, r.ranks)
		kept := f.samples[:1]
		for _, s := range f.samples[1:] {
			if r.ranks[s.set] == r.ranks[kept[len(kept)-1].set] {
				b.fail(fmt.Errorf("collected metric %s %s was collected before with the same name and label values", d.name, r.sets[s.set]))
				continue
			}
			kept = append(kept, s)
		}
		g.own = append(g.own, gathered{desc: d, typ: f.typ, samples: kept, sets: r.sets})
	}
	g.merge(self, &b.errs)
	sizes := make([]int, len(b.families))
	for i, f := range b.families {
		sizes[i] = len(f.samples)
	}
	rankings := make([]*ranking, len(b.layouts))
	for i, ls := range b.layouts {
		rankings[i] = ls.ranking
	}
	b.e.mu.Lock()
	b.e.last = carried{rankings, sizes}
	b.e.mu.Unlock()
	return g, errors.Join(b.errs...)
}

// rank orders the sets as the registry orders series: by label values in exposition order. Equal values have equal
// ranks. A gathering with the same sets as the last (prev) takes its ranks.
func (r *ranking) rank(l *layout, prev *ranking) {
	if len(r.ranks) == len(r.sets) {
		return
	}
	if prev != nil && slices.Equal(prev.sets, r.sets) {
		r.ranks = prev.ranks // never changed once made
		return
	}
	byValues := make([]int32, len(r.sets))
	for i := range byValues {
		byValues[i] = int32(i)
	}
	compare := func(x, y int32) int {
		for _, j := range l.order {
			if c := strings.Compare(r.sets[x].shown[j], r.sets[y].shown[j]); c != 0 {
				return c
			}
		}
		return 0
	}
	slices.SortFunc(byValues, compare)
	r.ranks = make([]int32, len(r.sets))
	for i, s := range byValues {
		r.ranks[s] = int32(i)
		if i > 0 && compare(byValues[i-1], s) == 0 {
			r.ranks[s] = r.ranks[byValues[i-1]]
		}
	}
}

// ranking is the label sets of one layout in one gathering, and their ranks in the exposition's order.
type ranking struct {
	sets  []*labelSet
	ranks []int32
}

// sortByRank sorts samples by the rank of their label set, in the order written among equal ranks: a counting
// sort, since ranks are below the number of sets.
func (b *Batch) sortByRank(samples []sample, ranks []int32) {
	counts := slices.Grow(b.counts[:0], len(ranks)+1)[:len(ranks)+1]
	clear(counts)
	for _, s := range samples {
		counts[ranks[s.set]+1]++
	}
	for i := 1; i < len(counts); i++ {
		counts[i] += counts[i-1]
	}
	sorted := slices.Grow(b.sorted[:0], len(samples))[:len(samples)]
	for _, s := range samples {
		sorted[counts[ranks[s.set]]] = s
		counts[ranks[s.set]]++
	}
	copy(samples, sorted)
	b.counts, b.sorted = counts, sorted
}
