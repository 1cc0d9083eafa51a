package collector

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/scrape"
)

// A series is exactly what prometheus.NewConstMetric builds: label order, constant labels, value and type.
func TestSeriesIsAConstMetric(t *testing.T) {
	desc := prometheus.NewDesc("gpu_x", "x", []string{"uuid", "gpu", "b_label"}, prometheus.Labels{"a_const": "0", "zz": "k"})
	for _, tc := range []struct {
		t      prometheus.ValueType
		labels []string
	}{
		{prometheus.GaugeValue, []string{"GPU-1", "0", ""}},
		{prometheus.CounterValue, []string{"", "", "x"}},
		{prometheus.GaugeValue, []string{"0", "0", "0"}},
	} {
		want, err := prometheus.NewConstMetric(desc, tc.t, 42, tc.labels...)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := newSeries(desc, tc.t, 42, tc.labels)
		if !ok {
			t.Fatalf("%v: no series", tc.labels)
		}
		var w, g dto.Metric
		if err := want.Write(&w); err != nil {
			t.Fatal(err)
		}
		if err := got.Write(&g); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&w, &g) {
			t.Errorf("%v:\n got %v\nwant %v", tc.labels, &g, &w)
		}
	}
}

// What NewConstMetric refuses is left to it, so that the error reaches the scrape as an invalid series.
func TestSeriesRefusesWhatConstMetricRefuses(t *testing.T) {
	desc := prometheus.NewDesc("gpu_x", "x", []string{"a", "b"}, nil)
	if _, ok := newSeries(desc, prometheus.GaugeValue, 1, []string{"ok", "\xff"}); ok {
		t.Error("a label value that is not UTF-8 was accepted")
	}
	for _, labels := range [][]string{{"one"}, {"1", "2", "3"}} {
		if _, ok := newSeries(desc, prometheus.GaugeValue, 1, labels); ok {
			t.Errorf("%d label values for 2 labels were accepted", len(labels))
		}
	}
	ch := make(chan prometheus.Metric, 1)
	constMetric(ch, desc, prometheus.GaugeValue, 1, []string{"ok", "\xff"})
	var m dto.Metric
	if err := (<-ch).Write(&m); err == nil {
		t.Error("invalid UTF-8: the series is not reported as invalid")
	}
}

// Gatherings at the same time give what one alone gives: the shared label pairs are never mixed up.
func TestConcurrentGatheringsAgree(t *testing.T) {
	snap, owners := benchNode()
	reg := prometheus.NewRegistry()
	reg.MustRegister(New(scrape.New(fixedSource{snap}, owners, time.Minute, slog.New(slog.DiscardHandler)), Options{Processes: true}))
	text := func() string {
		mfs, err := reg.Gather()
		if err != nil {
			t.Error(err)
			return ""
		}
		var b strings.Builder
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "gpu_pod_exporter_") {
				continue // self-metrics: each reading's own duration
			}
			if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
				t.Error(err)
			}
		}
		return b.String()
	}
	want := text()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if got := text(); got != want {
				t.Error("a concurrent gathering differs from a lone one")
			}
		})
	}
	wg.Wait()
}
