package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// psFlags are the flags of `ps`.
type psFlags struct {
	output    string
	filter    filterFlags
	sort      string
	noHeaders bool
	watch     bool
	interval  time.Duration

	// Filled in by check.
	format ps.Format
	order  view.Sort
}

func (f *psFlags) register(cmd flagHost) {
	cmd.Flag("output", "Output format: table, wide (with TYPE, AGE and CONTAINER ID), json (with --watch, JSON Lines: a "+
		`line per process with the reading's "time"), or custom-columns=HEADER:KEY,... whose keys are json's and `+
		"owner, age, memory, sm.").Short('o').Default("table").SetValue(outputValue{&f.output, &f.format})
	f.filter.register(cmd, "ps")
	enumFlag(cmd, "sort", "Order of the rows: "+strings.Join(view.SortNames(), ", ")+" (memory, SM and age: the most "+
		"first; unknown values last).", "gpu", &f.sort, view.SortNames()...)
	cmd.Flag("no-headers", "Print the table without its column names.").BoolVar(&f.noHeaders)
	cmd.Flag("watch", "Print a new reading every --interval until interrupted, instead of once.").Short('w').BoolVar(&f.watch)
	durationFlag(cmd, "interval", "Time between readings with --watch.", 2*time.Second, &f.interval)
}

// minInterval keeps a refresh from reading the GPUs in a busy loop.
const minInterval = 100 * time.Millisecond

func (f *psFlags) check() error {
	if f.interval < minInterval {
		return flagError("interval", "must be at least %s, got %s", minInterval, f.interval)
	}
	var err error
	if f.order, err = view.ParseSort(f.sort); err != nil {
		return flagError("sort", "%v", err)
	}
	return f.filter.check()
}

func (f *psFlags) warnings() []string { return nil }

// outputValue is --output: a format ps.ParseFormat reads, checked as it is given.
type outputValue struct {
	text   *string
	format *ps.Format
}

func (v outputValue) Set(s string) error {
	f, err := ps.ParseFormat(s)
	if err != nil {
		return flagError("output", "%v", err)
	}
	*v.text, *v.format = s, f
	return nil
}

func (v outputValue) String() string { return *v.text }

// Options are the formats the shell completions offer.
func (v outputValue) Options() []string { return ps.FormatNames() }

// options are the formats completion offers; custom-columns= is followed by the person's columns.
func (outputValue) options() []string { return []string{"table", "wide", "json", "custom-columns="} }

// filterFlags narrow ps and top to some processes.
type filterFlags struct {
	namespace, owner string
	users, gpus      []string
}

func (f *filterFlags) register(cmd flagHost, command string) {
	if command == "ps" {
		cmd.Flag("namespace", "Only processes of pods in this Kubernetes namespace.").PlaceHolder("NAMESPACE").StringVar(&f.namespace)
		cmd.Flag("owner", "Only processes whose OWNER contains this text (case-insensitive), e.g. a pod, container, "+
			"Slurm job or service name.").PlaceHolder("TEXT").StringVar(&f.owner)
	}
	cmd.Flag("user", "Only processes of this user (USER: a name, or a uid where the node's user database has none); "+
		"repeatable, or comma-separated.").PlaceHolder("USER").StringsVar(&f.users)
	cmd.Flag("gpu", "Only processes on this GPU (its index; its MIG devices included); repeatable, or comma-separated.").
		PlaceHolder("INDEX").StringsVar(&f.gpus)
}

func (f *filterFlags) check() error {
	for _, g := range splitList(f.gpus) {
		if strings.Trim(g, "0123456789") != "" || g == "" {
			return flagError("gpu", "%q is not a GPU index", g)
		}
	}
	return nil
}

// filter is the flags' filter.
func (f *filterFlags) filter() view.Filter {
	var fl view.Filter
	if f.namespace != "" {
		fl = fl.Field("namespace", f.namespace)
	}
	if f.owner != "" {
		fl = fl.Field("owner", f.owner)
	}
	return fl.Field("user", splitList(f.users)...).Field("gpu", splitList(f.gpus)...)
}

// empty says, for a reading that left no row, why: the node has no GPU process, or none passes the filter.
func (f *filterFlags) empty(total int) string {
	if total == 0 {
		return "no GPU processes"
	}
	var given []string
	if f.namespace != "" {
		given = append(given, "--namespace="+f.namespace)
	}
	if f.owner != "" {
		given = append(given, "--owner="+f.owner)
	}
	for _, u := range splitList(f.users) {
		given = append(given, "--user="+u)
	}
	for _, g := range splitList(f.gpus) {
		given = append(given, "--gpu="+g)
	}
	return fmt.Sprintf("no GPU process matches %s (%s in all)", strings.Join(given, " "), view.Plural(total, "process"))
}

// readNode takes one reading of the node for ps.
func readNode(ctx context.Context, reader *reading.Reader) (*view.Reading, error) {
	r, err := reader.Read(ctx)
	if err != nil {
		return nil, err
	}
	return view.FromNode(r, allocation.Signals{}), nil
}

// runPS prints one reading, or with --watch one every interval until ctx ends (Ctrl-C), which is a normal exit.
// Under --watch a failed reading is reported and the next one tried, as a watched command is re-run; output that
// cannot be written (a closed pipe) ends it. read takes one reading: the node's, or the cluster's.
func runPS(ctx context.Context, f *psFlags, read func(context.Context) (*view.Reading, error)) int {
	for first := true; ; first = false {
		if !first && !f.format.JSON() && !f.noHeaders {
			fmt.Println() // a blank line between tables
		}
		r, err := read(ctx)
		switch {
		case ctx.Err() != nil:
			return 0
		case err != nil:
			fmt.Fprintf(os.Stderr, "gpu-pod-exporter ps: %s\n", terminal.Escape(err.Error()))
			if !f.watch {
				return 1
			}
		default:
			if err := f.write(os.Stdout, os.Stderr, r); err != nil {
				fmt.Fprintf(os.Stderr, "gpu-pod-exporter ps: writing output: %v\n", err)
				return 1
			}
			if !f.watch {
				return 0
			}
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(f.interval):
		}
	}
}

// write prints a reading's rows that pass the filter, in --sort's order, as --output says: a table, the columns
// asked for, or JSON (a line per process, with the reading's time, under --watch); and its notes on errOut, so
// that out holds the rows alone. A reading that leaves no row says why on errOut, as kubectl does.
func (f *psFlags) write(out, errOut io.Writer, r *view.Reading) error {
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	for _, n := range ps.Notes(r) {
		fmt.Fprintln(errOut, n)
	}
	rows := r.Filtered(f.filter.filter()).Processes
	if f.order != view.ByGPU {
		view.SortProcesses(rows, f.order)
	}
	if len(rows) == 0 {
		fmt.Fprintf(errOut, "gpu-pod-exporter ps: %s\n", terminal.Escape(f.filter.empty(len(r.Processes))))
	}
	switch {
	case f.format.JSON() && f.watch:
		return ps.WriteJSONLines(out, r.Time, rows)
	case f.format.JSON():
		return ps.WriteJSON(out, rows)
	}
	return ps.WriteTable(out, r, rows, f.format, !f.noHeaders)
}
