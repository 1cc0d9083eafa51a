// Package exposition serves a registry's metrics over HTTP, gathering once for all the scrapes that arrive while a
// gathering is running and encoding its result once per negotiated format and compression. Prometheus HA pairs and
// agents scrape the same node at the same moment; they share one reading and one body, and none is refused.
package exposition

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// Handler serves the metrics of one Gatherer.
type Handler struct {
	gatherer prometheus.Gatherer
	logger   *slog.Logger

	mu        sync.Mutex
	gathering *flight         // the gathering that a new scrape joins; nil when none is running
	problem   logstate.State  // the last gathering error logged, so that a lasting one is logged once
	sizeHint  map[bodyKey]int // the last body's size, to allocate the next one at once
	// gzip compressors kept from one body to the next, each holding about 1 MiB of tables. A sync.Pool would lose
	// them at every GC, which a large node runs every few scrapes.
	gzips []*gzip.Writer

	// Tests' hooks: a scrape joined a gathering; a body is being encoded.
	onJoin, onEncode func()
}

// New returns a Handler of g. A gathering that fails in part is served with what it has, and its error is logged
// when it first appears or changes.
func New(g prometheus.Gatherer, logger *slog.Logger) *Handler {
	return &Handler{gatherer: g, logger: logger, sizeHint: make(map[bodyKey]int)}
}

// Lender is a Gatherer that lends its gatherings, to write them as text from its own series and reuse their memory
// once served: the Handler releases each gathering when no scrape is using it any more, and never touches it
// afterwards (see internal/series).
type Lender interface {
	prometheus.Gatherer
	Lend() (*series.Gathering, error)
}

// flight is one gathering and the bodies encoded from it.
type flight struct {
	done chan struct{} // closed when g and err are set
	g    *series.Gathering
	err  error
	// Guarded by Handler.mu: the scrapes that joined the gathering and have not returned, and whether g has been
	// released. It is, once the gathering is over and its last scrape has returned.
	users    int
	released bool

	mu     sync.Mutex
	bodies map[bodyKey]*body
}

type bodyKey struct {
	format expfmt.Format
	gzip   bool
}

type body struct {
	done chan struct{} // closed when b and err are set
	b    []byte
	err  error
}

// ServeHTTP implements http.Handler. A scrape whose client goes away stops waiting at once; the gathering it joined
// goes on for the others, within the collection timeout of the collectors.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	f := h.join()
	defer h.leave(f)
	if h.onJoin != nil {
		h.onJoin()
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		return
	}
	if f.err != nil && f.g.Empty() {
		http.Error(w, "An error has occurred while gathering metrics:\n\n"+f.err.Error(), http.StatusInternalServerError)
		return
	}
	key := bodyKey{format: expfmt.Negotiate(r.Header), gzip: acceptsGzip(r.Header.Get("Accept-Encoding"))}
	var b *body
	if names := r.URL.Query()["name[]"]; len(names) > 0 {
		// A filtered scrape (promhttp's name[] parameter) is rare and gets a body of its own.
		b = &body{}
		b.b, b.err = h.encode(key, func(w io.Writer) error { return writeFamilies(w, filter(f.g.Families(), names), key.format) })
	} else if b2, first := f.body(key); first {
		b = b2
		b.b, b.err = h.encode(key, func(w io.Writer) error { return writeGathering(w, f.g, key.format) })
		close(b.done)
	} else {
		b = b2
		select {
		case <-b.done:
		case <-ctx.Done():
			return
		}
	}
	if b.err != nil {
		h.logger.Error("encoding metrics", "format", string(key.format), "err", b.err)
		http.Error(w, "An error has occurred while encoding metrics.", http.StatusInternalServerError)
		return
	}
	hdr := w.Header()
	hdr.Add("Vary", "Accept")
	hdr.Add("Vary", "Accept-Encoding")
	hdr.Set("Content-Type", string(key.format))
	if key.gzip {
		hdr.Set("Content-Encoding", "gzip")
	}
	hdr.Set("Content-Length", strconv.Itoa(len(b.b)))
	// A client that hung up fails this write; there is nobody to tell, and nothing to log.
	_, _ = w.Write(b.b)
}

// join returns the gathering in flight, or starts one.
func (h *Handler) join() *flight {
	h.mu.Lock()
	defer h.mu.Unlock()
	if f := h.gathering; f != nil {
		f.users++
		return f
	}
	f := &flight{done: make(chan struct{}), bodies: make(map[bodyKey]*body), users: 1}
	h.gathering = f
	go h.gather(f)
	return f
}

// leave ends a scrape's use of a gathering: the last one out of a finished gathering releases it.
func (h *Handler) leave(f *flight) {
	h.mu.Lock()
	f.users--
	release := h.releasable(f)
	h.mu.Unlock()
	if release {
		h.release(f)
	}
}

// releasable reports whether f is to be released now, and marks it so. h.mu is held.
func (h *Handler) releasable(f *flight) bool {
	if f.users > 0 || h.gathering == f || f.released {
		return false
	}
	f.released = true
	return true
}

func (h *Handler) release(f *flight) {
	f.g.Release()
}

// gather runs in its own goroutine, so that no scrape's going away cancels what the others wait for.
func (h *Handler) gather(f *flight) {
	var g *series.Gathering
	var err error
	if l, ok := h.gatherer.(Lender); ok {
		g, err = l.Lend()
	} else {
		var mfs []*dto.MetricFamily
		mfs, err = h.gatherer.Gather()
		g = series.FromFamilies(mfs)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if _, changed := h.problem.Set(msg); changed && err != nil {
		h.logger.Error("gathering metrics: some series are left out", "err", err)
	}
	h.mu.Lock()
	f.g, f.err = g, err
	h.gathering = nil          // scrapes from now on want a newer reading
	release := h.releasable(f) // every scrape that joined has gone away already
	h.mu.Unlock()
	close(f.done)
	if release {
		h.release(f)
	}
}

// body returns the flight's body for key. first is true for the first scrape that asks: it encodes the body and
// closes done; the others wait for done.
func (f *flight) body(key bodyKey) (b *body, first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.bodies[key]; ok {
		return b, false
	}
	b = &body{done: make(chan struct{})}
	f.bodies[key] = b
	return b, true
}

// maxGzips bounds the compressors kept: bodies are encoded once per gathering and format, so two are at work
// together only when a gathering's bodies overlap the next one's.
const maxGzips = 2

// encode returns a body that write writes, compressed as key says.
func (h *Handler) encode(key bodyKey, write func(io.Writer) error) ([]byte, error) {
	if h.onEncode != nil {
		h.onEncode()
	}
	h.mu.Lock()
	hint := h.sizeHint[key]
	h.mu.Unlock()
	buf := bytes.NewBuffer(make([]byte, 0, hint+hint/8))
	var w io.Writer = buf
	var gz *gzip.Writer
	if key.gzip {
		h.mu.Lock()
		if n := len(h.gzips); n > 0 {
			gz, h.gzips = h.gzips[n-1], h.gzips[:n-1]
		}
		h.mu.Unlock()
		if gz != nil {
			gz.Reset(buf)
		} else {
			// BestSpeed: the body is encoded once for every scraper, but on the scrape's clock; level 1 costs a
			// third of the default level and leaves the body about 30% larger.
			gz, _ = gzip.NewWriterLevel(buf, gzip.BestSpeed)
		}
		defer func() {
			h.mu.Lock()
			if len(h.gzips) < maxGzips {
				h.gzips = append(h.gzips, gz)
			}
			h.mu.Unlock()
		}()
		w = gz
	}
	if err := write(w); err != nil {
		return nil, err
	}
	if gz != nil {
		if err := gz.Close(); err != nil {
			return nil, err
		}
	}
	h.mu.Lock()
	h.sizeHint[key] = buf.Len()
	h.mu.Unlock()
	return buf.Bytes(), nil
}

// writeGathering writes a gathering in format: the text format from its own series, any other through expfmt.
func writeGathering(w io.Writer, g *series.Gathering, format expfmt.Format) error {
	if format.FormatType() == expfmt.TypeTextPlain {
		return g.WriteText(w, format)
	}
	return writeFamilies(w, g.Families(), format)
}

// writeFamilies writes families with expfmt.
func writeFamilies(w io.Writer, mfs []*dto.MetricFamily, format expfmt.Format) error {
	enc := expfmt.NewEncoder(w, series.Unescaped(format, mfs))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return fmt.Errorf("encoding %s: %w", mf.GetName(), err)
		}
	}
	if c, ok := enc.(expfmt.Closer); ok {
		return c.Close()
	}
	return nil
}

// acceptsGzip reports whether an Accept-Encoding header (RFC 9110, 12.5.3) accepts gzip: named with a q above 0, or
// not named and covered by a "*" with a q above 0.
func acceptsGzip(header string) bool {
	star := false
	for part := range strings.SplitSeq(header, ",") {
		coding, params, _ := strings.Cut(part, ";")
		q := 1.0
		for p := range strings.SplitSeq(params, ";") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "q="); ok {
				if f, err := strconv.ParseFloat(v, 64); err == nil {
					q = f
				}
			}
		}
		switch strings.ToLower(strings.TrimSpace(coding)) {
		case "gzip", "x-gzip":
			return q > 0
		case "*":
			star = q > 0
		}
	}
	return star
}

func filter(mfs []*dto.MetricFamily, names []string) []*dto.MetricFamily {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	var out []*dto.MetricFamily
	for _, mf := range mfs {
		if want[mf.GetName()] {
			out = append(out, mf)
		}
	}
	return out
}

var _ http.Handler = (*Handler)(nil)
