package series

import (
	"bytes"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// In every format, the bytes of some families of what Write writes, and its end, are what WriteSome writes of them,
// for every set of families: a body filtered by name may be cut from the whole one. Index finds each family.
func TestSomeFamiliesAreCutFromTheWhole(t *testing.T) {
	a, c, e := NewDesc("a", "a", []string{"gpu"}), NewDesc("c", "c", nil), NewDesc("e", "e", []string{"pod"})
	b := NewEngine(e, c, a).Batch()
	b.Gauge(a, 1, "0")
	b.Gauge(a, 2, "1")
	b.Counter(c, 3)
	b.Gauge(e, 4, `with "quotes"`)
	other := func(name string) *dto.MetricFamily {
		v := 2.0
		return &dto.MetricFamily{Name: &name, Help: &name, Type: dto.MetricType_GAUGE.Enum(),
			Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: &v}}}}
	}
	g, err := b.Gather([]*dto.MetricFamily{other("b"), other("d")})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"a", "b", "c", "d", "e"}
	for i, name := range names {
		if got, ok := g.Index(name); !ok || got != i {
			t.Errorf("Index(%s) = %d, %v; want %d", name, got, ok, i)
		}
	}
	if _, ok := g.Index("f"); ok {
		t.Error("Index found a family that is not there")
	}
	for _, format := range []expfmt.Format{
		expfmt.NewFormat(expfmt.TypeTextPlain),
		expfmt.NewFormat(expfmt.TypeOpenMetrics),
		expfmt.NewFormat(expfmt.TypeProtoDelim),
		expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.UnderscoreEscaping),
	} {
		var whole bytes.Buffer
		ends, err := g.Write(&whole, format)
		if err != nil || len(ends) != len(names) {
			t.Fatalf("%s: %d ends, %v", format, len(ends), err)
		}
		for set := range 1 << len(names) {
			var picked []int
			var cut []byte
			for i := range names {
				if set&(1<<i) != 0 {
					picked = append(picked, i)
					start := 0
					if i > 0 {
						start = ends[i-1]
					}
					cut = append(cut, whole.Bytes()[start:ends[i]]...)
				}
			}
			cut = append(cut, whole.Bytes()[ends[len(ends)-1]:]...)
			var some bytes.Buffer
			if err := g.WriteSome(&some, format, picked); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(cut, some.Bytes()) {
				t.Errorf("%s, families %v: cut\n%q\nwritten\n%q", format, picked, cut, some.Bytes())
			}
		}
	}
}
