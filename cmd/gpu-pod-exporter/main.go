// Command gpu-pod-exporter tells which pod, container, Slurm job or service uses each GPU, and how much of it.
// It serves Prometheus metrics, or with `ps` prints the attributed process table, or with `top` shows it live.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/promslog"
	promslogflag "github.com/prometheus/common/promslog/flag"
	"github.com/prometheus/common/version"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
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
	var timeout time.Duration
	durationFlag(app, "collection.timeout", "How long a scrape waits for a reading of the GPUs and their processes.",
		8*time.Second, &timeout)
	logConfig := registerLog(app)

	serve := app.Command("serve", "Serve Prometheus metrics (the default).").Default()
	var wf webFlags
	wf.register(serve, &timeout)
	processes := serve.Flag("collector.processes", "Export per-process series (gpu_process_*).").Default("true").Bool()
	compat := registerCompat(serve)
	pu := registerProcessUser(serve)
	kf := registerKubelet(serve)

	psCmd := app.Command("ps", "Print the GPU processes with their pods, containers, Slurm jobs and services, once (with --watch, every --interval).")
	psf := registerPS(psCmd)
	topCmd, tf := registerTop(app)

	command, err := app.Parse(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %v (try --help)\n", err)
		return 2
	}
	// ps and top are for a person at a terminal: the server's flags are not theirs, and each problem is one plain
	// line, the structured log being for --log.level=debug.
	once := command == psCmd.FullCommand() || command == topCmd.FullCommand()
	if err := checkFlags(&sf, &af, kf, &wf, once); err != nil {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %v\n", err)
		return 2
	}
	if check := map[string]func() error{psCmd.FullCommand(): psf.check, topCmd.FullCommand(): tf.check}[command]; check != nil {
		if err := check(); err != nil {
			fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %v\n", err)
			return 2
		}
	}
	// Users are a server flag: ps shows no user.
	userLookup := !once && pu.on(sf.demo)
	if userLookup {
		if err := pu.check(); err != nil {
			fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %v\n", err)
			return 2
		}
	}
	stderr := io.Writer(os.Stderr)
	if command == topCmd.FullCommand() {
		stderr = tf.logWriter() // held back while the view owns the terminal
	}
	logger := promslog.New(logConfig)
	if once {
		// A command prints one human line per problem on stderr; its log is for --log.level=debug only.
		logger = cliLogger(logConfig, stderr)
	}
	warnings := startupWarnings(&af, kf, once)
	if userLookup {
		warnings = append(warnings, pu.warnings(sf.demo)...)
	}
	for _, w := range warnings {
		logger.Warn(w)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	source, err := sf.open(ctx, logger)
	if err != nil {
		return fail(once, logger, "cannot read GPUs", err)
	}
	defer source.Close()
	// What a source offers beyond hardware (the simulated node's preset owners and allocations), checked once.
	preset, _ := source.(attribution.Preset)
	offer, _ := source.(allocationOffer)
	if userLookup {
		af.users = pu.resolver(af.procfs)
	}
	attributor, err := af.open(logger, preset, sf.demo, once)
	if err != nil {
		return fail(once, logger, "cannot attribute GPU processes", err)
	}
	defer attributor.Close()
	reader := reading.New(source, attributor, timeout, logger)

	switch command {
	case psCmd.FullCommand():
		return runPS(ctx, reader, psf)
	case topCmd.FullCommand():
		return tf.run(ctx, logger, offer, reader)
	default:
		opts := collector.Options{Processes: *processes, PodLabels: splitList(af.podLabels), ProcessUser: af.users != nil}
		compat.apply(&opts)
		allocs, err := kf.start(ctx, logger, offer)
		if err != nil {
			return fail(once, logger, "cannot read GPU allocations from the kubelet", err)
		}
		defer allocs.stop()
		opts.Allocations = allocs.source
		self := append([]prometheus.Collector{attributor}, allocs.self...)
		if c, ok := source.(prometheus.Collector); ok { // sources with self-metrics (NVML's XID watcher)
			self = append(self, c)
		}
		summary := startupSummary{source: source, procfs: af.procfs, runtimes: af.runtimes(), kubelet: allocs.describe}
		return runServer(ctx, logger, reader, collector.New(reader, opts, self...), &wf, summary)
	}
}

// checkFlags validates, before anything starts, what the flag parser cannot: values that depend on the
// filesystem or on each other. Its errors name the flag.
func checkFlags(sf *sourceFlags, af *attributionFlags, kf *kubeletFlags, wf *webFlags, once bool) error {
	if err := sf.check(); err != nil {
		return err
	}
	if err := af.check(); err != nil {
		return err
	}
	if once {
		return nil
	}
	if err := kf.check(); err != nil {
		return err
	}
	return wf.check()
}

// startupWarnings are the flags that point at nothing yet: the exporter starts (the runtime or kubelet may come
// up later, and a test tree may stand in for procfs), and says so once, naming the flag.
func startupWarnings(af *attributionFlags, kf *kubeletFlags, once bool) []string {
	ws := af.warnings()
	if !once {
		ws = append(ws, kf.warnings()...)
	}
	return ws
}

// fail reports a startup failure: a log line for the server, one human line for a command.
func fail(once bool, logger *slog.Logger, what string, err error) int {
	if once {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %s: %v\n", what, err)
	} else {
		logger.Error(what, "err", err)
	}
	return 1
}

// registerLog registers --log.level and --log.format with errors that name the flag.
func registerLog(app *kingpin.Application) *promslog.Config {
	c := &promslog.Config{Level: promslog.NewLevel(), Format: promslog.NewFormat()}
	app.Flag(promslogflag.LevelFlagName, promslogflag.LevelFlagHelp).Default("info").
		SetValue(namedValue{flag: promslogflag.LevelFlagName, Value: c.Level})
	app.Flag(promslogflag.FormatFlagName, promslogflag.FormatFlagHelp).Default("logfmt").
		SetValue(namedValue{flag: promslogflag.FormatFlagName, Value: c.Format})
	return c
}

// cliLogger is the log of a one-shot command: warnings and errors as one plain line each on stderr, and the
// structured log only when --log.level=debug asks for it.
func cliLogger(c *promslog.Config, stderr io.Writer) *slog.Logger {
	if c.Level.String() == "debug" {
		return promslog.New(&promslog.Config{Level: c.Level, Format: c.Format, Writer: stderr})
	}
	return slog.New(&humanHandler{w: stderr})
}

// humanHandler writes warnings and errors as "gpu-pod-exporter: warning: message (key value, ...)", escaped for
// the terminal: a runtime's error text or a cgroup path in a message is the node's, not ours.
type humanHandler struct {
	mu    sync.Mutex
	w     io.Writer
	attrs []slog.Attr
}

func (h *humanHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *humanHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("gpu-pod-exporter: warning: ")
	b.WriteString(terminal.Escape(r.Message))
	var details []string
	add := func(a slog.Attr) bool {
		details = append(details, a.Key+" "+a.Value.String())
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	if len(details) > 0 {
		b.WriteString(" (" + terminal.Escape(strings.Join(details, ", ")) + ")")
	}
	b.WriteString("\n")
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *humanHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &humanHandler{w: h.w, attrs: append(slices.Clip(h.attrs), attrs...)}
}

func (h *humanHandler) WithGroup(string) slog.Handler { return h }

// flagGroup is a command or the application: where flags are registered.
type flagGroup interface {
	Flag(name, help string) *kingpin.FlagClause
}
