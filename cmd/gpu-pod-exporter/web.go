package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	webflag "github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/exposition"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// Server timeouts. A scrape may wait up to --collection.timeout for a reading before its body is written, so the
// write deadline is that plus the time a slow but live client needs for a large body; a client that stops reading
// is cut off then instead of holding a connection (and its memory) for ever. Idle keep-alive connections, which
// Prometheus reuses between scrapes, are closed after a few scrape intervals.
const (
	readTimeout       = 30 * time.Second
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
	writeSlack        = 30 * time.Second
)

// webFlags are the HTTP server's flags.
type webFlags struct {
	metricsPath string
	healthAddr  string
	toolkit     *web.FlagConfig
}

func (f *webFlags) register(g flagHost) {
	g.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").StringVar(&f.metricsPath)
	g.Flag("web.health-listen-address", "Also serve /healthz and /readyz, and nothing else, over plain HTTP on this "+
		"address, for probes that cannot authenticate when --web.config.file turns on basic auth or client "+
		"certificates. Off by default: /healthz and /readyz are always served on the main listener too.").
		PlaceHolder("ADDRESS").StringVar(&f.healthAddr)
	f.toolkit = webflag.AddFlags(g, ":9402")
}

func (f *webFlags) check() error {
	if err := checkTelemetryPath(f.metricsPath); err != nil {
		return err
	}
	if p := *f.toolkit.WebConfigFile; p != "" {
		if err := web.Validate(p); err != nil {
			return flagError("web.config.file", "%v", err)
		}
	}
	if f.healthAddr != "" {
		if _, _, err := net.SplitHostPort(f.healthAddr); err != nil {
			return flagError("web.health-listen-address", "%v", err)
		}
	}
	return nil
}

func (f *webFlags) warnings() []string { return nil }

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

// runServer serves until ctx ends. A scrape waits up to collectionTimeout for a reading.
func runServer(ctx context.Context, logger *slog.Logger, reader *reading.Reader, c *collector.Gatherer, f *webFlags,
	collectionTimeout time.Duration, summary startupSummary) int {
	self := c.Registerer()
	self.MustRegister(
		versioncollector.NewCollector(program),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)

	ready := &readiness{reader: reader}
	mux := http.NewServeMux()
	mux.Handle(f.metricsPath, promhttp.InstrumentMetricHandler(self, exposition.New(c, logger)))
	mux.HandleFunc("/healthz", healthz)
	mux.Handle("/readyz", ready)
	if f.metricsPath != "/" {
		landing, err := web.NewLandingPage(web.LandingConfig{
			Name:        "GPU Pod Exporter",
			Description: "Which pod, container, Slurm job or service uses each GPU, and how much of it.",
			Version:     version.Info(),
			Links: []web.LandingLinks{
				{Address: f.metricsPath, Text: "Metrics"},
				{Address: "/healthz", Text: "Health"},
				{Address: "/readyz", Text: "Readiness"},
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
	server := newServer(mux, collectionTimeout, logger)

	logger.Info("starting gpu-pod-exporter", "version", version.Info(), "listen", strings.Join(*f.toolkit.WebListenAddresses, ","),
		"telemetry_path", f.metricsPath)
	errc := make(chan error, 2)
	go func() { errc <- web.ListenAndServe(server, f.toolkit, logger) }()
	var health *http.Server
	if f.healthAddr != "" {
		hmux := http.NewServeMux()
		hmux.HandleFunc("/healthz", healthz)
		hmux.Handle("/readyz", ready)
		health = newServer(hmux, collectionTimeout, logger)
		health.Addr = f.healthAddr
		logger.Info("serving probes over plain HTTP", "address", f.healthAddr)
		go func() { errc <- health.ListenAndServe() }()
	}
	go func() {
		r, err := reader.Read(ctx)
		if err == nil {
			ready.ready.Store(true)
		}
		summary.log(logger, r, err)
	}()

	select {
	case err := <-errc:
		logger.Error("serving metrics", "err", err)
		return 1
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range []*http.Server{server, health} {
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

func newServer(h http.Handler, collectionTimeout time.Duration, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadTimeout:       readTimeout,
		ReadHeaderTimeout: readHeaderTimeout,
		WriteTimeout:      collectionTimeout + writeSlack,
		IdleTimeout:       idleTimeout,
		// TLS handshake failures and the like go through the exporter's own log and its format.
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}
