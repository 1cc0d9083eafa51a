package series

import (
	"bytes"
	"math"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

var textFormats = []expfmt.Format{
	expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.UnderscoreEscaping),
	expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.NoEscaping),
	expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.ValueEncodingEscaping),
}

type textFamily struct {
	name, help string
	counter    bool
	labels     []string
	series     []textSeries
}

type textSeries struct {
	v      float64
	values []string
}

// checkText writes families through a batch, and through client_golang's registry of NewConstMetric series and
// expfmt: the bodies must be the same bytes in every text format, the batch's client_model families must be the
// registry's, and what the registry refuses the batch must refuse.
func checkText(t *testing.T, families []textFamily) {
	t.Helper()
	var descs []*Desc
	reg := prometheus.NewPedanticRegistry()
	var regErr error
	for _, f := range families {
		descs = append(descs, NewDesc(f.name, f.help, f.labels))
		typ := prometheus.GaugeValue
		if f.counter {
			typ = prometheus.CounterValue
		}
		c := constCollector{desc: prometheus.NewDesc(f.name, f.help, f.labels, nil)}
		for _, s := range f.series {
			c.series = append(c.series, constSeries{typ, s.v, s.values})
		}
		if err := reg.Register(c); err != nil {
			regErr = err
		}
	}
	b := NewEngine(descs...).Batch()
	for i, f := range families {
		for _, s := range f.series {
			if f.counter {
				b.Counter(descs[i], s.v, s.values...)
			} else {
				b.Gauge(descs[i], s.v, s.values...)
			}
		}
	}
	g, err := b.Gather(nil)
	mfs, gatherErr := reg.Gather()
	if regErr == nil {
		regErr = gatherErr
	}
	if (err == nil) != (regErr == nil) {
		t.Fatalf("error %v, the registry's %v", err, regErr)
	}
	if got, want := testkit.ExpositionText(t, g.Families()), testkit.ExpositionText(t, mfs); got != want {
		t.Fatalf("families:\n%s\nthe registry's:\n%s", got, want)
	}
	for _, format := range textFormats {
		var got, want bytes.Buffer
		if err := g.WriteText(&got, format); err != nil {
			t.Fatal(err)
		}
		enc := expfmt.NewEncoder(&want, format)
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		if got.String() != want.String() {
			t.Fatalf("%s:\n%s\nexpfmt wrote:\n%s", format, got.String(), want.String())
		}
	}
}

func TestTextIsExpfmt(t *testing.T) {
	labels := []string{"gpu", "pod", "pid"}
	for name, families := range map[string][]textFamily{
		"plain and shared label sets": {
			{name: "a_bytes", help: "Help.", labels: labels, series: []textSeries{{1, []string{"0", "p", ""}}, {2.5, []string{"1", "p", "2"}}}},
			{name: "b_total", help: "Help.", counter: true, labels: labels, series: []textSeries{{1e21, []string{"0", "p", ""}}}},
			{name: "c", series: []textSeries{{-1, nil}}},
		},
		"values": {{name: "v", help: "h", labels: []string{"i"}, series: []textSeries{{0, []string{"a"}}, {1, []string{"b"}},
			{-1, []string{"c"}}, {math.NaN(), []string{"d"}}, {math.Inf(1), []string{"e"}}, {math.Inf(-1), []string{"f"}},
			{0.1, []string{"g"}}, {math.Copysign(0, -1), []string{"h"}}, {1e-300, []string{"i"}}, {123456789012, []string{"j"}},
			{268435456, []string{"k"}}, {math.MaxFloat64, []string{"l"}}}}},
		"escaped label values": {{name: "e", help: "h", labels: []string{"a", "b"}, series: []textSeries{
			{1, []string{`quote"`, "x"}}, {1, []string{`back\slash`, "x"}}, {1, []string{"line\nfeed", "x"}},
			{1, []string{"tab\tand ünïcode", "x"}}, {1, []string{"", `"\` + "\n"}}}}},
		"escaped help":    {{name: "e", help: "back\\slash and\nline feed", series: []textSeries{{1, nil}}}},
		"empty help":      {{name: "e", series: []textSeries{{1, nil}}}},
		"repeated series": {{name: "r", help: "h", labels: []string{"a"}, series: []textSeries{{1, []string{"x"}}, {2, []string{"x"}}}}},
		"invalid UTF-8":   {{name: "u", help: "h", labels: []string{"a"}, series: []textSeries{{1, []string{"\xff"}}, {2, []string{"ok"}}}}},
		"label values in the wrong number": {{name: "n", help: "h", labels: []string{"a"},
			series: []textSeries{{1, nil}, {2, []string{"x", "y"}}, {3, []string{"ok"}}}}},
	} {
		t.Run(name, func(t *testing.T) { checkText(t, families) })
	}
}

// FuzzTextIsExpfmt writes two families that share a label set, of any name, help, label name and values.
func FuzzTextIsExpfmt(f *testing.F) {
	f.Add("gpu_x", "help", uint8(0), "pod", "a", "b", "c", 1.5)
	f.Add("gpu_y", "h\\", uint8(1), "b", "\"", "\n", "\\", math.Inf(1))
	f.Add("gpu_z", "h\n", uint8(2), "gpu", "", "", "\xff", math.NaN())
	f.Fuzz(func(t *testing.T, name, help string, typ uint8, label, v1, v2, v3 string, value float64) {
		labels := []string{"gpu", label}
		if !model.LegacyValidation.IsValidMetricName(name) || !model.LegacyValidation.IsValidLabelName(label) {
			// Names that need quoting are not written at all: client_golang takes them, the batch refuses them.
			b := NewEngine(NewDesc(name, help, labels)).Batch()
			b.Gauge(b.e.descs[0], value, "0", v1)
			if g, err := b.Gather(nil); err == nil || !g.Empty() {
				t.Fatalf("%q{%q} was not refused", name, label)
			}
			return
		}
		series := func(v float64, values ...string) []textSeries {
			var s []textSeries
			for _, x := range values {
				s = append(s, textSeries{v, []string{"0", x}})
			}
			return s
		}
		checkText(t, []textFamily{
			{name: name, help: help, counter: typ%2 == 1, labels: labels, series: series(value, v1, v2, v3)},
			{name: name + "_2", help: help, counter: typ%3 == 1, labels: labels, series: series(-value, v3)},
		})
	})
}
