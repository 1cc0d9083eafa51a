package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/charmbracelet/x/term"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/cgroup"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/top"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// topFlags are the flags of `top`. It reads the node as `ps` does, and the kubelet's allocations as the server does.
type topFlags struct {
	interval time.Duration
	sort     string
	group    bool
	filter   string
	only     filterFlags
	count    int
	// intervalSet: --interval was given; reading a cluster, the default is longer.
	intervalSet bool
	// logs holds back what is logged while the view owns the terminal, and prints it once the terminal is restored.
	logs *heldLog
}

func (f *topFlags) register(cmd flagHost) {
	f.logs = &heldLog{out: os.Stderr, limit: 64 << 10}
	cmd.Flag("interval", "Time between readings (with --prometheus: "+clusterInterval.String()+").").Default("2s").
		IsSetByUser(&f.intervalSet).SetValue(durationValue{flag: "interval", dst: &f.interval})
	enumFlag(cmd, "sort", "Initial order of the processes: "+strings.Join(view.SortNames(), ", ")+".", "gpu", &f.sort,
		view.SortNames()...)
	cmd.Flag("group", "Start with one row per workload (pod container, container, Slurm job, service).").BoolVar(&f.group)
	cmd.Flag("filter", "Start filtered, as / filters: any text of a row, or user:, gpu:, ns:, node:, pid:, owner: for "+
		"one field.").PlaceHolder("TEXT").StringVar(&f.filter)
	f.only.register(cmd, "top")
	cmd.Flag("count", "When the output is not a terminal, stop after this many readings (0: until interrupted).").
		Short('n').Default("0").IntVar(&f.count)
}

// interactive reports whether top draws on a terminal, rather than printing plain tables.
func interactive() bool { return term.IsTerminal(os.Stdout.Fd()) && term.IsTerminal(os.Stdin.Fd()) }

// logWriter is where the logger writes during `top`: stderr, but held back while the view owns the terminal,
// since a line written over the screen would garble it until the next redraw.
func (f *topFlags) logWriter() io.Writer { return f.logs }

// check validates top's flags before anything starts.
func (f *topFlags) check() error {
	if f.interval < minInterval {
		return flagError("interval", "must be at least %s, got %s", minInterval, f.interval)
	}
	if f.count < 0 {
		return flagError("count", "must not be negative, got %d", f.count)
	}
	return f.only.check()
}

func (f *topFlags) warnings() []string { return nil }

// run shows the view until ctx ends; kf are the kubelet flags of top, for its allocation signals. host reads a
// process's /proc for its detail; nil where the node's processes are not this host's (a simulated node).
func (f *topFlags) run(ctx context.Context, logger *slog.Logger, kf *kubeletFlags, offer allocationOffer, reader *reading.Reader,
	host func(pid uint32, started time.Time) view.Host) int {
	allocs, err := kf.start(ctx, logger, offer)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter top: cannot read GPU allocations from the kubelet: %v\n", err)
		return 1
	}
	defer allocs.stop()
	allocations := allocs.source
	history := view.NewRecorder()
	return f.show(ctx, host, func(ctx context.Context, _ top.Options) (*view.Reading, error) {
		r, err := reader.Read(ctx)
		if err != nil {
			return nil, err
		}
		var signals allocation.Signals
		if allocations != nil {
			if allocs, ok := allocations.Allocations(); ok {
				signals = allocation.Join(allocs, r)
			}
		}
		v := view.FromNode(r, signals)
		if v.Time.IsZero() {
			v.Time = time.Now()
		}
		history.Record(v)
		return v, nil
	})
}

// show runs the view over read: on the terminal, or as plain tables into a pipe.
func (f *topFlags) show(ctx context.Context, host func(pid uint32, started time.Time) view.Host, read func(context.Context, top.Options) (*view.Reading, error)) int {
	sort, _ := view.ParseSort(f.sort) // checked by the flag
	cfg := top.Config{Interval: f.interval, Read: read, Host: host,
		Options: top.Options{Sort: sort, Filter: f.filter, Base: f.only.filter(), Group: f.group}}
	var err error
	if !interactive() {
		err = top.RunPlain(ctx, cfg, f.count, os.Stdout, os.Stderr)
	} else {
		f.logs.hold()
		err = top.Run(ctx, cfg)
		f.logs.release()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter top: %v\n", err)
		return 1
	}
	return 0
}

// hostReader reads what a process's /proc says for top's detail: its CPU time and resident memory (stat) and its
// cgroup, through the hardened procfs reads; never its command line or environment. The process is its PID and
// its start time, counted from boot as the reading counted it: a PID now another process's shows as exited, not
// with a stranger's numbers.
func hostReader(procFS string, boot time.Time) func(pid uint32, started time.Time) view.Host {
	var mu sync.Mutex
	r := procfs.NewReader(procFS)
	return func(pid uint32, started time.Time) view.Host {
		mu.Lock()
		defer mu.Unlock()
		if started.IsZero() || boot.IsZero() {
			return view.Host{Err: "not read: its start time is unknown, so its PID could be another process's"}
		}
		// The cgroup first: the stat read after it says whether the PID was still the process's, and so it was
		// when the cgroup was read.
		cg, cgErr := r.Cgroup(pid)
		u, err := r.Usage(pid)
		switch {
		case procfs.Exited(err) || err == nil && !procfs.Started(boot, u.Start).Equal(started):
			return view.Host{Exited: true}
		case err != nil:
			return view.Host{Err: err.Error()}
		}
		h := view.Host{
			CPU: time.Duration(u.CPUTicks) * time.Second / clockTicks,
			RSS: gpu.Known(float64(u.RSSPages) * float64(os.Getpagesize())),
		}
		if cgErr == nil {
			h.Cgroup = cgroup.Parse(cg).Path
		}
		return h
	}
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux architecture Go supports.
const clockTicks = 100

// heldLog passes log lines through to stderr, except while held: then it keeps up to limit bytes of them, and
// counts the rest, until released.
type heldLog struct {
	mu      sync.Mutex
	out     io.Writer
	limit   int
	held    bool
	buf     []byte
	dropped int
}

func (h *heldLog) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.held {
		return h.out.Write(p)
	}
	n := min(len(p), h.limit-len(h.buf))
	h.buf = append(h.buf, p[:n]...)
	h.dropped += len(p) - n
	return len(p), nil
}

func (h *heldLog) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = true
}

// release writes what was held back and lets later lines through.
func (h *heldLog) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = false
	h.out.Write(h.buf)
	if h.dropped > 0 {
		fmt.Fprintf(h.out, "(%d more bytes of log left out)\n", h.dropped)
	}
	h.buf, h.dropped = nil, 0
}
