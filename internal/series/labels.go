package series

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"
)

// labelSet is one set of label values: what every family of one process (or workload) shares, in this gathering
// and the next ones. It is never changed once made.
type labelSet struct {
	layout *layout
	values []string // as written, in the order of layout.labels: what the set is looked up by
	shown  []string // as served: values, with those over the engine's cap truncated; the same slice when none is
	text   string   // {name="value",...} of shown in exposition order, as expfmt writes it; empty without labels
	hash   uint64   // of values, with its engine's seed
	pairs  atomic.Pointer[[]*dto.LabelPair]
}

// newLabelSet builds a label set, and its text for the exposition: the text is what every body writes, while the
// label pairs are made only for a caller that asks for client_model's families. Values longer than maxValue bytes
// are served truncated.
func newLabelSet(l *layout, values []string, hash uint64, maxValue int) *labelSet {
	s := &labelSet{layout: l, values: slices.Clone(values), hash: hash}
	s.shown = s.values
	for i, v := range values {
		if len(v) > maxValue {
			if &s.shown[0] == &s.values[0] {
				s.shown = slices.Clone(values)
			}
			s.shown[i] = truncate(v, maxValue)
		}
	}
	if slices.ContainsFunc(s.shown, needsEscaping) {
		s.text = expfmtLabels(s.labelPairs())
		return s
	}
	if len(values) == 0 {
		return s
	}
	size := 1
	for i, v := range s.shown {
		size += len(l.labels[i]) + len(v) + 4 // of the values as served: a long one would leave its length unused here
	}
	var b strings.Builder
	b.Grow(size)
	for i, j := range l.order {
		if i == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(l.labels[j])
		b.WriteString(`="`)
		b.WriteString(s.shown[j])
		b.WriteByte('"')
	}
	b.WriteByte('}')
	s.text = b.String()
	return s
}

// truncationMark ends a truncated label value, with the first 8 bytes of the SHA-256 of the whole value in hex.
const truncationMark = "…[truncated %x]"

// truncate cuts v, longer than limit bytes, to at most limit bytes that end with the truncation mark, at a character
// boundary (v is UTF-8). The digest in the mark keeps apart values that differ only past the cut, and cuts a value
// the same way in every gathering and every run of the exporter, so that its series keeps its identity.
func truncate(v string, limit int) string {
	sum := digest(v)
	mark := fmt.Sprintf(truncationMark, sum[:8])
	cut := max(limit-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return v[:cut] + mark
}

// digest is the SHA-256 of v, read through a small buffer rather than a copy of v, which may be megabytes.
func digest(v string) [sha256.Size]byte {
	h := sha256.New()
	var buf [4096]byte
	for len(v) > 0 {
		n := copy(buf[:], v)
		h.Write(buf[:n])
		v = v[n:]
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// needsEscaping reports whether the text format escapes something in a label value.
func needsEscaping(v string) bool { return strings.ContainsAny(v, "\\\"\n") }

// labelPairs are the set's label pairs in exposition order, made on first use and then shared.
func (s *labelSet) labelPairs() []*dto.LabelPair {
	if p := s.pairs.Load(); p != nil {
		return *p
	}
	l := s.layout
	pairs := make([]dto.LabelPair, len(s.values))
	ptrs := make([]*dto.LabelPair, len(s.values))
	for i, j := range l.order {
		pairs[i].Name, pairs[i].Value = &l.labels[j], &s.shown[j]
		ptrs[i] = &pairs[i]
	}
	if !s.pairs.CompareAndSwap(nil, &ptrs) {
		return *s.pairs.Load() // made meanwhile by another gathering: the same pairs for every family
	}
	return ptrs
}

// String writes the label set as the exposition would, for errors.
func (s *labelSet) String() string {
	var sb strings.Builder
	sb.WriteByte('{')
	for i, j := range s.layout.order {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, "%s=%q", s.layout.labels[j], s.shown[j])
	}
	sb.WriteByte('}')
	return sb.String()
}

// The text of a family's header and of a label set that takes escaping are expfmt's: one series is written with
// expfmt, and cut.

// header returns the "# HELP" and "# TYPE" lines of a family.
func header(name, help string, typ dto.MetricType) string {
	text := expfmtLine(name, &help, typ, nil)
	return text[:strings.LastIndexByte(text[:len(text)-1], '\n')+1]
}

// expfmtLabels returns a label set's text as expfmt writes it.
func expfmtLabels(pairs []*dto.LabelPair) string {
	const name = "x"
	text := "\n" + expfmtLine(name, nil, dto.MetricType_UNTYPED, pairs)
	line := text[strings.LastIndexByte(text[:len(text)-1], '\n')+1:]
	return line[len(name) : len(line)-len(" 0\n")]
}

// expfmtLine writes one family of one series of value 0 with expfmt.
func expfmtLine(name string, help *string, typ dto.MetricType, pairs []*dto.LabelPair) string {
	m := &dto.Metric{Label: pairs}
	switch typ {
	case dto.MetricType_GAUGE:
		m.Gauge = &dto.Gauge{Value: proto.Float64(0)}
	case dto.MetricType_COUNTER:
		m.Counter = &dto.Counter{Value: proto.Float64(0)}
	default:
		m.Untyped = &dto.Untyped{Value: proto.Float64(0)}
	}
	mf := &dto.MetricFamily{Name: &name, Help: help, Type: typ.Enum(), Metric: []*dto.Metric{m}}
	var b strings.Builder
	if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
		// Names and label names are valid and label values UTF-8 before anything is written.
		panic(fmt.Sprintf("series: expfmt refused %s: %v", name, err))
	}
	return b.String()
}

// layoutSets are the label sets of one layout in a batch. A gathering writes its sets in much the order the last
// one did (the same processes, GPU by GPU), so the set expected next is the one after the last set taken from the
// last gathering: it is compared, not looked up. Only a set that is not the one expected is looked up by hash, in an
// index of the last gathering's sets and this one's that is made on the first such set.
type layoutSets struct {
	*ranking          // this gathering's sets, in the order first written
	prev     *ranking // the last gathering's, read only; nil on the first
	next     int      // the index in prev.sets of the set expected next
	taken    []int32  // by index in prev.sets: 1 + the set's index in this gathering, 0 while not taken
	index    labelSets
}

// setRef is a label set and its index among its layout's sets in this gathering (ranking.sets).
type setRef struct {
	set   *labelSet
	index int32
}

// expected takes the set expected next if it has the values.
func (ls *layoutSets) expected(values []string) (setRef, bool) {
	if ls.prev == nil || ls.next >= len(ls.prev.sets) || !slices.Equal(ls.prev.sets[ls.next].values, values) {
		return setRef{}, false
	}
	ls.next++
	return ls.take(ls.next - 1), true
}

// take takes the last gathering's set at i into this gathering, once.
func (ls *layoutSets) take(i int) setRef {
	if ls.taken == nil {
		ls.taken = make([]int32, len(ls.prev.sets))
	}
	if t := ls.taken[i]; t > 0 {
		return setRef{ls.prev.sets[i], t - 1}
	}
	ref := setRef{ls.prev.sets[i], int32(len(ls.sets))}
	ls.sets = append(ls.sets, ref.set)
	ls.taken[i] = ref.index + 1
	return ref
}

// find looks the values up among the sets of the last gathering and this one.
func (ls *layoutSets) find(h uint64, values []string) (setRef, bool) {
	if ls.index == nil {
		// Until now every set was the one expected, a set of the last gathering: the index needs only those.
		ls.index = make(labelSets)
		if ls.prev != nil {
			for i, s := range ls.prev.sets {
				ls.index.add(s.hash, indexed{s, int32(i)})
			}
		}
	}
	e, ok := ls.index.find(h, values)
	switch {
	case !ok:
		return setRef{}, false
	case e.from < 0:
		return setRef{e.set, -e.from - 1}, true
	}
	ls.next = int(e.from) + 1 // the sets after it are likely next
	return ls.take(int(e.from)), true
}

// add adds a set new in this gathering.
func (ls *layoutSets) add(s *labelSet) setRef {
	ref := setRef{s, int32(len(ls.sets))}
	ls.sets = append(ls.sets, s)
	ls.index.add(s.hash, indexed{s, -ref.index - 1})
	return ref
}

// labelSets index label sets by the hash of their values.
type labelSets map[uint64]indexes

// indexes are the sets of one hash. A second one needs a 64-bit collision, so the first is kept out of a slice,
// which would cost an allocation per set.
type indexes struct {
	first indexed
	more  []indexed
}

// indexed is a set of the last gathering (from is its index there) or of this one (from is -1 - its index here).
type indexed struct {
	set  *labelSet
	from int32
}

func (s labelSets) find(h uint64, values []string) (indexed, bool) {
	refs, ok := s[h]
	if !ok {
		return indexed{}, false
	}
	is := func(r indexed) bool { return slices.Equal(r.set.values, values) }
	if is(refs.first) {
		return refs.first, true
	}
	if i := slices.IndexFunc(refs.more, is); i >= 0 {
		return refs.more[i], true
	}
	return indexed{}, false
}

func (s labelSets) add(h uint64, r indexed) {
	if refs, ok := s[h]; ok {
		refs.more = append(refs.more, r)
		s[h] = refs
	} else {
		s[h] = indexes{first: r}
	}
}
