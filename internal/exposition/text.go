package exposition

import (
	"bufio"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// textEncoder writes the text format byte for byte as expfmt writes it, for the families where that takes no
// escaping: legacy names, and help texts and label values without a backslash, quote or line feed. Everything else
// (and any family it is unsure of) goes to expfmt's own encoder. It exists because a large node's label sets are
// long and repeated: 8 GPUs x 256 processes is 10,600 series of 15 labels, and expfmt validates and escapes every
// label of every series, a third of a scrape's CPU. Here the text of each label set is built once per body and shared
// by every series that has it (the five families of one process), and kept for the next body while its label pairs
// are the same (internal/collector keeps them from one gathering to the next). TestTextIsExpfmt and
// FuzzTextIsExpfmt hold it to expfmt's output.
type textEncoder struct {
	w      *bufio.Writer
	expfmt expfmt.Encoder // writes to the writer under w, so w is flushed before it is used
	labels labelTexts
	texts  []string
	// The label sets of the family before, and their texts: the next family of the same series (process
	// memory, then SM utilization, ...) has the same sets in the same order, and takes their texts without a lookup.
	lastKeys, keys []labelsKey
	lastTexts      []string
	names          []string // label names known to be valid, by position
	num            []byte
}

// labelTexts are the texts of label sets, by the label pairs' slice: the series of one process share it.
type labelTexts map[labelsKey]*labelText

type labelsKey struct {
	first **dto.LabelPair
	n     int
}

type labelText struct {
	text string
	// What the text was written from: the pairs and the strings they point to, so that a slice whose pairs were
	// swapped or repointed since is written anew. A string changed in place through its pointer is not seen: a
	// Gatherer's families must not change once gathered, which the sharing of one gathering between scrapes needs
	// as well.
	pairs []*dto.LabelPair
	from  []*string // each pair's name and value
	used  bool      // by the body being written
}

func (t *labelText) writtenFrom(pairs []*dto.LabelPair) bool {
	for i, p := range pairs {
		if p != t.pairs[i] || p.Name != t.from[2*i] || p.Value != t.from[2*i+1] {
			return false
		}
	}
	return true
}

// sweep forgets the texts that the body just written did not use, so that what is kept is bounded by one body.
func (l labelTexts) sweep() {
	for k, t := range l {
		if !t.used {
			delete(l, k)
		}
		t.used = false
	}
}

// newTextEncoder returns an encoder for reset to start a body with. It keeps the text of the label sets of one body
// for the next, and its buffers.
func newTextEncoder() *textEncoder {
	return &textEncoder{w: bufio.NewWriterSize(nil, 4<<10), labels: make(labelTexts)}
}

// reset starts a body written to w.
func (e *textEncoder) reset(w io.Writer, format expfmt.Format) {
	e.w.Reset(w)
	e.expfmt = expfmt.NewEncoder(w, format)
	e.lastKeys, e.lastTexts = e.lastKeys[:0], e.lastTexts[:0]
}

func (e *textEncoder) Encode(mf *dto.MetricFamily) error {
	if !e.prepare(mf) {
		if err := e.w.Flush(); err != nil {
			return err
		}
		return e.expfmt.Encode(mf)
	}
	w := e.w
	name := mf.GetName()
	if mf.Help != nil {
		w.WriteString("# HELP ")
		w.WriteString(name)
		w.WriteByte(' ')
		w.WriteString(mf.GetHelp())
		w.WriteByte('\n')
	}
	w.WriteString("# TYPE ")
	w.WriteString(name)
	switch mf.GetType() {
	case dto.MetricType_COUNTER:
		w.WriteString(" counter\n")
	case dto.MetricType_GAUGE:
		w.WriteString(" gauge\n")
	default:
		w.WriteString(" untyped\n")
	}
	for i, m := range mf.Metric {
		w.WriteString(name)
		w.WriteString(e.lastTexts[i])
		w.WriteByte(' ')
		v, _ := value(mf.GetType(), m) // prepare has seen that it is there
		e.writeFloat(v)
		if err := w.WriteByte('\n'); err != nil {
			return err // bufio keeps the first error: any write above that failed fails this one
		}
	}
	return nil
}

// Close flushes what is buffered.
func (e *textEncoder) Close() error { return e.w.Flush() }

// prepare reports whether the family can be written without escaping anything, and if so leaves the text of each
// series' label set in e.lastTexts.
func (e *textEncoder) prepare(mf *dto.MetricFamily) bool {
	if len(mf.Metric) == 0 || !model.LegacyValidation.IsValidMetricName(mf.GetName()) || strings.ContainsAny(mf.GetHelp(), "\\\n") {
		return false
	}
	e.texts, e.keys = e.texts[:0], e.keys[:0]
	for i, m := range mf.Metric {
		if m == nil || m.TimestampMs != nil {
			return false
		}
		if _, ok := value(mf.GetType(), m); !ok {
			return false // a summary or histogram, or a series without its family's type
		}
		var key labelsKey
		if len(m.Label) > 0 {
			key = labelsKey{&m.Label[0], len(m.Label)}
		}
		if i < len(e.lastKeys) && key == e.lastKeys[i] {
			e.texts, e.keys = append(e.texts, e.lastTexts[i]), append(e.keys, key)
			continue
		}
		text, ok := e.labelText(m.Label)
		if !ok {
			return false
		}
		e.texts, e.keys = append(e.texts, text), append(e.keys, key)
	}
	e.lastKeys, e.keys = e.keys, e.lastKeys
	e.lastTexts, e.texts = e.texts, e.lastTexts
	return true
}

// value is the value of a gauge, counter or untyped series; false for other types, and for a series without its
// family type's value.
func value(t dto.MetricType, m *dto.Metric) (float64, bool) {
	switch {
	case t == dto.MetricType_COUNTER && m.Counter != nil:
		return m.Counter.GetValue(), true
	case t == dto.MetricType_GAUGE && m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case t == dto.MetricType_UNTYPED && m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// labelText is a label set as the text format writes it, {name="value",...}, or false if it takes escaping.
func (e *textEncoder) labelText(pairs []*dto.LabelPair) (string, bool) {
	if len(pairs) == 0 {
		return "", true
	}
	key := labelsKey{&pairs[0], len(pairs)}
	if t, ok := e.labels[key]; ok && t.writtenFrom(pairs) {
		t.used = true
		return t.text, true
	}
	size := 1
	for i, p := range pairs {
		if p == nil {
			return "", false
		}
		name, value := p.GetName(), p.GetValue()
		// The label sets of a family have the same names, the same strings: each is checked once.
		if i >= len(e.names) || name != e.names[i] {
			// A reserved name goes to expfmt: the escaping schemes escape __name__'s value as a metric name.
			if !model.LegacyValidation.IsValidLabelName(name) || strings.HasPrefix(name, model.ReservedLabelPrefix) {
				return "", false
			}
			if i < len(e.names) {
				e.names[i] = name
			} else {
				e.names = append(e.names, name)
			}
		}
		if strings.IndexByte(value, '\\') >= 0 || strings.IndexByte(value, '"') >= 0 || strings.IndexByte(value, '\n') >= 0 {
			return "", false
		}
		size += len(name) + len(value) + 4
	}
	var b strings.Builder
	b.Grow(size)
	for i, p := range pairs {
		if i == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(p.GetName())
		b.WriteString(`="`)
		b.WriteString(p.GetValue())
		b.WriteByte('"')
	}
	b.WriteByte('}')
	t := &labelText{text: b.String(), pairs: slices.Clone(pairs), from: make([]*string, 0, 2*len(pairs)), used: true}
	for _, p := range pairs {
		t.from = append(t.from, p.Name, p.Value)
	}
	e.labels[key] = t
	return t.text, true
}

// writeFloat writes a sample value as expfmt does.
func (e *textEncoder) writeFloat(f float64) {
	switch {
	case f == 1:
		e.w.WriteByte('1')
	case f == 0:
		e.w.WriteByte('0')
	case f == -1:
		e.w.WriteString("-1")
	case math.IsNaN(f):
		e.w.WriteString("NaN")
	case math.IsInf(f, +1):
		e.w.WriteString("+Inf")
	case math.IsInf(f, -1):
		e.w.WriteString("-Inf")
	default:
		e.num = strconv.AppendFloat(e.num[:0], f, 'g', -1, 64)
		e.w.Write(e.num)
	}
}
