package exposition

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// gate is a Gatherer that holds each gathering until the test releases it, and counts them.
type gate struct {
	reg     *prometheus.Registry
	release chan struct{}
	calls   atomic.Int32
	err     error
}

func newGate(t *testing.T) *gate {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpu_test", Help: "A test series."}, []string{"gpu"})
	for _, i := range []string{"0", "1", "2"} {
		g.WithLabelValues(i).Set(42)
	}
	reg.MustRegister(g)
	return &gate{reg: reg, release: make(chan struct{})}
}

func (g *gate) Gather() ([]*dto.MetricFamily, error) {
	g.calls.Add(1)
	<-g.release
	mfs, err := g.reg.Gather()
	if g.err != nil {
		return mfs, g.err
	}
	return mfs, err
}

func request(ctx context.Context, accept, encoding string) *http.Request {
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/metrics", nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	if encoding != "" {
		r.Header.Set("Accept-Encoding", encoding)
	}
	return r
}

// joined waits until n scrapes have joined a gathering.
func joined(t *testing.T, h *Handler, n int) chan struct{} {
	t.Helper()
	ch := make(chan struct{}, n)
	h.onJoin = func() { ch <- struct{}{} }
	return ch
}

func TestConcurrentScrapesShareOneGatheringAndBody(t *testing.T) {
	g := newGate(t)
	h := New(g, slog.New(slog.DiscardHandler))
	var encodes atomic.Int32
	h.onEncode = func() { encodes.Add(1) }
	const scrapers = 50 // far above the 8 that promhttp's in-flight limit allowed
	joins := joined(t, h, scrapers)
	bodies := make([][]byte, scrapers)
	codes := make([]int, scrapers)
	var wg sync.WaitGroup
	for i := range scrapers {
		wg.Go(func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, request(t.Context(), "", "gzip"))
			codes[i], bodies[i] = w.Code, w.Body.Bytes()
		})
	}
	for range scrapers {
		<-joins
	}
	close(g.release)
	wg.Wait()
	if n := g.calls.Load(); n != 1 {
		t.Errorf("%d gatherings for %d concurrent scrapes, want 1", n, scrapers)
	}
	if n := encodes.Load(); n != 1 {
		t.Errorf("%d encodings for one format and encoding, want 1", n)
	}
	for i := range scrapers {
		if codes[i] != http.StatusOK {
			t.Fatalf("scrape %d: HTTP %d, want 200", i, codes[i])
		}
		if !bytes.Equal(bodies[i], bodies[0]) {
			t.Fatalf("scrape %d got another body", i)
		}
	}
	if got := gunzip(t, bodies[0]); !strings.Contains(got, `gpu_test{gpu="2"} 42`) {
		t.Errorf("body:\n%s", got)
	}
}

func TestEachFormatAndEncodingIsEncodedOnce(t *testing.T) {
	g := newGate(t)
	h := New(g, slog.New(slog.DiscardHandler))
	var encodes atomic.Int32
	h.onEncode = func() { encodes.Add(1) }
	kinds := []struct{ accept, encoding, contentType, contentEncoding string }{
		{"", "gzip", "text/plain; version=0.0.4; charset=utf-8; escaping=underscores", "gzip"},
		{"", "", "text/plain; version=0.0.4; charset=utf-8; escaping=underscores", ""},
		{"", "gzip;q=0, identity", "text/plain; version=0.0.4; charset=utf-8; escaping=underscores", ""},
		{"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", "gzip",
			"application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited; escaping=underscores", "gzip"},
	}
	const each = 3
	joins := joined(t, h, len(kinds)*each)
	type answer struct {
		kind int
		w    *httptest.ResponseRecorder
	}
	answers := make(chan answer, len(kinds)*each)
	for k, kind := range kinds {
		for range each {
			go func() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, request(t.Context(), kind.accept, kind.encoding))
				answers <- answer{k, w}
			}()
		}
	}
	for range len(kinds) * each {
		<-joins
	}
	close(g.release)
	for range len(kinds) * each {
		a := <-answers
		kind := kinds[a.kind]
		if a.w.Code != http.StatusOK {
			t.Fatalf("%+v: HTTP %d", kind, a.w.Code)
		}
		if got := a.w.Header().Get("Content-Type"); got != kind.contentType {
			t.Errorf("%+v: Content-Type %q, want %q", kind, got, kind.contentType)
		}
		if got := a.w.Header().Get("Content-Encoding"); got != kind.contentEncoding {
			t.Errorf("%+v: Content-Encoding %q, want %q", kind, got, kind.contentEncoding)
		}
	}
	// Two text kinds are the same body: identity asked two ways.
	if n := encodes.Load(); n != 3 {
		t.Errorf("%d encodings, want 3 (one per distinct format and encoding)", n)
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("%d gatherings, want 1", n)
	}
}

func TestScrapeAfterGatheringGetsANewOne(t *testing.T) {
	g := newGate(t)
	close(g.release)
	h := New(g, slog.New(slog.DiscardHandler))
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, request(t.Context(), "", ""))
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `gpu_test{gpu="0"} 42`) {
			t.Fatalf("HTTP %d:\n%s", w.Code, w.Body)
		}
	}
	if n := g.calls.Load(); n != 3 {
		t.Errorf("%d gatherings for 3 sequential scrapes, want 3", n)
	}
}

func TestClientThatGoesAwayStopsWaiting(t *testing.T) {
	g := newGate(t)
	h := New(g, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(t.Context())
	joins := joined(t, h, 1)
	done := make(chan struct{})
	w := httptest.NewRecorder()
	go func() {
		h.ServeHTTP(w, request(ctx, "", "gzip"))
		close(done)
	}()
	<-joins
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a scrape whose client went away still waits for the gathering")
	}
	if w.Body.Len() != 0 {
		t.Errorf("wrote %d bytes to a client that went away", w.Body.Len())
	}
	// The gathering it joined goes on, and the next scrape joins it.
	joins = joined(t, h, 1)
	next := make(chan *httptest.ResponseRecorder)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, request(t.Context(), "", ""))
		next <- w
	}()
	<-joins
	close(g.release)
	if w := <-next; w.Code != http.StatusOK {
		t.Errorf("next scrape: HTTP %d", w.Code)
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("%d gatherings, want 1: the abandoned one is joined, not restarted", n)
	}
}

func TestPartialGatheringIsServedAndLoggedOnce(t *testing.T) {
	g := newGate(t)
	close(g.release)
	g.err = errors.New("collected metric gpu_test was collected before with the same name and label values")
	logs := &testkit.Logs{}
	h := New(g, slog.New(logs))
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, request(t.Context(), "", ""))
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "gpu_test") {
			t.Fatalf("HTTP %d:\n%s", w.Code, w.Body)
		}
	}
	if logs.CountAtLeast(slog.LevelError) != 1 {
		t.Errorf("%d error records for one lasting problem, want 1", logs.CountAtLeast(slog.LevelError))
	}
}

type failing struct{}

func (failing) Gather() ([]*dto.MetricFamily, error) { return nil, errors.New("broken") }

func TestFailedGatheringIs500(t *testing.T) {
	h := New(failing{}, slog.New(slog.DiscardHandler))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, request(t.Context(), "", ""))
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "broken") {
		t.Errorf("HTTP %d: %s", w.Code, w.Body)
	}
}

func TestNameFilter(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, name := range []string{"a_total", "b_total"} {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: "x"})
		reg.MustRegister(c)
	}
	h := New(reg, slog.New(slog.DiscardHandler))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics?name[]=b_total", nil))
	if got := w.Body.String(); strings.Contains(got, "a_total") || !strings.Contains(got, "b_total 0") {
		t.Errorf("name[]=b_total:\n%s", got)
	}
}

func TestAcceptsGzip(t *testing.T) {
	for header, want := range map[string]bool{
		"":                     false,
		"gzip":                 true,
		"GZIP":                 true,
		"deflate, gzip;q=1.0":  true,
		"gzip;q=0":             false,
		"gzip; q=0.001":        true,
		"identity":             false,
		"*":                    true,
		"*;q=0":                false,
		"gzip;q=0, *":          false,
		"br, zstd":             false,
		"x-gzip":               true,
		"gzip;q=0.5, identity": true,
	} {
		if got := acceptsGzip(header); got != want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", header, got, want)
		}
	}
}

// The text body equals what promhttp's encoder writes for the same families.
func TestBodyIsTheOfficialEncoding(t *testing.T) {
	g := newGate(t)
	close(g.release)
	h := New(g, slog.New(slog.DiscardHandler))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, request(t.Context(), "", "gzip"))
	mfs, _ := g.reg.Gather()
	var want bytes.Buffer
	enc := expfmt.NewEncoder(&want, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	if got := gunzip(t, w.Body.Bytes()); got != want.String() {
		t.Errorf("body:\n%s\nwant:\n%s", got, want.String())
	}
	if got := w.Header().Get("Content-Length"); got != strconv.Itoa(w.Body.Len()) {
		t.Errorf("Content-Length %s, body %d bytes", got, w.Body.Len())
	}
}

func gunzip(t *testing.T, b []byte) string {
	t.Helper()
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

type families []*dto.MetricFamily

func (f families) Gather() ([]*dto.MetricFamily, error) { return f, nil }

// Names that need escaping are escaped as the negotiated format says, whether they are a family's or a label's.
func TestNamesThatNeedEscapingAreEscaped(t *testing.T) {
	gauge := func(name, label string) *dto.MetricFamily {
		return &dto.MetricFamily{Name: proto.String(name), Help: proto.String("h"), Type: dto.MetricType_GAUGE.Enum(),
			Metric: []*dto.Metric{{Label: []*dto.LabelPair{{Name: proto.String(label), Value: proto.String("v")}},
				Gauge: &dto.Gauge{Value: proto.Float64(1)}}}}
	}
	for _, mfs := range []families{
		{gauge("a", "ok"), gauge("b.utf8", "ok")},
		{gauge("a", "ok"), gauge("b", "label.utf8")},
		{gauge("a", "ok"), gauge("b", "ok")},
	} {
		h := New(mfs, slog.New(slog.DiscardHandler))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, request(t.Context(), "text/plain;version=0.0.4", ""))
		var want bytes.Buffer
		enc := expfmt.NewEncoder(&want, expfmt.NewFormat(expfmt.TypeTextPlain).WithEscapingScheme(model.UnderscoreEscaping))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		if got := w.Body.String(); got != want.String() || strings.Contains(got, ".") {
			t.Errorf("body:\n%s\nwant:\n%s", got, want.String())
		}
	}
}

// lendingGate is a gate that is also a Lender, and says when a gathering it lent is released.
type lendingGate struct {
	*gate
	engine   *series.Engine
	desc     *series.Desc
	released chan struct{}
}

func newLendingGate(t *testing.T, buffer int) lendingGate {
	d := series.NewDesc("gpu_lent", "A lent series.", []string{"gpu"})
	return lendingGate{newGate(t), series.NewEngine(d), d, make(chan struct{}, buffer)}
}

// Lend gathers the gate's families and one series of its own, and reports the release through a hook on the gathering.
func (g lendingGate) Lend() (*series.Gathering, error) {
	mfs, err := g.Gather()
	b := g.engine.Batch()
	b.Gauge(g.desc, 7, "0")
	lent, gerr := b.Gather(mfs)
	lent.OnRelease(func() { g.released <- struct{}{} })
	return lent, errors.Join(err, gerr)
}

// blockingWriter is a client that takes its body only when the test lets it.
type blockingWriter struct {
	*httptest.ResponseRecorder
	unblock chan struct{}
}

func (w blockingWriter) Write(b []byte) (int, error) {
	<-w.unblock
	return w.ResponseRecorder.Write(b)
}

// A gathering is handed back once, when the last scrape that joined it has returned: not while one still writes
// its body.
func TestGatheringIsReleasedAfterItsLastScrape(t *testing.T) {
	g := newLendingGate(t, 4)
	h := New(g, slog.New(slog.DiscardHandler))
	joins := joined(t, h, 2)
	slow := blockingWriter{httptest.NewRecorder(), make(chan struct{})}
	slowDone, fastDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(slowDone)
		h.ServeHTTP(slow, request(t.Context(), "", ""))
	}()
	go func() {
		defer close(fastDone)
		h.ServeHTTP(httptest.NewRecorder(), request(t.Context(), "", "gzip"))
	}()
	<-joins
	<-joins
	close(g.release)
	<-fastDone
	select {
	case <-g.released:
		t.Fatal("released while a scrape was still writing its body")
	default:
	}
	close(slow.unblock)
	<-slowDone
	select {
	case <-g.released:
	default:
		t.Fatal("not released after its last scrape returned")
	}
	if !strings.Contains(slow.Body.String(), `gpu_test{gpu="2"} 42`) || !strings.Contains(slow.Body.String(), `gpu_lent{gpu="0"} 7`) {
		t.Errorf("slow scrape's body:\n%s", slow.Body)
	}
	select {
	case <-g.released:
		t.Error("released twice")
	default:
	}
}

// A gathering whose scrapes all went away before it ended is handed back when it ends.
func TestGatheringWithoutScrapesIsReleasedWhenItEnds(t *testing.T) {
	g := newLendingGate(t, 1)
	h := New(g, slog.New(slog.DiscardHandler))
	joins := joined(t, h, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(httptest.NewRecorder(), request(ctx, "", ""))
	}()
	<-joins
	cancel()
	<-done
	close(g.release)
	select {
	case <-g.released:
	case <-time.After(10 * time.Second):
		t.Fatal("the gathering was not released when it ended")
	}
}
