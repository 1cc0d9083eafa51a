// Package exposition serves a registry's metrics over HTTP, gathering once for all the scrapes that arrive while a
// gathering is running and encoding its result once per negotiated format and compression. Prometheus HA pairs and
// agents scrape the same node at the same moment; they share one reading and one body, and none is refused.
//
// A scrape filtered by name (promhttp's name[] parameter) costs no more. A gzipped one shares a body with the
// gathering's other scrapes of the same families, for a few sets of families per gathering; one that is not, or
// past them, is cut from the whole body of its format, uncompressed, which the gathering's other scrapes of that
// format share.
package exposition

import (
	"bytes"
	"context"
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

	mu       sync.Mutex
	bodies   map[bodyKey]*body
	filtered int // the bodies of filtered scrapes among bodies
}

type bodyKey struct {
	format expfmt.Format
	gzip   bool
	// families are those of a filtered body (a bit per family of the gathering, in its order); "" for all of them.
	families string
}

type body struct {
	done chan struct{} // closed when b, ends and err are set
	b    []byte
	ends []int // where each family of the gathering ends in b, when it is not compressed: a filtered body is cut from it
	err  error
}

// maxFilteredBodies bounds the gzipped filtered bodies of one gathering: a few scrape jobs filter a node's families,
// each always the same way, while a client that asks for many sets of families gets them uncompressed.
const maxFilteredBodies = 4

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
	picked, filtered := pick(f.g, r.URL.Query()["name[]"])
	var b *body
	ok := true
	if filtered && key.gzip {
		some := key
		some.families = familySet(picked, f.g.Len())
		b, ok = h.shared(ctx, f, some, func(w io.Writer) ([]int, error) { return nil, f.g.WriteSome(w, key.format, picked) })
		if b == nil {
			key.gzip = false // past the gathering's gzipped filtered bodies: cut from the whole one
		}
	}
	if b == nil && ok {
		b, ok = h.shared(ctx, f, key, func(w io.Writer) ([]int, error) { return f.g.Write(w, key.format) })
	}
	if !ok {
		return
	}
	parts, err := [][]byte{b.b}, b.err
	if filtered && !key.gzip && err == nil {
		parts = cut(b, picked)
	}
	if err != nil {
		h.logger.Error("encoding metrics", "format", string(key.format), "err", err)
		http.Error(w, "An error has occurred while encoding metrics.", http.StatusInternalServerError)
		return
	}
	reply(w, key, parts)
}

// reply writes a body of parts.
func reply(w http.ResponseWriter, key bodyKey, parts [][]byte) {
	hdr := w.Header()
	hdr.Add("Vary", "Accept")
	hdr.Add("Vary", "Accept-Encoding")
	hdr.Set("Content-Type", string(key.format))
	if key.gzip {
		hdr.Set("Content-Encoding", "gzip")
	}
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	hdr.Set("Content-Length", strconv.Itoa(n))
	// A client that hung up fails this write; there is nobody to tell, and nothing to log.
	_ = writeAll(w, parts)
}

func writeAll(w io.Writer, parts [][]byte) error {
	for _, p := range parts {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// shared returns the flight's body for key: the first scrape that asks for it encodes it with write, and the others
// wait for it. It returns nil and false if the client went away while waiting, and nil and true for a filtered body
// past the gathering's bound.
func (h *Handler) shared(ctx context.Context, f *flight, key bodyKey, write func(io.Writer) ([]int, error)) (*body, bool) {
	b, first := f.body(key)
	switch {
	case b == nil:
		return nil, true
	case first:
		b.b, b.ends, b.err = h.encode(key, write)
		close(b.done)
		return b, true
	}
	select {
	case <-b.done:
		return b, true
	case <-ctx.Done():
		return nil, false
	}
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
// closes done; the others wait for done. A filtered body past maxFilteredBodies is nil.
func (f *flight) body(key bodyKey) (b *body, first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b, ok := f.bodies[key]; ok {
		return b, false
	}
	if key.families != "" {
		if f.filtered >= maxFilteredBodies {
			return nil, false
		}
		f.filtered++
	}
	b = &body{done: make(chan struct{})}
	f.bodies[key] = b
	return b, true
}

// maxGzips bounds the compressors kept: bodies are encoded once per gathering and format, so two are at work
// together only when a gathering's bodies overlap the next one's.
const maxGzips = 2

// encode returns a body that write writes, compressed as key says, and where its families end when it is not.
func (h *Handler) encode(key bodyKey, write func(io.Writer) ([]int, error)) ([]byte, []int, error) {
	if h.onEncode != nil {
		h.onEncode()
	}
	// The size of a filtered body is not kept: clients choose their families, and would grow the map without bound.
	hint := 0
	if key.families == "" {
		h.mu.Lock()
		hint = h.sizeHint[key]
		h.mu.Unlock()
	}
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
	ends, err := write(w)
	if err != nil {
		return nil, nil, err
	}
	if gz != nil {
		if err := gz.Close(); err != nil {
			return nil, nil, err
		}
		ends = nil // of what was compressed
	}
	if key.families == "" {
		h.mu.Lock()
		h.sizeHint[key] = buf.Len()
		h.mu.Unlock()
	}
	return buf.Bytes(), ends, nil
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

// pick returns the places of the families of g that a filtered scrape names, in order, and whether it is filtered:
// a scrape that names every family is not.
func pick(g *series.Gathering, names []string) (picked []int, filtered bool) {
	if len(names) == 0 {
		return nil, false
	}
	chosen := make([]bool, g.Len())
	for _, name := range names {
		if i, ok := g.Index(name); ok {
			chosen[i] = true
		}
	}
	for i, c := range chosen {
		if c {
			picked = append(picked, i)
		}
	}
	return picked, len(picked) < g.Len()
}

// cut returns the parts of a whole body, not compressed, that are the body of the picked families: their bytes, and
// the format's end.
func cut(b *body, picked []int) [][]byte {
	start := func(i int) int {
		if i == 0 {
			return 0
		}
		return b.ends[i-1]
	}
	var parts [][]byte
	for j, i := range picked {
		if j > 0 && picked[j-1] == i-1 { // one part for families that follow one another
			last := &parts[len(parts)-1]
			*last = (*last)[:len(*last)+b.ends[i]-start(i)]
			continue
		}
		parts = append(parts, b.b[start(i):b.ends[i]])
	}
	return append(parts, b.b[start(len(b.ends)):])
}

// familySet is a key of the picked families of n: a bit per family.
func familySet(picked []int, n int) string {
	set := make([]byte, (n+7)/8+1)
	set[0] = 1 // never "", the key of every family
	for _, i := range picked {
		set[1+i/8] |= 1 << (i % 8)
	}
	return string(set)
}

var _ http.Handler = (*Handler)(nil)
