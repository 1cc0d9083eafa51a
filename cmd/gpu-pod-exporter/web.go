package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/exporter-toolkit/web"
	webflag "github.com/prometheus/exporter-toolkit/web/kingpinflag"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/exposition"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/server"
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
		"one; a new one is refused only while all are in use.", server.DefaultMaxConnections, 1, &f.maxConnections)
}

func (f *webFlags) check() error {
	if err := server.CheckMetricsPath(f.metricsPath); err != nil {
		return flagError("web.telemetry-path", "%v", err)
	}
	if p := *f.toolkit.WebConfigFile; p != "" {
		if err := server.CheckWebConfig(p); err != nil {
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
			if err := server.CheckListenAddress(a); err != nil {
				return flagError("web.listen-address", "%v", err)
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

// open opens the listeners the flags name; an error names the flag.
func (f *webFlags) open() (server.Listeners, error) {
	main, err := server.Listen(*f.toolkit.WebListenAddresses, systemdSocket(f.toolkit))
	if err != nil {
		flag := "web.listen-address"
		if systemdSocket(f.toolkit) {
			flag = "web.systemd-socket"
		}
		return server.Listeners{}, flagError(flag, "%v", err)
	}
	ls := server.Listeners{Main: main}
	if f.healthAddr != "" {
		if ls.Health, err = net.Listen("tcp", f.healthAddr); err != nil {
			ls.Close()
			return server.Listeners{}, flagError("web.health-listen-address", "%v", err)
		}
	}
	return ls, nil
}

// systemdSocket reports --web.systemd-socket, which the toolkit offers on Linux only.
func systemdSocket(f *web.FlagConfig) bool { return f.WebSystemdSocket != nil && *f.WebSystemdSocket }

// runServer serves the node's metrics on ls until ctx ends, and logs what the first reading found. A scrape waits
// up to collectionTimeout for a reading.
func runServer(ctx context.Context, logger *slog.Logger, reader *reading.Reader, c *collector.Gatherer, f *webFlags,
	ls server.Listeners, collectionTimeout time.Duration, hangups <-chan os.Signal, summary startupSummary) int {
	self := c.Registerer()
	self.MustRegister(
		versioncollector.NewCollector(program),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	srv, err := server.Start(server.Config{
		MetricsPath:       f.metricsPath,
		Metrics:           exposition.New(c, logger),
		Ready:             func(ctx context.Context) error { _, err := reader.Read(ctx); return err },
		Registry:          self,
		WebConfigFile:     *f.toolkit.WebConfigFile,
		MaxConnections:    f.maxConnections,
		CollectionTimeout: collectionTimeout,
		Logger:            logger,
	}, ls)
	if err != nil {
		logger.Error("cannot serve", "err", err)
		return 1
	}
	go func() {
		r, err := reader.Read(ctx)
		if err == nil {
			srv.MarkReady()
		}
		summary.log(logger, r, err)
	}()
	go func() {
		for {
			select {
			case <-hangups:
				// What a reload would read again is read again anyway: the web configuration when it changes, the
				// GPUs and processes at each scrape. A SIGHUP (a closed terminal, a reload by habit) must not stop
				// the exporter.
				logger.Info("SIGHUP received; nothing to reload, carrying on")
			case <-ctx.Done():
				return
			}
		}
	}()
	if err := srv.Wait(ctx); err != nil {
		logger.Error("serving metrics", "err", err)
		return 1
	}
	return 0
}
