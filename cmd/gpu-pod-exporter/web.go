package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	webflag "github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/connlimit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/exposition"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// Server timeouts. A scrape may wait up to --collection.timeout for a reading before its body is written, so the
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

// defaultMaxConnections bounds the connections held open: a few Prometheus servers and probes use a handful, and
// 512 idle ones cost about 10 MB, well within the chart's memory limit.
const defaultMaxConnections = 512

// maxStreams bounds the HTTP/2 streams of one connection, when the web configuration turns HTTP/2 on.
const maxStreams = 32

// The health listener's paths, which the metrics path must not take.
const (
	healthzPath = "/healthz"
	readyzPath  = "/readyz"
)

// webFlags are the HTTP server's flags.
type webFlags struct {
	metricsPath    string
	healthAddr     string
	toolkit        *web.FlagConfig
	maxConnections int
}

func (f *webFlags) register(g flagHost) {
	g.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&f.metricsPath)
	g.Flag("web.health-listen-address", "Also serve /healthz and /readyz, and nothing else, over plain HTTP on this "+
		"address, for probes that cannot authenticate when --web.config.file turns on basic auth or client "+
		"certificates. Off by default: /healthz and /readyz are always served on the main listener too.").
		PlaceHolder("ADDRESS").StringVar(&f.healthAddr)
	f.toolkit = webflag.AddFlags(g, ":9402")
	intFlag(g, "web.max-connections", "Connections held open at once, on the listen addresses together (and as many "+
		"more on --web.health-listen-address). At the limit, the connection idle the longest is closed for a new "+
		"one; a new one is refused only while all are in use.", defaultMaxConnections, 1, &f.maxConnections)
}

func (f *webFlags) check() error {
	if err := checkTelemetryPath(f.metricsPath, healthzPath, readyzPath); err != nil {
		return err
	}
	if p := *f.toolkit.WebConfigFile; p != "" {
		if err := checkWebConfig(p); err != nil {
			return flagError("web.config.file", "%v", err)
		}
	}
	if f.healthAddr != "" {
		if _, _, err := net.SplitHostPort(f.healthAddr); err != nil {
			return flagError("web.health-listen-address", "%v", err)
		}
	}
	if !systemdSocket(f.toolkit) {
		for _, a := range *f.toolkit.WebListenAddresses {
			if err := checkListenAddress(a); err != nil {
				return err
			}
		}
	}
	return nil
}

// warnings: a connection limit the process's file descriptor limit cannot hold.
func (f *webFlags) warnings() []string {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil
	}
	// The exporter's own files (sockets to runtimes and the kubelet, procfs reads) need some too.
	const reserve = 64
	if lim.Cur < reserve || uint64(f.maxConnections) > lim.Cur-reserve {
		return []string{fmt.Sprintf("--web.max-connections: %d is more than the %d file descriptors this process may "+
			"open leave for connections; connections past that fail to be accepted", f.maxConnections, lim.Cur)}
	}
	return nil
}

// startupSummary is what the exporter logs once it has read the node for the first time.
type startupSummary struct {
	source   gpu.Source
	procfs   string
	runtimes []string
	kubelet  string
}

// log writes one line that says what the exporter found: the source and its GPUs, procfs, runtimes, kubelet.
func (s startupSummary) log(logger *slog.Logger, r *reading.Reading, err error) {
	args := []any{"gpu_source", s.source.Name(), "procfs", s.procfs, "runtimes", strings.Join(s.runtimes, ","),
		"allocations", s.kubelet}
	if err != nil {
		logger.Error("first reading of the GPUs failed; serving self-metrics until a reading succeeds",
			append(args, "err", err)...)
		return
	}
	snap := r.Snapshot
	mig := 0
	for _, d := range snap.Devices {
		if d.MIGMode == gpu.MIGEnabled {
			mig++
		}
	}
	args = append(args, "driver", snap.DriverVersion, "gpus", len(snap.Devices), "mig_enabled_gpus", mig,
		"gpu_processes", len(r.Owners), "device_errors", len(snap.Errors))
	if snap.Simulated {
		logger.Info("first reading of a SIMULATED node: no real GPU is read", args...)
		return
	}
	logger.Info("first reading of the GPUs", args...)
}

// readiness is /readyz: ready once a reading has succeeded. Until then each probe tries a reading (shared with
// any scrape in flight, bounded by the collection timeout).
type readiness struct {
	reader *reading.Reader
	ready  atomic.Bool
}

func (rd *readiness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !rd.ready.Load() {
		if _, err := rd.reader.Read(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		rd.ready.Store(true)
	}
	fmt.Fprintln(w, "ok")
}

func healthz(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }

// runServer serves on ls until ctx ends. A scrape waits up to collectionTimeout for a reading.
func runServer(ctx context.Context, logger *slog.Logger, reader *reading.Reader, c *collector.Gatherer, f *webFlags,
	ls listeners, collectionTimeout time.Duration, hangups <-chan os.Signal, summary startupSummary) int {
	self := c.Registerer()
	self.MustRegister(
		versioncollector.NewCollector(program),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)

	ready := &readiness{reader: reader}
	mux := http.NewServeMux()
	mux.Handle(f.metricsPath, promhttp.InstrumentMetricHandler(self, exposition.New(c, logger)))
	mux.HandleFunc(healthzPath, healthz)
	mux.Handle(readyzPath, ready)
	if f.metricsPath != "/" {
		landing, err := web.NewLandingPage(web.LandingConfig{
			Name:        "GPU Pod Exporter",
			Description: "Which pod, container, Slurm job or service uses each GPU, and how much of it.",
			Version:     version.Info(),
			Links: []web.LandingLinks{
				{Address: f.metricsPath, Text: "Metrics"},
				{Address: healthzPath, Text: "Health"},
				{Address: readyzPath, Text: "Readiness"},
			},
			// No pprof is served, so the page must not link it.
			Profiling: "false",
		})
		if err != nil {
			logger.Error("building the landing page", "err", err)
			return 1
		}
		mux.Handle("/", landing)
	}
	server := newServer(mux, collectionTimeout, f.maxConnections, "web", logger)
	self.MustRegister(server.limit)
	var tlsOn, http2On bool
	if path := *f.toolkit.WebConfigFile; path != "" {
		wc := &webConfigFile{path: path}
		cfg, err := wc.current()
		if err != nil {
			logger.Error("reading the web configuration", "file", path, "err", err)
			return 1
		}
		guard := newGuard(wc, cfg, mux, logger)
		self.MustRegister(guard.checker)
		server.Handler = guard
		if tlsOn = cfg.TLSConfig.IsEnabled(); tlsOn {
			http2On = cfg.HTTPConfig.HTTP2
			server.TLSConfig = wc.tlsConfig(http2On)
		}
	}
	server.Protocols = new(http.Protocols)
	server.Protocols.SetHTTP1(true)
	server.Protocols.SetHTTP2(http2On)
	// A scraper asks for one thing at a time. The HTTP/2 server starts a handler for each stream, even one reset as
	// it was sent, up to this many at once and queues 4 times as many before it closes the connection.
	server.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: maxStreams}

	logger.Info("starting gpu-pod-exporter", "version", version.Info(), "listen", strings.Join(*f.toolkit.WebListenAddresses, ","),
		"telemetry_path", f.metricsPath)
	errc := make(chan error, len(ls.main)+1)
	for _, l := range ls.main {
		logger.Info("Listening on", "address", l.Addr().String())
		if tlsOn {
			logger.Info("TLS is enabled.", "http2", http2On, "address", l.Addr().String())
		} else {
			logger.Info("TLS is disabled.", "http2", false, "address", l.Addr().String())
		}
		l = server.limit.Listen(l)
		go func() {
			if tlsOn {
				errc <- server.ServeTLS(l, "", "")
			} else {
				errc <- server.Serve(l)
			}
		}()
	}
	var health *limitedServer
	if f.healthAddr != "" {
		hmux := http.NewServeMux()
		hmux.HandleFunc(healthzPath, healthz)
		hmux.Handle(readyzPath, ready)
		health = newServer(hmux, collectionTimeout, f.maxConnections, "health", logger)
		self.MustRegister(health.limit)
		logger.Info("serving probes over plain HTTP", "address", ls.health.Addr().String())
		go func() { errc <- health.Serve(health.limit.Listen(ls.health)) }()
	}
	go func() {
		r, err := reader.Read(ctx)
		if err == nil {
			ready.ready.Store(true)
		}
		summary.log(logger, r, err)
	}()

	for {
		select {
		case err := <-errc:
			logger.Error("serving metrics", "err", err)
			return 1
		case <-hangups:
			// What a reload would read again is read again anyway: the web configuration when it changes, the GPUs
			// and processes at each scrape. A SIGHUP (a closed terminal, a reload by habit) must not stop the exporter.
			logger.Info("SIGHUP received; nothing to reload, carrying on")
		case <-ctx.Done():
			shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for _, s := range []*limitedServer{server, health} {
				if s == nil {
					continue
				}
				if err := s.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
					logger.Warn("shutting down", "err", err)
				}
			}
			return 0
		}
	}
}

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
		ErrorLog: serverErrorLog(logger, serverLogInterval),
	}}
}
