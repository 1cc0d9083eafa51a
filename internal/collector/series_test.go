package collector

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
)

// constCollector writes series through client_golang's own NewConstMetric, to compare a batch with.
type constCollector struct {
	desc   *prometheus.Desc
	series []constSeries
}

type constSeries struct {
	t      prometheus.ValueType
	v      float64
	labels []string
}

func (c constCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c constCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.series {
		ch <- prometheus.MustNewConstMetric(c.desc, s.t, s.v, s.labels...)
	}
}

func textOf(t *testing.T, mfs []*dto.MetricFamily) string {
	t.Helper()
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// A batch writes what a registry of NewConstMetric series writes: label order, series order, type and values.
func TestBatchIsARegistry(t *testing.T) {
	labels := []string{"uuid", "gpu", "b_label", "pid"}
	for _, typ := range []prometheus.ValueType{prometheus.GaugeValue, prometheus.CounterValue} {
		var want []constSeries
		b := newBatch(carried{}, maphash.MakeSeed())
		d := newDesc("gpu_x", "x", labels)
		// Written out of order, the same label values in runs (as the families of one process share them) and
		// apart, and values that sort differently as strings and as numbers.
		for i, pid := range []string{"10", "9", "100", "9", "10"} {
			for _, g := range []string{"1", "0"} {
				if i >= 3 && g == "0" {
					continue // 9 and 10 on GPU 1 come again below, with other values
				}
				values := []string{"GPU-" + g, g, "", pid}
				if i >= 3 {
					values[2] = "again"
				}
				want = append(want, constSeries{typ, float64(i), values})
				if typ == prometheus.GaugeValue {
					b.gauge(d, float64(i), values...)
				} else {
					b.counter(d, float64(i), values...)
				}
			}
		}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(constCollector{prometheus.NewDesc("gpu_x", "x", labels, nil), want})
		wantMFs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.gather()
		if err != nil {
			t.Fatal(err)
		}
		if g, w := textOf(t, got), textOf(t, wantMFs); g != w {
			t.Errorf("batch:\n%s\nregistry:\n%s", g, w)
		}
	}
}

// What a registry refuses, a batch refuses: the series alone is left out and named in the error.
func TestBatchRefusesWhatARegistryRefuses(t *testing.T) {
	b := newBatch(carried{}, maphash.MakeSeed())
	d := newDesc("gpu_x", "x", []string{"a", "b"})
	b.gauge(d, 1, "ok", "\xff")
	b.gauge(d, 2, "one")
	b.gauge(d, 3, "1", "2", "3")
	b.gauge(d, 4, "kept", "x")
	b.gauge(d, 5, "kept", "x") // twice: the first is kept
	b.counter(d, 6, "counter", "x")
	b.gauge(newDesc("gpu_y", "y", []string{"a", "a"}), 1, "1", "2")
	bad := newDesc("9gpu", "y", nil)
	for range maxErrors { // reported once, not once per series: the errors of other families still fit
		b.gauge(bad, 1)
	}
	b.gauge(newDesc("gpu_z", "z", []string{"__reserved"}), 1, "1")
	b.gauge(newDesc("gpu_x", "again", []string{"a", "b"}), 7, "other", "x") // a second desc of the same name
	mfs, err := b.gather()
	if got := textOf(t, mfs); got != "# HELP gpu_x x\n# TYPE gpu_x gauge\ngpu_x{a=\"kept\",b=\"x\"} 4\n" {
		t.Errorf("exposition:\n%s", got)
	}
	for _, want := range []string{"not valid UTF-8", "1 label values for 2 labels", "3 label values for 2 labels",
		"collected before", "both as a gauge and as a counter", `label name "a"`, `"9gpu" is not a valid metric name`,
		`label name "__reserved"`, "gpu_x is written by two parts"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

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
// series, changes nothing on a large node.
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
	got := textOf(t, strip(c.Gather()))
	if want := textOf(t, strip(prometheus.Gatherers{c}.Gather())); got != want {
		t.Error("the collector's exposition is not in the registry's order")
	}
	if n := strings.Count(got, "\ngpu_process_memory_used_bytes{"); n != 2048 {
		t.Errorf("%d process series, want 2048", n)
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
		return mfs, textOf(t, slices.DeleteFunc(slices.Clone(mfs), func(mf *dto.MetricFamily) bool {
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

// Label sets whose hashes collide are told apart by their layout and values.
func TestLabelSetsCollide(t *testing.T) {
	a, b := newDesc("a", "a", []string{"x"}), newDesc("b", "b", []string{"x"})
	sets := labelSets{}
	one, two, three := newLabelSet(a.layout, []string{"1"}), newLabelSet(a.layout, []string{"2"}), newLabelSet(b.layout, []string{"1"})
	for i, s := range []*labelSet{one, two, three} {
		sets.add(42, setRef{set: s, index: i})
	}
	for i, want := range []struct {
		l      *layout
		values []string
	}{{a.layout, []string{"1"}}, {a.layout, []string{"2"}}, {b.layout, []string{"1"}}} {
		if got, ok := sets.find(42, want.l, want.values); !ok || got.index != i {
			t.Errorf("set %d: found %v, %v", i, got.index, ok)
		}
	}
	if _, ok := sets.find(42, a.layout, []string{"3"}); ok {
		t.Error("found a set that is not there")
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

// A released gathering's series are written over by the next gathering, which writes what a fresh collector
// writes; an unreleased one's are not touched.
func TestReleasedSeriesAreReused(t *testing.T) {
	snap, owners := benchNode()
	logger := slog.New(slog.DiscardHandler)
	c := New(reading.New(fixedSource{snap}, owners, time.Minute, logger), Options{Processes: true})
	gpuText := func(mfs []*dto.MetricFamily) string {
		return textOf(t, slices.DeleteFunc(slices.Clone(mfs), func(mf *dto.MetricFamily) bool {
			return strings.HasPrefix(mf.GetName(), "gpu_pod_exporter_")
		}))
	}
	metrics := func(mfs []*dto.MetricFamily) map[*dto.Metric]bool {
		seen := map[*dto.Metric]bool{}
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				seen[m] = true
			}
		}
		return seen
	}
	first, err := c.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := gpuText(first)
	kept, err := c.Gather() // not released: the third gathering must leave it alone
	if err != nil {
		t.Fatal(err)
	}
	c.Release(first)
	third, err := c.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if got := gpuText(third); got != want {
		t.Error("a gathering on released series differs from the first")
	}
	if got := gpuText(kept); got != want {
		t.Error("an unreleased gathering changed")
	}
	reused, old, untouched := 0, metrics(first), metrics(kept)
	for m := range metrics(third) {
		if old[m] {
			reused++
		}
		if untouched[m] {
			t.Fatal("a series of an unreleased gathering was reused")
		}
	}
	gpuSeries := 0
	for _, mf := range first {
		if !strings.HasPrefix(mf.GetName(), "gpu_pod_exporter_") {
			gpuSeries += len(mf.Metric)
		}
	}
	// All of its slabs are reused; the one it had not filled is filled, so up to a slab's series are new ones.
	if reused < gpuSeries-slab {
		t.Errorf("%d series reused of a released gathering's %d", reused, gpuSeries)
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

// The exposition hands gatherings back to the collector.
var _ exposition.Releaser = (*Gatherer)(nil)
