package collector

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/exposition"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// Gatherings at the same time give what one alone gives: the shared label pairs are never mixed up.
func TestConcurrentGatheringsAgree(t *testing.T) {
	snap, owners := benchNode()
	reg := New(reading.New(fixedSource{snap}, owners, time.Minute, slog.New(slog.DiscardHandler)), Options{Processes: true})
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

// The collector's own order is the registry's: Gatherers, which sorts families and series itself and checks every
// series, changes nothing on a large node; and the text written from the collector's own series is expfmt's text of
// what it gathers.
func TestGatherIsNormalized(t *testing.T) {
	snap, owners := benchNode()
	c := New(reading.New(fixedSource{snap}, owners, time.Minute, slog.New(slog.DiscardHandler)), Options{Processes: true})
	strip := func(mfs []*dto.MetricFamily, err error) []*dto.MetricFamily {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return slices.DeleteFunc(mfs, func(mf *dto.MetricFamily) bool { return strings.HasPrefix(mf.GetName(), "gpu_pod_exporter_") })
	}
	got := testkit.ExpositionText(t, strip(c.Gather()))
	want := testkit.ExpositionText(t, strip(prometheus.Gatherers{c}.Gather()))
	if got != want {
		t.Error("the collector's exposition is not in the registry's order")
	}
	if n := strings.Count(got, "\ngpu_process_memory_used_bytes{"); n != 2048 {
		t.Errorf("%d process series, want 2048", n)
	}
	g, err := c.Lend()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	var text strings.Builder
	if err := g.WriteText(&text, expfmt.NewFormat(expfmt.TypeTextPlain)); err != nil {
		t.Fatal(err)
	}
	var gpu []string
	for family := range strings.SplitSeq(text.String(), "# HELP ") {
		if family != "" && !strings.HasPrefix(family, "gpu_pod_exporter_") {
			gpu = append(gpu, "# HELP "+family)
		}
	}
	if strings.Join(gpu, "") != want {
		t.Error("the text written from the collector's series is not expfmt's text of its families")
	}
}

type switchingSource struct{ snap *gpu.Snapshot }

func (s *switchingSource) Name() string { return "switching" }
func (s *switchingSource) Close() error { return nil }
func (s *switchingSource) Snapshot(context.Context) (*gpu.Snapshot, error) {
	return s.snap, nil
}

// A gathering takes the label sets of the last one where they still hold, and writes exactly what a collector that
// never saw the last reading writes: processes that came, went, moved or changed owner included.
func TestLabelSetsCarryOver(t *testing.T) {
	first, owners := benchNode()
	second, _ := benchNode()
	for g := range second.Devices {
		d := &second.Devices[g]
		d.Processes = d.Processes[len(d.Processes)/4:] // a quarter went away
		for i := range 16 {
			pid := uint32(90000 + g*100 + i) // new ones came
			d.Processes = append(d.Processes, gpu.Process{PID: pid, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(1)})
			owners[pid] = attribution.Owner{Name: "new", Identity: attribution.Identity{Namespace: "new", Pod: fmt.Sprint("new-", pid)}}
		}
	}
	second.Devices[0].Processes[0].Type = gpu.ProcessGraphics // a label value changed
	second.Devices[1], second.Devices[2] = second.Devices[2], second.Devices[1]
	second.Devices[1].Index, second.Devices[2].Index = 1, 2 // processes moved GPU

	src := &switchingSource{first}
	logger := slog.New(slog.DiscardHandler)
	c := New(reading.New(src, owners, time.Minute, logger), Options{Processes: true})
	gather := func(c *Gatherer) ([]*dto.MetricFamily, string) {
		t.Helper()
		mfs, err := c.Gather()
		if err != nil {
			t.Fatal(err)
		}
		return mfs, testkit.ExpositionText(t, slices.DeleteFunc(slices.Clone(mfs), func(mf *dto.MetricFamily) bool {
			return strings.HasPrefix(mf.GetName(), "gpu_pod_exporter_")
		}))
	}
	before, _ := gather(c)
	src.snap = second
	after, got := gather(c)
	_, want := gather(New(reading.New(&switchingSource{second}, owners, time.Minute, logger), Options{Processes: true}))
	if n := strings.Count(got, "\ngpu_process_memory_used_bytes{"); n != 8*(192+16) {
		t.Errorf("%d process series, want %d", n, 8*(192+16))
	}
	if got != want {
		t.Error("a gathering after another differs from a first gathering of the same reading")
	}
	if _, again := gather(c); again != want { // the same label sets again: their ranks are taken too
		t.Error("a gathering of the same reading again differs from a first gathering")
	}
	pairs := func(mfs []*dto.MetricFamily) map[**dto.LabelPair]bool {
		seen := map[**dto.LabelPair]bool{}
		for _, mf := range mfs {
			if mf.GetName() == "gpu_process_memory_used_bytes" {
				for _, m := range mf.Metric {
					seen[&m.Label[0]] = true
				}
			}
		}
		return seen
	}
	kept, old := 0, pairs(before)
	for p := range pairs(after) {
		if old[p] {
			kept++
		}
	}
	// 8 x 192 processes stayed; those on GPUs 1 and 2 moved (a new gpu label), one changed type.
	if want := 6*192 - 1; kept != want {
		t.Errorf("%d label sets were taken from the last gathering, want %d", kept, want)
	}
}

// A self-metric with a GPU family's name is left out, and the gathering says so.
func TestSelfMetricWithAGPUFamilysName(t *testing.T) {
	snap, owners := benchNode()
	clash := prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpu_info", Help: "clash"})
	c := New(reading.New(fixedSource{snap}, owners, time.Minute, slog.New(slog.DiscardHandler)), Options{}, clash)
	mfs, err := c.Gather()
	if err == nil || !strings.Contains(err.Error(), "gpu_info is both a GPU family and a self-metric") {
		t.Errorf("error %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "gpu_info" && mf.GetHelp() == "clash" {
			t.Error("the self-metric was served")
		}
	}
	if !slices.IsSortedFunc(mfs, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) }) {
		t.Error("families are not sorted by name")
	}
}

// Every option on, no two parts write a family of the same name.
func TestFamilyNamesAreUnique(t *testing.T) {
	snap, owners := benchNode()
	c := New(reading.New(fixedSource{snap}, owners, time.Minute, slog.New(slog.DiscardHandler)), Options{
		Processes: true, PodLabels: []string{"app"}, ProcessUser: true, Compat: []string{CompatNvidiasmi, CompatDCGM},
		Allocations: fixedAllocations{nil, true},
	})
	names := c.Families()
	if len(names) < 40 {
		t.Fatalf("only %d families: %v", len(names), names)
	}
	seen := map[string]bool{}
	for _, name := range names {
		if seen[name] {
			t.Errorf("%s is written by two parts", name)
		}
		seen[name] = true
	}
}

// countingSource is benchNode with every process's memory set to the number of the reading.
type countingSource struct {
	snap *gpu.Snapshot
	n    atomic.Int64
}

func (s *countingSource) Name() string { return "counting" }
func (s *countingSource) Close() error { return nil }
func (s *countingSource) Snapshot(context.Context) (*gpu.Snapshot, error) {
	n := float64(s.n.Add(1))
	snap := *s.snap
	snap.Devices = slices.Clone(snap.Devices)
	for i := range snap.Devices {
		d := &snap.Devices[i]
		d.Processes = slices.Clone(d.Processes)
		for j := range d.Processes {
			d.Processes[j].UsedMemoryBytes = gpu.Known(n)
		}
	}
	return &snap, nil
}

// Scrapes at the same time through the exposition, gathering after gathering with each handed back and its series
// written over by a later one, each get one whole reading: the series of a reading still being served are never
// reused.
func TestConcurrentScrapesWithReleases(t *testing.T) {
	snap, owners := benchNode()
	c := New(reading.New(&countingSource{snap: snap}, owners, time.Minute, slog.New(slog.DiscardHandler)), Options{Processes: true})
	h := exposition.New(c, slog.New(slog.DiscardHandler))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 10 {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
				values := map[string]int{}
				for line := range strings.Lines(w.Body.String()) {
					if strings.HasPrefix(line, "gpu_process_memory_used_bytes{") {
						values[strings.Fields(line)[1]]++
					}
				}
				if len(values) != 1 {
					t.Errorf("one body has the memory of readings %v", values)
					return
				}
				for _, n := range values {
					if n != 2048 {
						t.Errorf("%d processes in a body, want 2048", n)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// The exposition borrows gatherings from the collector, and hands them back.
var _ exposition.Lender = (*Gatherer)(nil)

// Every body the exposition serves is the collector's gathering: the text written from its own series, gzipped or
// not, the protocol buffer format and a filtered scrape written from client_model's families.
func TestEveryFormatServesTheGathering(t *testing.T) {
	snap, owners := benchNode()
	c := New(reading.New(fixedSource{snap}, owners, time.Minute, slog.New(slog.DiscardHandler)), Options{Processes: true})
	// The GPU families among mfs, sorted by name (the text decoder gives them in no order), with the names asked.
	gpu := func(mfs []*dto.MetricFamily, names ...string) string {
		var kept []*dto.MetricFamily
		for _, mf := range mfs {
			if !strings.HasPrefix(mf.GetName(), "gpu_pod_exporter_") && (len(names) == 0 || slices.Contains(names, mf.GetName())) {
				kept = append(kept, mf)
			}
		}
		slices.SortFunc(kept, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
		return testkit.ExpositionText(t, kept)
	}
	mfs, err := c.Gather()
	if err != nil {
		t.Fatal(err)
	}
	h := exposition.New(c, slog.New(slog.DiscardHandler))
	for _, scrape := range []struct {
		accept, encoding string
		names            []string
	}{
		{"", "", nil},
		{"", "gzip", nil},
		{"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", "", nil},
		{"", "", []string{"gpu_process_memory_used_bytes", "gpu_info"}},
	} {
		query := url.Values{"name[]": scrape.names}
		r := httptest.NewRequest(http.MethodGet, "/metrics?"+query.Encode(), nil)
		r.Header.Set("Accept", scrape.accept)
		r.Header.Set("Accept-Encoding", scrape.encoding)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var body io.Reader = w.Body
		if w.Header().Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(w.Body)
			if err != nil {
				t.Fatal(err)
			}
			body = zr
		}
		dec := expfmt.NewDecoder(body, expfmt.Format(w.Header().Get("Content-Type")))
		var got []*dto.MetricFamily
		for {
			mf := &dto.MetricFamily{}
			if err := dec.Decode(mf); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%+v: %v", scrape, err)
			}
			got = append(got, mf)
		}
		if g, want := gpu(got), gpu(mfs, scrape.names...); g != want {
			t.Errorf("%+v: the body is not the gathering:\n%.2000s\nwant:\n%.2000s", scrape, g, want)
		} else if !strings.Contains(g, "gpu_process_memory_used_bytes{") {
			t.Errorf("%+v: no process series in the body", scrape)
		}
	}
}
