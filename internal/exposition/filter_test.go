package exposition

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// threeFamilies is a lending gate of three families: gpu_b and gpu_d of two series each, self-metrics from a
// registry, between which gpu_lent, a collector's own series, comes last.
func threeFamilies(t *testing.T) lendingGate {
	g := newLendingGate(t, 64)
	g.reg = prometheus.NewRegistry()
	for _, name := range []string{"gpu_b", "gpu_d"} {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "Help of " + name + "."}, []string{"gpu"})
		v.WithLabelValues("0").Set(1)
		v.WithLabelValues("1").Set(2)
		g.reg.MustRegister(v)
	}
	return g
}

// filtered is a request for the names, in a format and encoding.
func filtered(accept, encoding string, names ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/metrics?"+url.Values{"name[]": names}.Encode(), nil)
	r.Header.Set("Accept", accept)
	r.Header.Set("Accept-Encoding", encoding)
	return r
}

// decode reads a body's families back, whatever its format and encoding.
func decode(t *testing.T, w *httptest.ResponseRecorder) []*dto.MetricFamily {
	t.Helper()
	if got := w.Header().Get("Content-Length"); got != strconv.Itoa(w.Body.Len()) {
		t.Errorf("Content-Length %s, body %d bytes", got, w.Body.Len())
	}
	body := w.Body.Bytes()
	if w.Header().Get("Content-Encoding") == "gzip" {
		body = []byte(gunzip(t, body))
	}
	format := expfmt.Format(w.Header().Get("Content-Type"))
	if format.FormatType() == expfmt.TypeOpenMetrics && !bytes.HasSuffix(body, []byte("# EOF\n")) {
		t.Errorf("OpenMetrics body without its end:\n%s", body)
	}
	dec := expfmt.NewDecoder(bytes.NewReader(body), format)
	var mfs []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); err == io.EOF {
			return mfs
		} else if err != nil {
			t.Fatalf("%s: %v\n%s", format, err, body)
		}
		mfs = append(mfs, mf)
	}
}

func names(mfs []*dto.MetricFamily) []string {
	var n []string
	for _, mf := range mfs {
		n = append(n, mf.GetName())
	}
	slices.Sort(n)
	return n
}

// A filtered body, in every format and encoding, has the families named, whole, and no other: as promhttp filters.
func TestFilteredBodiesHaveTheFamiliesNamed(t *testing.T) {
	g := threeFamilies(t)
	close(g.release)
	h := New(g, slog.New(slog.DiscardHandler))
	formats := []string{
		"",
		"application/openmetrics-text;version=1.0.0",
		"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
	}
	for _, accept := range formats {
		for _, encoding := range []string{"", "gzip"} {
			for _, query := range [][]string{
				{"gpu_lent"},
				{"gpu_b", "gpu_d"},
				{"gpu_d", "gpu_lent", "gpu_d", "nothing"}, // in any order, repeated, or unknown
				{"nothing"},
				{"gpu_b", "gpu_d", "gpu_lent"}, // every family
			} {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, filtered(accept, encoding, query...))
				if w.Code != http.StatusOK {
					t.Fatalf("%q %q %v: HTTP %d", accept, encoding, query, w.Code)
				}
				mfs := decode(t, w)
				var want []string
				for _, n := range query {
					if n != "nothing" && !slices.Contains(want, n) {
						want = append(want, n)
					}
				}
				slices.Sort(want)
				if got := names(mfs); !slices.Equal(got, want) {
					t.Errorf("%q %q %v: families %v, want %v", accept, encoding, query, got, want)
				}
				for _, mf := range mfs {
					if n, want := len(mf.GetMetric()), map[string]int{"gpu_b": 2, "gpu_d": 2, "gpu_lent": 1}[mf.GetName()]; n != want {
						t.Errorf("%q %q %v: %s has %d series, want %d", accept, encoding, query, mf.GetName(), n, want)
					}
				}
			}
		}
	}
}

// Filtered scrapes of one gathering share their bodies: one gzipped body per set of families, or one whole body per
// format, uncompressed, cut for each.
func TestConcurrentFilteredScrapesShareOneBody(t *testing.T) {
	for _, encoding := range []string{"", "gzip"} {
		g := threeFamilies(t)
		h := New(g, slog.New(slog.DiscardHandler))
		var encodes atomic.Int32
		h.onEncode = func() { encodes.Add(1) }
		const scrapers = 50
		joins := joined(t, h, scrapers)
		answers := make([]*httptest.ResponseRecorder, scrapers)
		var wg sync.WaitGroup
		for i := range scrapers {
			wg.Go(func() {
				answers[i] = httptest.NewRecorder()
				h.ServeHTTP(answers[i], filtered("", encoding, "gpu_b", "gpu_lent"))
			})
		}
		for range scrapers {
			<-joins
		}
		close(g.release)
		wg.Wait()
		if n := encodes.Load(); n != 1 {
			t.Errorf("Accept-Encoding %q: %d encodings for %d scrapes of the same families, want 1", encoding, n, scrapers)
		}
		for _, w := range answers {
			if got := names(decode(t, w)); !slices.Equal(got, []string{"gpu_b", "gpu_lent"}) {
				t.Fatalf("Accept-Encoding %q: families %v", encoding, got)
			}
			if got := w.Header().Get("Content-Encoding"); got != encoding {
				t.Errorf("Content-Encoding %q, want %q", got, encoding)
			}
		}
	}
}

// A client that asks for many sets of families in one gathering gets a few of them gzipped, and the others
// uncompressed, cut from the whole body: it cannot make the exporter compress, or keep, a body per set.
func TestGzippedFilteredBodiesAreBounded(t *testing.T) {
	g := threeFamilies(t)
	h := New(g, slog.New(slog.DiscardHandler))
	var encodes atomic.Int32
	h.onEncode = func() { encodes.Add(1) }
	sets := [][]string{{"gpu_b"}, {"gpu_d"}, {"gpu_lent"}, {"gpu_b", "gpu_d"}, {"gpu_b", "gpu_lent"}, {"gpu_d", "gpu_lent"}}
	const each = 3
	joins := joined(t, h, len(sets)*each)
	answers := make([]*httptest.ResponseRecorder, len(sets)*each)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			answers[i] = httptest.NewRecorder()
			h.ServeHTTP(answers[i], filtered("", "gzip", sets[i%len(sets)]...))
		})
	}
	for range answers {
		<-joins
	}
	close(g.release)
	wg.Wait()
	if n, most := encodes.Load(), int32(1+maxFilteredBodies); n > most {
		t.Errorf("%d encodings for %d sets of families, want at most %d", n, len(sets), most)
	}
	gzipped := map[string]bool{}
	for i, w := range answers {
		set := sets[i%len(sets)]
		if got := names(decode(t, w)); !slices.Equal(got, set) {
			t.Errorf("%v: families %v", set, got)
		}
		if w.Header().Get("Content-Encoding") == "gzip" {
			gzipped[fmt.Sprint(set)] = true
		}
	}
	if len(gzipped) != maxFilteredBodies {
		t.Errorf("%d sets of families gzipped, want %d", len(gzipped), maxFilteredBodies)
	}
}
