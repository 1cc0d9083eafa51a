// Package server serves the exporter's HTTP endpoints: the metrics, /healthz and /readyz and the landing page, on
// the listeners it is given, behind the web configuration's TLS, basic auth and rate limit, with a bound on the
// connections held open and a rate-limited log of what clients cause. What it serves comes from its caller: it
// knows nothing of GPUs or who uses them.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	pathpkg "path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/basicauth"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/connlimit"
)

// Server timeouts. A scrape may wait up to the collection timeout for a reading before its body is written, so the
// write deadline is that plus the time a slow but live client needs for a large body; a client that stops reading
// is cut off then instead of holding a connection (and its memory) for ever. An idle keep-alive connection, which
// Prometheus reuses between scrapes, is closed after Prometheus's default scrape interval (1m) and some slack: a
// longer interval costs a new connection per scrape, and an abandoned connection is held no longer than that.
const (
	readTimeout       = 30 * time.Second
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 75 * time.Second
	writeSlack        = 30 * time.Second
)

// DefaultMaxConnections bounds the connections held open: a few Prometheus servers and probes use a handful, and
// 512 idle ones cost about 10 MB, well within the chart's memory limit.
const DefaultMaxConnections = 512

// maxStreams bounds the HTTP/2 streams of one connection, when the web configuration turns HTTP/2 on.
const maxStreams = 32

// The health paths, which the metrics path must not take.
const (
	HealthzPath = "/healthz"
	ReadyzPath  = "/readyz"
)

// Config is what the server serves, and how.
type Config struct {
	MetricsPath string       // where Metrics is served; "/" serves no landing page
	Metrics     http.Handler // the exposition
	// Ready tries a reading of the node, for /readyz until one has succeeded (or MarkReady is called).
	Ready func(context.Context) error
	// Registry takes the server's self-metrics: its connection limits, refused password checks, and the metrics
	// handler's own.
	Registry prometheus.Registerer
	// WebConfigFile is exporter-toolkit's web configuration (TLS, basic auth, headers, rate limit); "" for none.
	WebConfigFile     string
	MaxConnections    int           // connections held open at once on the main listeners, and on the health one
	CollectionTimeout time.Duration // how long a scrape may wait for a reading
	Logger            *slog.Logger
}

// Server is the exporter's HTTP server, serving once Start returns.
type Server struct {
	logger *slog.Logger
	ready  *readiness
	main   *limitedServer
	health *limitedServer // nil without a health listener
	errc   chan error
}

// Start serves cfg on ls until ctx given to Wait ends. The listeners are the caller's until Start returns; then
// the server's. An error (a web configuration that cannot be read, a landing page that cannot be built) leaves
// them open.
func Start(cfg Config, ls Listeners) (*Server, error) {
	logger := cfg.Logger
	ready := &readiness{try: cfg.Ready}
	mux := http.NewServeMux()
	mux.Handle(cfg.MetricsPath, promhttp.InstrumentMetricHandler(cfg.Registry, cfg.Metrics))
	mux.HandleFunc(HealthzPath, healthz)
	mux.Handle(ReadyzPath, ready)
	if cfg.MetricsPath != "/" {
		landing, err := web.NewLandingPage(web.LandingConfig{
			Name:        "GPU Pod Exporter",
			Description: "Which pod, container, Slurm job or service uses each GPU, and how much of it.",
			Version:     version.Info(),
			Links: []web.LandingLinks{
				{Address: cfg.MetricsPath, Text: "Metrics"},
				{Address: HealthzPath, Text: "Health"},
				{Address: ReadyzPath, Text: "Readiness"},
			},
			// No pprof is served, so the page must not link it.
			Profiling: "false",
		})
		if err != nil {
			return nil, fmt.Errorf("building the landing page: %w", err)
		}
		mux.Handle("/", landing)
	}
	server := newServer(mux, cfg.CollectionTimeout, cfg.MaxConnections, "web", logger)
	cfg.Registry.MustRegister(server.limit)
	var tlsOn, http2On bool
	if path := cfg.WebConfigFile; path != "" {
		wc := &webConfigFile{path: path}
		c, err := wc.current()
		if err != nil {
			return nil, fmt.Errorf("reading the web configuration %s: %w", path, err)
		}
		guard := newGuard(wc, c, mux, logger)
		cfg.Registry.MustRegister(guard.checker)
		server.Handler = guard
		// A password refused on a connection before it could be checked goes first when asked again there.
		server.ConnContext = basicauth.ConnContext
		if tlsOn = c.TLSConfig.IsEnabled(); tlsOn {
			http2On = c.HTTPConfig.HTTP2
			server.TLSConfig = wc.tlsConfig(http2On)
		}
	}
	server.Protocols = new(http.Protocols)
	server.Protocols.SetHTTP1(true)
	server.Protocols.SetHTTP2(http2On)
	// A scraper asks for one thing at a time. The HTTP/2 server starts a handler for each stream, even one reset as
	// it was sent, up to this many at once and queues 4 times as many before it closes the connection.
	server.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: maxStreams}

	var addrs []string
	for _, l := range ls.Main {
		addrs = append(addrs, l.Addr().String())
	}
	logger.Info("starting gpu-pod-exporter", "version", version.Info(), "listen", strings.Join(addrs, ","),
		"telemetry_path", cfg.MetricsPath)
	s := &Server{logger: logger, ready: ready, main: server, errc: make(chan error, len(ls.Main)+1)}
	for _, l := range ls.Main {
		logger.Info("Listening on", "address", l.Addr().String())
		if tlsOn {
			logger.Info("TLS is enabled.", "http2", http2On, "address", l.Addr().String())
		} else {
			logger.Info("TLS is disabled.", "http2", false, "address", l.Addr().String())
		}
		l = server.limit.Listen(l)
		go func() {
			if tlsOn {
				s.errc <- server.ServeTLS(l, "", "")
			} else {
				s.errc <- server.Serve(l)
			}
		}()
	}
	if ls.Health != nil {
		hmux := http.NewServeMux()
		hmux.HandleFunc(HealthzPath, healthz)
		hmux.Handle(ReadyzPath, ready)
		s.health = newServer(hmux, cfg.CollectionTimeout, cfg.MaxConnections, "health", logger)
		cfg.Registry.MustRegister(s.health.limit)
		logger.Info("serving probes over plain HTTP", "address", ls.Health.Addr().String())
		go func() { s.errc <- s.health.Serve(s.health.limit.Listen(ls.Health)) }()
	}
	return s, nil
}

// MarkReady makes /readyz answer ok from now on: a reading has succeeded.
func (s *Server) MarkReady() { s.ready.ready.Store(true) }

// Wait serves until ctx ends, then shuts down, giving requests in flight a few seconds; an error is a listener
// that failed.
func (s *Server) Wait(ctx context.Context) error {
	select {
	case err := <-s.errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range []*limitedServer{s.main, s.health} {
		if srv == nil {
			continue
		}
		if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Warn("shutting down", "err", err)
		}
	}
	return nil
}

// readiness is /readyz: ready once a reading has succeeded. Until then each probe tries a reading (shared with
// any scrape in flight, bounded by the collection timeout).
type readiness struct {
	try   func(context.Context) error
	ready atomic.Bool
}

func (rd *readiness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !rd.ready.Load() {
		if err := rd.try(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		rd.ready.Store(true)
	}
	fmt.Fprintln(w, "ok")
}

func healthz(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }

// limitedServer is an HTTP server whose listeners are wrapped by its connection limit.
type limitedServer struct {
	*http.Server
	limit *connlimit.Limiter
}

// newServer returns a server whose connection limit's self-metrics say listener="<listener>".
func newServer(h http.Handler, collectionTimeout time.Duration, maxConnections int, listener string, logger *slog.Logger) *limitedServer {
	limit := connlimit.New(maxConnections, listener, logger)
	return &limitedServer{limit: limit, Server: &http.Server{
		Handler:           h,
		ReadTimeout:       readTimeout,
		ReadHeaderTimeout: readHeaderTimeout,
		WriteTimeout:      collectionTimeout + writeSlack,
		IdleTimeout:       idleTimeout,
		ConnState:         limit.ConnState,
		// TLS handshake failures and the like go through the exporter's own log and its format, rate-limited.
		ErrorLog: errorLog(logger, errorLogInterval),
	}}
}

// CheckMetricsPath refuses a metrics path that the HTTP mux would panic on or could never match: one taken by the
// health paths, one with a query or fragment (a request's path never has one), one that a request's path is cleaned
// of (the mux redirects "/a/../b" to "/b").
func CheckMetricsPath(path string) error {
	switch {
	case !strings.HasPrefix(path, "/"):
		return fmt.Errorf("%q must start with /", path)
	case strings.ContainsAny(path, " \t{}"):
		return fmt.Errorf("%q is not a plain URL path", path)
	case strings.ContainsAny(path, "?#"):
		return fmt.Errorf("%q has a query or fragment, which no request's path matches", path)
	case path == HealthzPath || path == ReadyzPath:
		return fmt.Errorf("%s is served by the exporter already", path)
	}
	if clean := pathpkg.Clean(path); clean != path && clean+"/" != path {
		return fmt.Errorf("%q is not a clean path (requests for it are redirected to %q)", path, clean)
	}
	return nil
}
