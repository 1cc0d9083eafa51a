package exposition

import (
	"bytes"
	"math"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
)

var textFormats = []expfmt.Format{
	expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.UnderscoreEscaping),
	expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.NoEscaping),
	expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.ValueEncodingEscaping),
}

// checkText encodes mfs with textEncoder and with expfmt's encoder: the bodies must be the same bytes, and where
// expfmt refuses a family, so must textEncoder.
func checkText(t *testing.T, mfs []*dto.MetricFamily) {
	t.Helper()
	for _, format := range textFormats {
		var got, want bytes.Buffer
		enc, ref := newTextEncoder(), expfmt.NewEncoder(&want, format)
		enc.reset(&got, format)
		for _, mf := range mfs {
			gotErr, wantErr := enc.Encode(mf), ref.Encode(mf)
			if (gotErr == nil) != (wantErr == nil) {
				t.Fatalf("%s: %v: error %v, expfmt's %v", format, mf, gotErr, wantErr)
			}
		}
		if err := enc.Close(); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Fatalf("%s:\n%s\nexpfmt wrote:\n%s", format, got.String(), want.String())
		}
	}
}

func pair(name, value string) *dto.LabelPair {
	return &dto.LabelPair{Name: proto.String(name), Value: proto.String(value)}
}

func family(name, help string, typ dto.MetricType, metrics ...*dto.Metric) *dto.MetricFamily {
	mf := &dto.MetricFamily{Name: proto.String(name), Type: typ.Enum(), Metric: metrics}
	if help != "" {
		mf.Help = proto.String(help)
	}
	return mf
}

func gauge(v float64, labels ...*dto.LabelPair) *dto.Metric {
	return &dto.Metric{Label: labels, Gauge: &dto.Gauge{Value: proto.Float64(v)}}
}

func TestTextIsExpfmt(t *testing.T) {
	shared := []*dto.LabelPair{pair("gpu", "0"), pair("pod", "p"), pair("pid", "")}
	for name, mfs := range map[string][]*dto.MetricFamily{
		"plain and shared label sets": {
			family("a_bytes", "Help.", dto.MetricType_GAUGE, gauge(1, shared...), gauge(2.5, pair("gpu", "1"))),
			family("b_total", "Help.", dto.MetricType_COUNTER, &dto.Metric{Label: shared, Counter: &dto.Counter{Value: proto.Float64(1e21)}}),
			family("c", "", dto.MetricType_UNTYPED, &dto.Metric{Untyped: &dto.Untyped{Value: proto.Float64(-1)}}),
		},
		"values": {family("v", "h", dto.MetricType_GAUGE, gauge(0), gauge(1), gauge(-1), gauge(math.NaN()), gauge(math.Inf(1)),
			gauge(math.Inf(-1)), gauge(0.1), gauge(-0.0), gauge(1e-300), gauge(123456789012), gauge(math.MaxFloat64))},
		"escaped label values": {family("e", "h", dto.MetricType_GAUGE, gauge(1, pair("a", `quote"`)), gauge(1, pair("a", `back\slash`)),
			gauge(1, pair("a", "line\nfeed")), gauge(1, pair("a", "tab\tand ünïcode")))},
		"escaped help": {family("e", "back\\slash and\nline feed", dto.MetricType_GAUGE, gauge(1))},
		"names that need escaping": {
			family("a.b", "h", dto.MetricType_GAUGE, gauge(1)),
			family("c", "h", dto.MetricType_GAUGE, gauge(1, pair("d.e", "x"))),
		},
		"reserved label names": {family("r", "h", dto.MetricType_GAUGE, gauge(1, pair("__name__", "x.y"), pair("a", "b")))},
		"timestamps":           {family("t", "h", dto.MetricType_GAUGE, &dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(1)}, TimestampMs: proto.Int64(5)})},
		"summaries and histograms": {
			family("s", "h", dto.MetricType_SUMMARY, &dto.Metric{Summary: &dto.Summary{SampleCount: proto.Uint64(1), SampleSum: proto.Float64(2)}}),
			family("h", "h", dto.MetricType_HISTOGRAM, &dto.Metric{Histogram: &dto.Histogram{SampleCount: proto.Uint64(1), SampleSum: proto.Float64(2)}}),
		},
		"refused": {
			family("no_metrics", "h", dto.MetricType_GAUGE),
			family("wrong_type", "h", dto.MetricType_COUNTER, gauge(1)),
			family("", "h", dto.MetricType_GAUGE, gauge(1)),
		},
	} {
		t.Run(name, func(t *testing.T) { checkText(t, mfs) })
	}
}

func FuzzTextIsExpfmt(f *testing.F) {
	f.Add("gpu_x", "help", uint8(0), "pod", "a", "b", "c", 1.5, false)
	f.Add("gpu_y", "h\\", uint8(1), "a.b", "\"", "\n", "\\", math.Inf(1), true)
	f.Fuzz(func(t *testing.T, name, help string, typ uint8, label, v1, v2, v3 string, value float64, timestamp bool) {
		metric := func(v string) *dto.Metric {
			m := &dto.Metric{Label: []*dto.LabelPair{pair("gpu", "0"), pair(label, v)}}
			switch typ % 3 {
			case 0:
				m.Gauge = &dto.Gauge{Value: proto.Float64(value)}
			case 1:
				m.Counter = &dto.Counter{Value: proto.Float64(value)}
			default:
				m.Untyped = &dto.Untyped{Value: proto.Float64(value)}
			}
			if timestamp {
				m.TimestampMs = proto.Int64(int64(value))
			}
			return m
		}
		types := []dto.MetricType{dto.MetricType_GAUGE, dto.MetricType_COUNTER, dto.MetricType_UNTYPED}
		shared := metric(v3)
		checkText(t, []*dto.MetricFamily{
			family(name, help, types[typ%3], metric(v1), metric(v2), shared),
			family(name+"_2", help, types[(typ/3)%3], shared),
		})
	})
}

// The label texts of one body serve the next while their pairs are the same, are written anew when a pair has
// changed, and are forgotten when the body does not use them.
func TestLabelTextsAcrossBodies(t *testing.T) {
	format := textFormats[0]
	enc := newTextEncoder()
	kept := []*dto.LabelPair{pair("gpu", "0"), pair("pod", "a")}
	gone := []*dto.LabelPair{pair("gpu", "1")}
	body := func(mfs ...*dto.MetricFamily) string {
		t.Helper()
		var got, want bytes.Buffer
		ref := expfmt.NewEncoder(&want, format)
		enc.reset(&got, format)
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
			if err := ref.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		if err := enc.Close(); err != nil {
			t.Fatal(err)
		}
		enc.labels.sweep()
		if got.String() != want.String() {
			t.Fatalf("body:\n%s\nexpfmt wrote:\n%s", got.String(), want.String())
		}
		return got.String()
	}
	body(family("a", "h", dto.MetricType_GAUGE, gauge(1, kept...), gauge(2, gone...)))
	if len(enc.labels) != 2 {
		t.Fatalf("%d label texts kept, want 2", len(enc.labels))
	}
	body(family("a", "h", dto.MetricType_GAUGE, gauge(1, kept...)))
	if len(enc.labels) != 1 {
		t.Errorf("%d label texts kept after a body that used one, want 1", len(enc.labels))
	}
	kept[1].Value = proto.String("b") // repointed, in a pair of the same slice
	if got := body(family("a", "h", dto.MetricType_GAUGE, gauge(1, kept...))); !strings.Contains(got, `pod="b"`) {
		t.Errorf("a changed label set was written from its old text:\n%s", got)
	}
	kept[1] = pair("pod", "c") // another pair in the same slot
	if got := body(family("a", "h", dto.MetricType_GAUGE, gauge(1, kept...))); !strings.Contains(got, `pod="c"`) {
		t.Errorf("a changed label set was written from its old text:\n%s", got)
	}
}
