// Command gpu-pod-exporter tells which pod, container, Slurm job or service uses each GPU, and how much of it.
// It serves Prometheus metrics, or with `ps` prints one attributed process table and exits.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/promslog"
	promslogflag "github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	webflag "github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/scrape"
)

const program = "gpu_pod_exporter"

func main() {
	stampVersion()
	os.Exit(run(os.Args[1:]))
}

// stampVersion fills in what `make build` did not stamp (go run, go install) from the Go build information, so that
// gpu_pod_exporter_build_info never says version="".
func stampVersion() {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	if version.Version == "" {
		version.Version = strings.TrimPrefix(info.Main.Version, "v")
		if version.Version == "" || version.Version == "(devel)" {
			version.Version = "dev"
		}
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && (version.Revision == "" || version.Revision == "unknown") {
			version.Revision = s.Value
		}
	}
}

func run(args []string) int {
	app := kingpin.New("gpu-pod-exporter", "Tells which pod, container, Slurm job or service uses each GPU, and how much "+
		"of it. The server's own flags (listen address, TLS, allocations, compatibility output) are listed by "+
		"`gpu-pod-exporter help serve`.")
	app.Version(version.Print(program))
	app.HelpFlag.Short('h')

	// Flags of both commands: where GPU data comes from and how processes are attributed.
	var sf sourceFlags
	sf.register(app)
	var af attributionFlags
	af.register(app)
	timeout := app.Flag("collection.timeout", "How long a scrape waits for a reading of the GPUs and their processes.").
		Default("8s").Duration()
	logConfig := &promslog.Config{}
	promslogflag.AddFlags(app, logConfig)

	serve := app.Command("serve", "Serve Prometheus metrics (the default).").Default()
	metricsPath := serve.Flag("web.telemetry-path", "Path under which to expose metrics.").Default("/metrics").String()
	webConfig := webflag.AddFlags(serve, ":9402")
	processes := serve.Flag("collector.processes", "Export per-process series (gpu_process_*).").Default("true").Bool()
	compat := registerCompat(serve)
	kf := registerKubelet(serve)

	psCmd := app.Command("ps", "Print the GPU processes with their pods, containers, Slurm jobs and services, then exit.")
	output := psCmd.Flag("output", "Output format: table or json.").Short('o').Default("table").Enum("table", "json")

	command, err := app.Parse(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %v (try --help)\n", err)
		return 2
	}
	logger := promslog.New(logConfig)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	source, err := sf.open(ctx, logger)
	if err != nil {
		logger.Error("cannot read GPUs", "err", err)
		return 1
	}
	defer source.Close()
	// What a source offers beyond hardware (the simulated node's preset owners and allocations), checked once.
	preset, _ := source.(attribution.Preset)
	offer, _ := source.(allocationOffer)
	attributor, err := af.open(logger, preset, sf.demo, command == psCmd.FullCommand())
	if err != nil {
		logger.Error("cannot attribute GPU processes", "err", err)
		return 1
	}
	defer attributor.Close()
	scraper := scrape.New(source, attributor, *timeout, logger)

	switch command {
	case psCmd.FullCommand():
		return runPS(ctx, scraper, *output)
	default:
		opts := collector.Options{Processes: *processes, PodLabels: splitList(af.podLabels)}
		compat.apply(&opts)
		allocs, err := kf.start(ctx, logger, offer)
		if err != nil {
			logger.Error("cannot read GPU allocations from the kubelet", "err", err)
			return 1
		}
		defer allocs.stop()
		opts.Allocations = allocs.source
		self := append([]prometheus.Collector{attributor}, allocs.self...)
		return runServer(ctx, logger, collector.New(scraper, opts, self...), *metricsPath, webConfig)
	}
}

// flagGroup is a command or the application: where flags are registered.
type flagGroup interface {
	Flag(name, help string) *kingpin.FlagClause
}

func runPS(ctx context.Context, scraper *scrape.Scraper, output string) int {
	r, err := scraper.Scrape(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter ps: %v\n", err)
		return 1
	}
	rows := ps.Rows(r)
	if output == "json" {
		err = ps.WriteJSON(os.Stdout, rows)
	} else {
		err = ps.WriteTable(os.Stdout, r.Snapshot, rows)
	}
	for _, e := range r.Snapshot.Errors {
		if e.Index < 0 {
			fmt.Fprintf(os.Stderr, "warning: %v\n", e)
		} else {
			fmt.Fprintf(os.Stderr, "warning: GPU %d: %v\n", e.Index, e)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter ps: writing output: %v\n", err)
		return 1
	}
	return 0
}

func runServer(ctx context.Context, logger *slog.Logger, c prometheus.Collector, metricsPath string, webConfig *web.FlagConfig) int {
	registry := prometheus.NewRegistry()
	registry.MustRegister(versioncollector.NewCollector(program), c)

	mux := http.NewServeMux()
	mux.Handle(metricsPath, promhttp.HandlerFor(registry, promhttp.HandlerOpts{
		ErrorLog:            slog.NewLogLogger(logger.Handler(), slog.LevelError),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 8,
	}))
	if metricsPath != "/" {
		landing, err := web.NewLandingPage(web.LandingConfig{
			Name:        "GPU Pod Exporter",
			Description: "Which pod, container, Slurm job or service uses each GPU, and how much of it.",
			Version:     version.Info(),
			Links:       []web.LandingLinks{{Address: metricsPath, Text: "Metrics"}},
		})
		if err != nil {
			logger.Error("building the landing page", "err", err)
			return 1
		}
		mux.Handle("/", landing)
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	logger.Info("starting gpu-pod-exporter", "version", version.Info())
	errc := make(chan error, 1)
	go func() { errc <- web.ListenAndServe(server, webConfig, logger) }()
	select {
	case err := <-errc:
		logger.Error("serving metrics", "err", err)
		return 1
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := server.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Warn("shutting down", "err", err)
		}
		return 0
	}
}
