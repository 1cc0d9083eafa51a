package collector

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
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
	layout     *layout  // the same for every desc of a Gatherer with the same label names (see New)
	err        error    // an invalid name or label name: every series of the family is refused with it
}

func newDesc(name, help string, labels []string) *desc {
	order := make([]int, len(labels))
	d := &desc{name: name, help: help, labels: labels, layout: &layout{labels: labels, order: order}}
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
	return d
}

// layout is some families' label names, and the order in which the exposition writes them: by name, as
// client_golang writes them.
type layout struct {
	labels []string
	order  []int // indexes into labels
}

// shareLayouts gives the descs with the same label names one layout, so that their series can share label sets.
func shareLayouts(descs []*desc) {
	layouts := make(map[string]*layout)
	for _, d := range descs {
		key := strings.Join(d.labels, "\x00")
		if l, ok := layouts[key]; ok {
			d.layout = l
		} else {
			layouts[key] = d.layout
		}
	}
}

var (
	gaugeType   = dto.MetricType_GAUGE
	counterType = dto.MetricType_COUNTER
)

// labelSet is one set of label values and its label pairs. It is never changed once built, so that the series of
// every family with its label names share it, in this gathering and the next ones.
type labelSet struct {
	layout *layout
	values []string // in the order of layout.labels
	pairs  []*dto.LabelPair
}

// labelSets are the label sets of one gathering, by the hash of their values: the next gathering takes from them the
// sets it writes again (the same processes and workloads, mostly) instead of building them anew. Only the sets of
// the last gathering are kept, so they are bounded by its series.
type labelSets map[uint64]setRefs

// setRefs are the sets of one hash. A second one needs a 64-bit collision, so the first is kept out of a slice,
// which would cost an allocation per set.
type setRefs struct {
	first setRef
	more  []setRef
}

type setRef struct {
	set   *labelSet
	index int // among its layout's sets in this gathering (ranking.sets)
}

func (s labelSets) find(h uint64, l *layout, values []string) (setRef, bool) {
	refs, ok := s[h]
	if !ok {
		return setRef{}, false
	}
	is := func(r setRef) bool { return r.set.layout == l && slices.Equal(r.set.values, values) }
	if is(refs.first) {
		return refs.first, true
	}
	if i := slices.IndexFunc(refs.more, is); i >= 0 {
		return refs.more[i], true
	}
	return setRef{}, false
}

func (s labelSets) add(h uint64, r setRef) {
	if refs, ok := s[h]; ok {
		refs.more = append(refs.more, r)
		s[h] = refs
	} else {
		s[h] = setRefs{first: r}
	}
}

// batch builds the families of one reading. It replaces client_golang's registry for the GPU series: a large node
// writes tens of thousands of them per scrape, and the registry's per-series checks, hashes and sorting were half of
// a scrape's CPU. Here each family is sorted as the registry sorts it, with the label sets of one process (or
// workload) ranked once for all its families, and a repeated series is refused as the registry refuses it.
type batch struct {
	families []*family
	byDesc   map[*desc]*family
	errs     []error

	prev, sets labelSets // the last gathering's label sets (read only), and this one's
	seed       maphash.Seed
	rankings   map[*layout]*ranking
	// The last gathering's rankings, whose ranks a ranking of the same sets takes, and its families' sizes.
	prevRankings map[*layout]*ranking
	prevSizes    map[*desc]int
	counts       []int    // scratch of sortByRank
	sorted       []series // scratch of sortByRank
	// The label set of the last series: the next series with the same layout and values (the next family of the
	// same process) takes it without a lookup.
	last    setRef
	hasLast bool

	// Series are cut from slabs: an allocation per hundreds of them instead of three each. A slab lives as long as
	// the gathering's families, and is then reused (Gatherer.Release).
	metrics  []dto.Metric
	gauges   []gaugeValue
	counters []counterValue
	spare    slabs // released slabs to cut from before allocating
	used     slabs // every slab this batch cut from
}

// slabs are the slabs of one gathering.
type slabs struct {
	metrics  [][]dto.Metric
	gauges   [][]gaugeValue
	counters [][]counterValue
}

type family struct {
	desc     *desc
	typ      *dto.MetricType
	series   []series
	reported bool // the family's own error (an invalid desc, a second type) is in the errors already
}

type series struct {
	set    int // index among the layout's sets (ranking.sets)
	metric *dto.Metric
}

type gaugeValue struct {
	gauge dto.Gauge
	v     float64
}

type counterValue struct {
	counter dto.Counter
	v       float64
}

// ranking is the label sets of one layout in one gathering, and their order in the exposition: by label values in
// exposition order. Equal values have equal ranks.
type ranking struct {
	sets  []*labelSet
	ranks []int
}

const slab = 256

// carried is what a gathering leaves the next: its label sets and their ranks, and how many series each family
// had, to size the next one's at once.
type carried struct {
	sets     labelSets
	rankings map[*layout]*ranking
	sizes    map[*desc]int
}

// newBatch returns a batch that takes label sets and ranks from what the last gathering carried.
func newBatch(last carried, seed maphash.Seed) *batch {
	return &batch{byDesc: make(map[*desc]*family), seed: seed, rankings: make(map[*layout]*ranking),
		prev: last.sets, prevRankings: last.rankings, prevSizes: last.sizes, sets: make(labelSets, len(last.sets))}
}

// carry is what the batch leaves the next gathering.
func (b *batch) carry() carried {
	sizes := make(map[*desc]int, len(b.families))
	for _, f := range b.families {
		sizes[f.desc] = len(f.series)
	}
	return carried{b.sets, b.rankings, sizes}
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
		f = &family{desc: d, typ: typ, series: make([]series, 0, b.prevSizes[d])}
		b.byDesc[d] = f
		b.families = append(b.families, f)
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
	}
	ref, ok := b.last, b.hasLast && b.last.set.layout == d.layout && slices.Equal(b.last.set.values, labels)
	if !ok {
		if ref, ok = b.setOf(d, labels); !ok {
			return
		}
		b.last, b.hasLast = ref, true
	}
	m := cut(&b.metrics, &b.spare.metrics, &b.used.metrics)
	m.Label = ref.set.pairs
	if typ == &gaugeType {
		g := cut(&b.gauges, &b.spare.gauges, &b.used.gauges)
		g.v = v
		g.gauge.Value = &g.v
		m.Gauge = &g.gauge
	} else {
		c := cut(&b.counters, &b.spare.counters, &b.used.counters)
		c.v = v
		c.counter.Value = &c.v
		m.Counter = &c.counter
	}
	f.series = append(f.series, series{set: ref.index, metric: m})
}

// setOf finds the label set of values in this gathering, or takes it from the last one, or builds it.
func (b *batch) setOf(d *desc, values []string) (setRef, bool) {
	var h maphash.Hash
	h.SetSeed(b.seed)
	for _, v := range values {
		h.WriteString(v)
		h.WriteByte(0xff) // never in UTF-8
	}
	sum := h.Sum64()
	if ref, ok := b.sets.find(sum, d.layout, values); ok {
		return ref, true
	}
	var set *labelSet
	if ref, ok := b.prev.find(sum, d.layout, values); ok {
		set = ref.set
	} else {
		for _, v := range values {
			if !utf8.ValidString(v) {
				b.fail(fmt.Errorf("%s: label value %q is not valid UTF-8", d.name, v))
				return setRef{}, false
			}
		}
		set = newLabelSet(d.layout, values)
	}
	r := b.rankings[d.layout]
	if r == nil {
		r = &ranking{}
		b.rankings[d.layout] = r
	}
	ref := setRef{set: set, index: len(r.sets)}
	r.sets = append(r.sets, set)
	b.sets.add(sum, ref)
	return ref, true
}

// newLabelSet builds a label set in allocations of its own, not cut from a slab: it may outlive this gathering by
// many, and would keep a whole slab alive.
func newLabelSet(l *layout, values []string) *labelSet {
	s := &labelSet{layout: l, values: slices.Clone(values)}
	pairs := make([]dto.LabelPair, len(values))
	s.pairs = make([]*dto.LabelPair, len(values))
	for i, j := range l.order {
		pairs[i].Name, pairs[i].Value = &l.labels[j], &s.values[j]
		s.pairs[i] = &pairs[i]
	}
	return s
}

// cut takes one element from a slab. An empty one is replaced by a spare slab, zeroed, or else by a new one: a
// gathering's 10,000 series in 40 allocations rather than 30,000, or in none.
func cut[T any](from *[]T, spare, used *[][]T) *T {
	if len(*from) == 0 {
		if n := len(*spare); n > 0 {
			*from = (*spare)[n-1]
			*spare = (*spare)[:n-1]
			clear(*from)
		} else {
			*from = make([]T, slab)
		}
		*used = append(*used, *from)
	}
	e := &(*from)[0]
	*from = (*from)[1:]
	return e
}

// maxErrors bounds the errors of one gathering: a driver that names every process in bytes that are not UTF-8
// must not make the error as large as the exposition.
const maxErrors = 16

func (b *batch) fail(err error) {
	if len(b.errs) < maxErrors {
		b.errs = append(b.errs, err)
	}
}

// failOnce reports an error of the family as a whole once, however many of its series it refuses: it must not
// crowd out the errors of other families.
func (b *batch) failOnce(f *family, err error) {
	if !f.reported {
		f.reported = true
		b.fail(err)
	}
}

// rank orders the sets as the registry orders series. A gathering with the same sets as the last (prev) takes its
// ranks.
func (r *ranking) rank(l *layout, prev *ranking) {
	if len(r.ranks) == len(r.sets) {
		return
	}
	if prev != nil && slices.Equal(prev.sets, r.sets) {
		r.ranks = prev.ranks // never changed once made
		return
	}
	byValues := make([]int, len(r.sets))
	for i := range byValues {
		byValues[i] = i
	}
	compare := func(x, y int) int {
		for _, j := range l.order {
			if c := strings.Compare(r.sets[x].values[j], r.sets[y].values[j]); c != 0 {
				return c
			}
		}
		return 0
	}
	slices.SortFunc(byValues, compare)
	r.ranks = make([]int, len(r.sets))
	for i, s := range byValues {
		r.ranks[s] = i
		if i > 0 && compare(byValues[i-1], s) == 0 {
			r.ranks[s] = r.ranks[byValues[i-1]]
		}
	}
}

// sortByRank sorts series by the rank of their label set, in the order written among equal ranks: a counting sort,
// since ranks are below the number of sets.
func (b *batch) sortByRank(series []series, ranks []int) {
	counts := slices.Grow(b.counts[:0], len(ranks)+1)[:len(ranks)+1]
	clear(counts)
	for _, s := range series {
		counts[ranks[s.set]+1]++
	}
	for i := 1; i < len(counts); i++ {
		counts[i] += counts[i-1]
	}
	sorted := slices.Grow(b.sorted[:0], len(series))[:len(series)]
	for _, s := range series {
		sorted[counts[ranks[s.set]]] = s
		counts[ranks[s.set]]++
	}
	copy(series, sorted)
	b.counts, b.sorted = counts, sorted
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
		r := b.rankings[f.desc.layout]
		r.rank(f.desc.layout, b.prevRankings[f.desc.layout])
		b.sortByRank(f.series, r.ranks)
		mf := &dto.MetricFamily{Name: &f.desc.name, Help: &f.desc.help, Type: f.typ, Metric: make([]*dto.Metric, 0, len(f.series))}
		for i, s := range f.series {
			if i > 0 && r.ranks[s.set] == r.ranks[f.series[i-1].set] {
				b.fail(fmt.Errorf("collected metric %s %s was collected before with the same name and label values", f.desc.name, r.sets[s.set]))
				continue
			}
			mf.Metric = append(mf.Metric, s.metric)
		}
		mfs = append(mfs, mf)
	}
	slices.SortStableFunc(mfs, func(x, y *dto.MetricFamily) int { return strings.Compare(x.GetName(), y.GetName()) })
	// Two descs with one name would write the family twice, which Prometheus refuses for the whole scrape: the
	// first is kept (TestFamilyNamesAreUnique keeps every option's names apart).
	kept := mfs[:0]
	for _, mf := range mfs {
		if len(kept) > 0 && mf.GetName() == kept[len(kept)-1].GetName() {
			b.fail(fmt.Errorf("%s is written by two parts of the collector", mf.GetName()))
			continue
		}
		kept = append(kept, mf)
	}
	return kept, errors.Join(b.errs...)
}

// values returns the label values of a family's series, in the order of its desc's labels.
func (b *batch) values(f *family, s series) []string {
	return b.rankings[f.desc.layout].sets[s.set].values
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
