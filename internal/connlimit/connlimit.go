// Package connlimit bounds the connections an HTTP server holds open. Each one costs a goroutine, buffers and a file
// descriptor until the client closes it or the idle timeout does, so clients that open connections and leave them idle
// could otherwise take the server's memory. At the bound, the connection idle the longest is closed to make room for a
// new one (a client that reuses it opens another, as it would after an idle timeout), and a new connection is refused
// only when every one held is in use. Both are counted in the Limiter's self-metrics.
package connlimit

import (
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Limiter holds at most Max connections of the listeners it wraps. It is safe for concurrent use.
type Limiter struct {
	max    int
	logger *slog.Logger
	mu     sync.Mutex
	conns  map[net.Conn]*held // by the connection Accept returned
	// While at the bound: how many connections were closed to make room and how many refused, logged when it ends.
	atLimit         bool
	closed, refused int
	// Since the Limiter was made, for its self-metrics.
	closedTotal, refusedTotal uint64
	evictedDesc, refusedDesc  *prometheus.Desc
}

type held struct {
	state http.ConnState
	since time.Time // of the last change of state
}

// New returns a Limiter of max connections that logs, on logger, when it reaches the bound and when it is back under.
// Its self-metrics have the label listener="<listener>".
func New(max int, listener string, logger *slog.Logger) *Limiter {
	labels := prometheus.Labels{"listener": listener}
	return &Limiter{max: max, logger: logger, conns: map[net.Conn]*held{},
		evictedDesc: prometheus.NewDesc("gpu_pod_exporter_http_connections_evicted_total",
			"Idle connections closed to make room for a new one at the connection limit.", nil, labels),
		refusedDesc: prometheus.NewDesc("gpu_pod_exporter_http_connections_refused_total",
			"New connections closed at once at the connection limit, every connection held being in use.", nil, labels),
	}
}

// Describe implements prometheus.Collector for the Limiter's self-metrics.
func (l *Limiter) Describe(ch chan<- *prometheus.Desc) {
	ch <- l.evictedDesc
	ch <- l.refusedDesc
}

// Collect implements prometheus.Collector for the Limiter's self-metrics.
func (l *Limiter) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	evicted, refused := l.closedTotal, l.refusedTotal
	l.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(l.evictedDesc, prometheus.CounterValue, float64(evicted))
	ch <- prometheus.MustNewConstMetric(l.refusedDesc, prometheus.CounterValue, float64(refused))
}

// Listen wraps a listener; the connections of all the listeners a Limiter wraps count against one bound. The
// server that serves them must have ConnState as its ConnState hook.
func (l *Limiter) Listen(inner net.Listener) net.Listener {
	return &listener{Listener: inner, limiter: l}
}

type listener struct {
	net.Listener
	limiter *Limiter
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ln.limiter.admit(c) {
			return c, nil
		}
		c.Close()
	}
}

// admit makes room for c if it can, and reports whether c is held.
func (l *Limiter) admit(c net.Conn) bool {
	now := time.Now()
	l.mu.Lock()
	if len(l.conns) < l.max {
		l.conns[c] = &held{state: http.StateNew, since: now}
		l.mu.Unlock()
		return true
	}
	var oldest net.Conn
	for hc, h := range l.conns {
		if (h.state == http.StateIdle || h.state == http.StateNew) && (oldest == nil || h.since.Before(l.conns[oldest].since)) {
			oldest = hc
		}
	}
	if !l.atLimit {
		l.atLimit = true
		l.logger.Warn("connection limit reached: closing the connection idle the longest for each new one, and "+
			"refusing new ones while all are in use", "max_connections", l.max)
	}
	if oldest == nil {
		l.refused++
		l.refusedTotal++
		l.mu.Unlock()
		return false
	}
	delete(l.conns, oldest)
	l.closed++
	l.closedTotal++
	l.conns[c] = &held{state: http.StateNew, since: now}
	l.mu.Unlock()
	oldest.Close()
	return true
}

// ConnState is the server's ConnState hook: it tells the Limiter which connections are idle, and which are gone.
func (l *Limiter) ConnState(c net.Conn, state http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.conns[c]
	if !ok {
		return // closed to make room, or not one of ours
	}
	switch state {
	case http.StateClosed, http.StateHijacked:
		delete(l.conns, c)
		// Back under the bound with room to spare: the episode is over.
		if l.atLimit && len(l.conns) <= l.max*9/10 {
			l.logger.Info("back under the connection limit", "max_connections", l.max, "open", len(l.conns),
				"closed_to_make_room", l.closed, "refused", l.refused)
			l.atLimit, l.closed, l.refused = false, 0, 0
		}
	default:
		h.state, h.since = state, time.Now()
	}
}

// Open is how many connections are held now.
func (l *Limiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}
