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
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/version"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/clidoc"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/server"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
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
	args = demoArgs(args)
	app := kingpin.New("gpu-pod-exporter", strings.ToUpper(summary[:1])+summary[1:]+". Without a command it serves "+
		"Prometheus metrics; ps prints the GPU processes with their owners, top watches them live. --demo runs any "+
		"of them on a built-in simulated node, with no GPU.")
	app.Version(version.Print(program))
	app.HelpFlag.Short('h')
	app.UsageWriter(os.Stdout) // asked-for help and version are output, for a pager or grep; errors go to stderr

	// Flags of every command: where GPU data comes from, how processes are attributed, how long a reading may take,
	// and the log.
	var (
		sf sourceFlags
		af attributionFlags
		rf readingFlags
		lf logFlags
	)
	common := []flagGroup{&sf, &af, &rf, &lf}
	for _, g := range common {
		g.register(app)
	}
	var (
		wf  webFlags
		cf  collectorFlags
		pu  = processUserFlags{demo: &sf.demo}
		kf  kubeletFlags
		psf psFlags
		tf  topFlags
		tkf kubeletFlags // top's own, for its allocation signals
		// With --prometheus, ps and top read the whole cluster instead of this node.
		ppf = prometheusFlags{source: &sf}
		tpf = prometheusFlags{source: &sf}
	)
	af.readsNode = func() bool { return !sf.demo && !ppf.on() && !tpf.on() }
	serve := addCommand(app, "serve", "Serve Prometheus metrics (the default).", false, &wf, &cf, &pu, &kf)
	serve.clause.Default()
	psCmd := addCommand(app, "ps", "Print the GPU processes with their pods, containers, Slurm jobs and services, once "+
		"(with --watch, every --interval).", true, &psf, &pu, &ppf)
	topCmd := addCommand(app, "top", "Watch the GPUs and the pods, containers, Slurm jobs and services using them, live. "+
		"Keys: m, s, g, a sort by memory, SM, GPU or age; w groups by workload; / filters by any text of a row, or "+
		"user:, gpu:, ns:, node:, pid:, owner: for one field; arrows or j, k move the cursor and Enter shows the "+
		"process under it; e lists the signals and warnings; ? shows the keys; q quits. "+
		"When the output is not a terminal, prints a plain table every --interval. With --prometheus, the whole cluster: "+
		"a line per node; n shows each node's GPUs.", true, &tf, &pu, &tkf, &tpf)
	readers := []*command{serve, psCmd, topCmd}
	versionCmd := app.Command("version", "Print the version and exit (as --version does).")
	completionCmd := app.Command("completion", "Print the shell completion script for bash, zsh or fish; the .deb and "+
		".rpm packages install them. bash: source <(gpu-pod-exporter completion bash).")
	shell := completionCmd.Arg("shell", strings.Join(clidoc.Shells, ", ")).Required().Enum(clidoc.Shells...)
	useUsage(app, serve)

	chosen, err := app.Parse(args)
	if err != nil {
		msg, try := err.Error(), "--help"
		if ctx, _ := app.ParseContext(args); ctx != nil {
			given := serve.clause.FullCommand()
			if ctx.SelectedCommand != nil {
				given = ctx.SelectedCommand.FullCommand()
			}
			if hint, help := flagHint(err, given, readers); hint != "" {
				msg, try = msg+": "+hint, help
			}
		}
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %s (try %s)\n", msg, try)
		return 2
	}
	switch chosen {
	case versionCmd.FullCommand():
		fmt.Println(version.Print(program))
		return 0
	case completionCmd.FullCommand():
		args := map[string][]string{completionCmd.FullCommand(): clidoc.Shells}
		if err := clidoc.WriteCompletion(os.Stdout, *shell, app, serve.clause.FullCommand(), args); err != nil {
			fmt.Fprintf(os.Stderr, "gpu-pod-exporter completion: %v\n", err)
			return 1
		}
		return 0
	}
	cmd := serve
	for _, c := range readers {
		if c.clause.FullCommand() == chosen {
			cmd = c
		}
	}
	groups := append(slices.Clip(common), cmd.groups...)
	for _, g := range groups {
		if err := g.check(); err != nil {
			fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %v\n", err)
			return 2
		}
	}
	stderr := io.Writer(os.Stderr)
	if cmd == topCmd {
		stderr = tf.logWriter() // held back while the view owns the terminal
	}
	logger := lf.serverLogger()
	if cmd.forPerson {
		logger = lf.cliLogger(stderr)
	}
	for _, g := range groups {
		for _, w := range g.warnings() {
			logger.Warn(w)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The server carries on through a SIGHUP; ps and top end with their terminal, as commands do. Caught before
	// the server listens: whoever sees its port open may signal it at once.
	hangups := make(chan os.Signal, 1)
	if cmd == serve {
		signal.Notify(hangups, syscall.SIGHUP)
		defer signal.Stop(hangups)
	}

	// The server's sockets before anything else starts: a port taken is then the only line it prints.
	var ls server.Listeners
	if cmd == serve {
		if ls, err = wf.open(); err != nil {
			return fail(false, logger, "cannot listen", err)
		}
		defer ls.Close()
	}

	// Reading the cluster from Prometheus needs no GPU, procfs or kubelet of this node.
	switch {
	case cmd == psCmd && ppf.on():
		return runClusterPS(ctx, &ppf, &psf)
	case cmd == topCmd && tpf.on():
		return tf.runCluster(ctx, &tpf)
	}

	// One budget of process files kept open between readings, for the source (the drm source's DRM files) and
	// attribution together.
	keptBudget, _ := procfs.KeptFileBudget(wf.maxConnections) // no connections unless serving
	af.kept = procfs.NewKeptFiles(keptBudget)
	source, err := sf.open(ctx, logger, af.procfs, af.kept)
	if err != nil {
		return fail(cmd.forPerson, logger, "cannot read GPUs", err)
	}
	defer source.Close()
	// What a source offers beyond hardware (the simulated node's preset owners and allocations), checked once.
	preset, _ := source.(attribution.Preset)
	offer, _ := source.(allocationOffer)
	if pu.on() {
		af.users = pu.resolver(af.procfs)
	}
	attributor, err := af.open(logger, preset, sf.demo, cmd.forPerson)
	if err != nil {
		return fail(cmd.forPerson, logger, "cannot attribute GPU processes", err)
	}
	defer attributor.Close()
	readerLog := logger
	if cmd.forPerson {
		// ps and top print each reading's failure and warnings themselves: the reader's log of the source's state
		// would say each a second time.
		readerLog = slog.New(slog.DiscardHandler)
	}
	reader := reading.New(source, attributor, rf.timeout, readerLog)

	switch cmd {
	case psCmd:
		return runPS(ctx, &psf, func(ctx context.Context) (*view.Reading, error) { return readNode(ctx, reader) })
	case topCmd:
		var host func(uint32, time.Time) view.Host
		if !sf.demo && sf.simulatedConfig == "" {
			host = hostReader(af.procfs, attributor.Boot()) // a simulated node's processes are not this host's
		}
		return tf.run(ctx, logger, &tkf, offer, reader, host)
	}
	opts := collector.Options{PodLabels: splitList(af.podLabels), ProcessUser: af.users != nil}
	cf.apply(&opts)
	allocs, err := kf.start(ctx, logger, offer)
	if err != nil {
		return fail(cmd.forPerson, logger, "cannot read GPU allocations from the kubelet", err)
	}
	defer allocs.stop()
	opts.Allocations = allocs.source
	self := append([]prometheus.Collector{attributor, af.kept}, allocs.self...)
	self = append(self, sourceCollectors(source)...) // sources with self-metrics (NVML's XID watcher)
	summary := startupSummary{source: source, procfs: af.procfs, runtimes: af.runtimes(), kubelet: allocs.describe}
	return runServer(ctx, logger, reader, collector.New(reader, opts, self...), &wf, ls, rf.timeout, hangups, summary)
}

// command is one of the exporter's commands, with the groups of its own flags.
type command struct {
	clause *kingpin.CmdClause
	groups []flagGroup
	// forPerson: ps and top are for a person at a terminal. The server's flags are not theirs, each problem is one
	// plain line on stderr (the structured log being for --log.level=debug), and a lookup of names waits as long as
	// one runtime call may take, there being no next scrape to fill them in.
	forPerson bool
}

// addCommand adds a command to app and registers its flag groups on it.
func addCommand(app *kingpin.Application, name, help string, forPerson bool, groups ...flagGroup) *command {
	c := &command{clause: app.Command(name, help), groups: groups, forPerson: forPerson}
	for _, g := range groups {
		g.register(c.clause)
	}
	return c
}

// readingFlags bound a reading of the node.
type readingFlags struct {
	noChecks
	timeout time.Duration
}

func (f *readingFlags) register(app flagHost) {
	durationFlag(app, "collection.timeout", "How long a scrape waits for a reading of the GPUs and their processes.",
		8*time.Second, &f.timeout)
}

// fail reports a startup failure: a log line for the server, one human line for a command for a person.
func fail(forPerson bool, logger *slog.Logger, what string, err error) int {
	if forPerson {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %s: %v\n", what, err)
	} else {
		logger.Error(what, "err", err)
	}
	return 1
}
