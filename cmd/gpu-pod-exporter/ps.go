package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
)

// psFlags are the flags of `ps`.
type psFlags struct {
	output    string
	filter    ps.Filter
	noHeaders bool
	watch     bool
	interval  time.Duration
}

func (f *psFlags) register(cmd flagHost) {
	enumFlag(cmd, "output", "Output format: table, wide (the table with TYPE and CONTAINER ID) or json (JSON Lines, a "+
		"line per reading, with --watch).", "table", &f.output, "table", "wide", "json").Short('o')
	cmd.Flag("namespace", "Only processes of pods in this Kubernetes namespace.").PlaceHolder("NAMESPACE").StringVar(&f.filter.Namespace)
	cmd.Flag("owner", "Only processes whose OWNER contains this text (case-insensitive), e.g. a pod, container, "+
		"Slurm job or service name.").PlaceHolder("TEXT").StringVar(&f.filter.Owner)
	cmd.Flag("no-headers", "Print the table without its header lines.").BoolVar(&f.noHeaders)
	cmd.Flag("watch", "Print a new reading every --interval until interrupted, instead of once.").Short('w').BoolVar(&f.watch)
	durationFlag(cmd, "interval", "Time between readings with --watch.", 2*time.Second, &f.interval)
}

// minInterval keeps a refresh from reading the GPUs in a busy loop.
const minInterval = 100 * time.Millisecond

func (f *psFlags) check() error {
	if f.interval < minInterval {
		return flagError("interval", "must be at least %s, got %s", minInterval, f.interval)
	}
	return nil
}

func (f *psFlags) warnings() []string { return nil }

// runPS prints one reading, or with --watch one every interval until ctx ends (Ctrl-C), which is a normal exit.
// Under --watch a failed reading is reported and the next one tried, as a watched command is re-run; output that
// cannot be written (a closed pipe) ends it. print takes and prints one reading: the node's, or the cluster's.
func runPS(ctx context.Context, f *psFlags, print func(context.Context, io.Writer) (readErr, writeErr error)) int {
	for {
		readErr, writeErr := print(ctx, os.Stdout)
		switch {
		case ctx.Err() != nil:
			return 0
		case writeErr != nil:
			fmt.Fprintf(os.Stderr, "gpu-pod-exporter ps: writing output: %v\n", writeErr)
			return 1
		case readErr != nil:
			fmt.Fprintf(os.Stderr, "gpu-pod-exporter ps: %s\n", terminal.Escape(readErr.Error()))
			if !f.watch {
				return 1
			}
		case !f.watch:
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(f.interval):
		}
		if f.output != "json" && !f.noHeaders {
			fmt.Println() // a blank line between tables
		}
	}
}

// printPS prints one reading and its warnings.
func printPS(ctx context.Context, reader *reading.Reader, f *psFlags, w io.Writer) (readErr, writeErr error) {
	r, err := reader.Read(ctx)
	if err != nil {
		return err, nil
	}
	writeErr = f.write(w, r.Snapshot, ps.Rows(r), time.Now())
	ps.WriteWarnings(os.Stderr, r.Snapshot)
	return nil, writeErr
}

// write prints a reading's rows that pass the filter, as --output says: a table, or JSON (a line per reading, with
// its time, under --watch). A reading that leaves no row says why on stderr, as kubectl does, so that the output
// stays what a script expects.
func (f *psFlags) write(w io.Writer, snap *gpu.Snapshot, all []ps.Row, at time.Time) error {
	rows := f.filter.Keep(all)
	if len(rows) == 0 {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter ps: %s\n", terminal.Escape(f.filter.Empty(len(all))))
	}
	switch {
	case f.output == "json" && f.watch:
		return ps.WriteJSONLine(w, at, rows)
	case f.output == "json":
		return ps.WriteJSON(w, rows)
	}
	return ps.WriteTable(w, snap, rows, ps.Table{Headers: !f.noHeaders, Wide: f.output == "wide"})
}
