package series

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Gathering is the families of one gathering, lent from Batch.Gather until Release (see the package's lifetime
// contract).
type Gathering struct {
	e     *Engine // nil for a gathering made elsewhere (FromFamilies)
	own   []gathered
	order []entry // every family, by name

	selfFamilies []*dto.MetricFamily // those of order gathered elsewhere
	mfsOnce      sync.Once
	mfs          []*dto.MetricFamily // Families, once asked for
	releaseOnce  sync.Once
	onRelease    func()
}

// gathered is one of the batch's families.
type gathered struct {
	desc    *Desc
	typ     dto.MetricType
	samples []sample    // sorted, each label set once
	sets    []*labelSet // the label sets of its layout in the gathering
}

// entry is one family of the gathering: one of the batch's (own) or one gathered elsewhere (self).
type entry struct {
	own  int // index into Gathering.own, or -1
	self *dto.MetricFamily
}

// FromFamilies is a gathering of families gathered elsewhere, sorted by name: a registry's. It is written with
// expfmt, and releasing it does nothing.
func FromFamilies(mfs []*dto.MetricFamily) *Gathering {
	g := &Gathering{}
	g.merge(mfs, nil)
	return g
}

// merge lists the batch's families and self by name.
func (g *Gathering) merge(self []*dto.MetricFamily, errs *[]error) {
	g.selfFamilies = self
	g.order = make([]entry, 0, len(g.own)+len(self))
	own := 0
	for own < len(g.own) || len(self) > 0 {
		switch {
		case len(self) == 0 || own < len(g.own) && g.own[own].desc.name < self[0].GetName():
			g.order = append(g.order, entry{own: own})
			own++
		case own == len(g.own) || self[0].GetName() < g.own[own].desc.name:
			g.order = append(g.order, entry{own: -1, self: self[0]})
			self = self[1:]
		default:
			*errs = append(*errs, fmt.Errorf("%s is both a GPU family and a self-metric", self[0].GetName()))
			self = self[1:]
		}
	}
}

// Empty reports whether the gathering has no family.
func (g *Gathering) Empty() bool { return g == nil || len(g.order) == 0 }

// OnRelease sets a function that Release calls, for a lender that must know when its gathering is free.
func (g *Gathering) OnRelease(f func()) { g.onRelease = f }

// Release hands the gathering back: its memory is written over by a later gathering. The caller must not use it,
// nor what it gave, again. Releasing twice does nothing.
func (g *Gathering) Release() {
	if g == nil {
		return
	}
	g.releaseOnce.Do(func() {
		if g.onRelease != nil {
			g.onRelease()
		}
		if g.e == nil {
			return
		}
		spare := make([][]sample, len(g.e.descs))
		for _, f := range g.own {
			spare[f.desc.index] = f.samples[:0]
		}
		g.e.mu.Lock()
		g.e.spare = spare
		g.e.mu.Unlock()
	})
}

// Families returns the gathering as client_model's families, sorted by name, for what is not the text format (the
// protocol buffer format, a filtered scrape, prometheus.Gatherer). They are made on first use and are the
// gathering's: they must not be changed, nor used after Release.
func (g *Gathering) Families() []*dto.MetricFamily {
	if g == nil {
		return nil
	}
	g.mfsOnce.Do(g.makeFamilies)
	return g.mfs
}

var (
	gaugeType   = dto.MetricType_GAUGE
	counterType = dto.MetricType_COUNTER
)

func (g *Gathering) makeFamilies() {
	n, gauges, counters := 0, 0, 0
	for _, f := range g.own {
		n += len(f.samples)
		if f.typ == dto.MetricType_GAUGE {
			gauges += len(f.samples)
		} else {
			counters += len(f.samples)
		}
	}
	// Three allocations for every series, rather than three per series.
	metrics, gs, cs := make([]dto.Metric, n), make([]dto.Gauge, gauges), make([]dto.Counter, counters)
	ptrs := make([]*dto.Metric, n)
	mfs := make([]*dto.MetricFamily, 0, len(g.order))
	for _, e := range g.order {
		if e.own < 0 {
			mfs = append(mfs, e.self)
			continue
		}
		f := &g.own[e.own]
		mf := &dto.MetricFamily{Name: &f.desc.name, Help: &f.desc.help, Type: &gaugeType, Metric: ptrs[:len(f.samples):len(f.samples)]}
		if f.typ == dto.MetricType_COUNTER {
			mf.Type = &counterType
		}
		for i := range f.samples {
			s := &f.samples[i]
			m := &metrics[i]
			m.Label = f.sets[s.set].labelPairs()
			if f.typ == dto.MetricType_GAUGE {
				gs[0].Value = &s.value
				m.Gauge, gs = &gs[0], gs[1:]
			} else {
				cs[0].Value = &s.value
				m.Counter, cs = &cs[0], cs[1:]
			}
			mf.Metric[i] = m
		}
		metrics, ptrs = metrics[len(f.samples):], ptrs[len(f.samples):]
		mfs = append(mfs, mf)
	}
	g.mfs = mfs
}

// Len is the number of the gathering's families; Index and Write count them in the exposition's order, by name.
func (g *Gathering) Len() int {
	if g == nil {
		return 0
	}
	return len(g.order)
}

// Index is the place of the family named name in the exposition's order, and false if the gathering has none.
func (g *Gathering) Index(name string) (int, bool) {
	if g == nil {
		return 0, false
	}
	return slices.BinarySearchFunc(g.order, name, func(e entry, name string) int { return strings.Compare(g.nameOf(e), name) })
}

func (g *Gathering) nameOf(e entry) string {
	if e.own < 0 {
		return e.self.GetName()
	}
	return g.own[e.own].desc.name
}

// Write writes the gathering in format, and returns where each family ends in what it wrote, in the exposition's
// order; what follows the last is the format's end (OpenMetrics' "# EOF"). Each family is written whole and on its
// own, so that the bytes of some families and the end are what WriteSome writes of them: a body filtered by name
// may be cut from the whole one. The text format is written from the gathering's own series (WriteText), the
// others with expfmt from Families.
func (g *Gathering) Write(w io.Writer, format expfmt.Format) (ends []int, err error) {
	ends = make([]int, 0, g.Len())
	return ends, g.write(w, format, nil, &ends)
}

// WriteSome writes the families at the places picked, in increasing order, as Write writes them.
func (g *Gathering) WriteSome(w io.Writer, format expfmt.Format, picked []int) error {
	if picked == nil {
		picked = []int{}
	}
	return g.write(w, format, picked, nil)
}

// write writes the families picked (every one for nil) and appends, to ends unless nil, where each ends.
func (g *Gathering) write(w io.Writer, format expfmt.Format, picked []int, ends *[]int) error {
	cw := &countingWriter{w: w}
	if format.FormatType() == expfmt.TypeTextPlain {
		return g.writeText(cw, format, picked, ends)
	}
	mfs := g.Families()
	enc := expfmt.NewEncoder(cw, Unescaped(format, mfs))
	for i, mf := range mfs {
		if picked != nil {
			if len(picked) == 0 || picked[0] != i {
				continue
			}
			picked = picked[1:]
		}
		if err := enc.Encode(mf); err != nil {
			return fmt.Errorf("encoding %s: %w", mf.GetName(), err)
		}
		if ends != nil {
			*ends = append(*ends, cw.n)
		}
	}
	if c, ok := enc.(expfmt.Closer); ok {
		return c.Close()
	}
	return nil
}

// countingWriter counts what it writes.
type countingWriter struct {
	w io.Writer
	n int
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += n
	return n, err
}

// WriteText writes the gathering in the text format: its own families from their label sets' text, byte for byte
// as expfmt writes them, and those gathered elsewhere with expfmt, in format.
func (g *Gathering) WriteText(w io.Writer, format expfmt.Format) error {
	return g.writeText(&countingWriter{w: w}, format, nil, nil)
}

// writeText is WriteText of the families picked (every one for nil), which appends to ends, unless nil, where each
// family ends.
func (g *Gathering) writeText(w *countingWriter, format expfmt.Format, picked []int, ends *[]int) error {
	bw := bufio.NewWriterSize(w, 16<<10)
	var self expfmt.Encoder
	var num []byte
	for i, e := range g.order {
		if picked != nil {
			if len(picked) == 0 || picked[0] != i {
				continue
			}
			picked = picked[1:]
		}
		if e.own < 0 {
			if self == nil {
				self = expfmt.NewEncoder(w, Unescaped(format, g.selfFamilies))
			}
			if err := bw.Flush(); err != nil {
				return err
			}
			if err := self.Encode(e.self); err != nil {
				return fmt.Errorf("encoding %s: %w", e.self.GetName(), err)
			}
		} else {
			f := &g.own[e.own]
			name := f.desc.name
			if f.typ == dto.MetricType_COUNTER {
				bw.WriteString(f.desc.header[1])
			} else {
				bw.WriteString(f.desc.header[0])
			}
			for _, s := range f.samples {
				bw.WriteString(name)
				bw.WriteString(f.sets[s.set].text)
				bw.WriteByte(' ')
				num = appendFloat(num[:0], s.value)
				bw.Write(num)
				bw.WriteByte('\n')
			}
		}
		if ends != nil {
			*ends = append(*ends, w.n+bw.Buffered())
		}
	}
	if c, ok := self.(expfmt.Closer); ok {
		if err := c.Close(); err != nil {
			return err
		}
	}
	return bw.Flush() // bufio keeps the first error of any write above
}

// appendFloat writes a sample value as expfmt does.
func appendFloat(b []byte, f float64) []byte {
	switch {
	case f == 1:
		return append(b, '1')
	case f == 0:
		return append(b, '0')
	case f == -1:
		return append(b, "-1"...)
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, +1):
		return append(b, "+Inf"...)
	case math.IsInf(f, -1):
		return append(b, "-Inf"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

// Unescaped returns format without escaping when no name of mfs needs it: escaping changes nothing in names that
// are valid without it, but expfmt checks and copies every label of every series to know that. A reserved label
// name counts as needing it (escaping also escapes __name__'s value). A registry of described collectors gives
// every series of a family the same label names, so the first series stands for all.
func Unescaped(format expfmt.Format, mfs []*dto.MetricFamily) expfmt.Format {
	if format.ToEscapingScheme() == model.NoEscaping {
		return format
	}
	for _, mf := range mfs {
		if !model.LegacyValidation.IsValidMetricName(mf.GetName()) {
			return format
		}
		if len(mf.Metric) == 0 {
			continue
		}
		for _, l := range mf.Metric[0].GetLabel() {
			if !model.LegacyValidation.IsValidLabelName(l.GetName()) || strings.HasPrefix(l.GetName(), model.ReservedLabelPrefix) {
				return format
			}
		}
	}
	return format.WithEscapingScheme(model.NoEscaping)
}
