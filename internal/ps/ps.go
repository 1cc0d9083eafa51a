// Package ps prints one attributed reading as the pod-aware process table an operator wants on the node, or as
// the JSON of docs/reference.md.
package ps

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
)

// Row is one process on one GPU, in the `ps --output json` shape of docs/reference.md: the process's keys, then
// its owner's identity labels that are InPS (attribution.IdentityLabels). Unknown numbers are null. A row read
// from Prometheus has its node first; a node's own rows have none.
type Row struct {
	Node            string   `json:"node,omitempty"`
	GPU             int      `json:"gpu"`
	UUID            string   `json:"uuid"`
	PID             uint32   `json:"pid"`
	ProcessName     string   `json:"process_name"`
	ProcessType     string   `json:"process_type"`
	UsedMemoryBytes *uint64  `json:"used_memory_bytes"`
	SMUtilization   *float64 `json:"sm_utilization_ratio"`
	GPUInstance     *int     `json:"gpu_instance"`
	ComputeInstance *int     `json:"compute_instance"`
	// Identity is the process's owner; MarshalJSON writes its labels.
	attribution.Identity `json:"-"`
}

// MarshalJSON writes the row as one JSON object: the process's keys, then one key per identity label InPS.
func (r Row) MarshalJSON() ([]byte, error) {
	type process Row // without this method
	b, err := json.Marshal(process(r))
	if err != nil {
		return nil, err
	}
	b = b[:len(b)-1] // the closing brace
	for _, l := range identityKeys {
		value, err := json.Marshal(*l.Get(&r.Identity))
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, l.key...), ':'), value...)
	}
	return append(b, '}'), nil
}

// identityKey is an identity label InPS with its key as JSON writes it, after a comma: written once, not once per
// row.
type identityKey struct {
	attribution.IdentityLabel
	key []byte
}

var identityKeys = func() []identityKey {
	var keys []identityKey
	for _, l := range attribution.IdentityLabels {
		if l.Use&attribution.InPS == 0 {
			continue
		}
		name, err := json.Marshal(l.Name)
		if err != nil {
			panic(err) // a label name is a plain string
		}
		keys = append(keys, identityKey{l, append([]byte{','}, name...)})
	}
	return keys
}()

// Rows lists the reading's processes, by GPU then PID.
func Rows(r *reading.Reading) []Row {
	rows := []Row{}
	for _, d := range r.Snapshot.Devices {
		for _, p := range d.Processes {
			o := r.Owner(p)
			row := Row{GPU: d.Index, UUID: d.UUID, PID: p.PID, ProcessName: o.Name, ProcessType: p.Type, Identity: o.Identity}
			if p.UsedMemoryBytes.Valid {
				b := uint64(p.UsedMemoryBytes.V)
				row.UsedMemoryBytes = &b
			}
			if p.SMUtilizationRatio.Valid {
				row.SMUtilization = &p.SMUtilizationRatio.V
			}
			if p.MIG {
				gi, ci := p.GPUInstance, p.ComputeInstance
				row.GPUInstance, row.ComputeInstance = &gi, &ci
			}
			rows = append(rows, row)
		}
	}
	slices.SortStableFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.PID, b.PID))
	})
	return rows
}

// WriteJSON writes the rows as one JSON array, indented as json.Encoder indents it, a row at a time: a cluster's
// 32,000 rows are 18 MiB of text, which need not be held twice in memory to be printed.
func WriteJSON(w io.Writer, rows []Row) error {
	if len(rows) == 0 {
		_, err := io.WriteString(w, "[]\n")
		return err
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString("[\n")
	var row bytes.Buffer
	for i, r := range rows {
		b, err := r.MarshalJSON() // what json.Marshal writes for it, without checking its own output again
		if err != nil {
			return err
		}
		row.Reset()
		if err := json.Indent(&row, b, "  ", "  "); err != nil {
			return err
		}
		bw.WriteString("  ")
		bw.Write(row.Bytes())
		if i < len(rows)-1 {
			bw.WriteByte(',')
		}
		bw.WriteByte('\n')
	}
	bw.WriteString("]\n")
	return bw.Flush()
}

// Filter keeps the rows of one namespace, or whose owner contains a text; an empty field keeps every row.
type Filter struct {
	Namespace string // exact
	Owner     string // a part of the OWNER column, case-insensitive
}

// Keep returns the rows that pass the filter.
func (f Filter) Keep(rows []Row) []Row {
	kept := []Row{}
	for _, r := range rows {
		if f.Match(r) {
			kept = append(kept, r)
		}
	}
	return kept
}

// Match reports whether a row passes the filter.
func (f Filter) Match(r Row) bool {
	return (f.Namespace == "" || r.Namespace == f.Namespace) &&
		(f.Owner == "" || strings.Contains(strings.ToLower(Owner(r)), strings.ToLower(f.Owner)))
}

// Warnings are what a reading could not read, one line each, naming the GPU where there is one.
func Warnings(snap *gpu.Snapshot) []string {
	var w []string
	for _, e := range snap.Errors {
		if e.Index < 0 {
			w = append(w, e.Error())
		} else {
			w = append(w, fmt.Sprintf("GPU %d: %v", e.Index, e))
		}
	}
	return w
}

// WriteWarnings writes the warnings, one "warning: " line each, escaped for a terminal.
func WriteWarnings(w io.Writer, snap *gpu.Snapshot) error {
	for _, warning := range Warnings(snap) {
		if _, err := fmt.Fprintf(w, "warning: %s\n", terminal.Escape(warning)); err != nil {
			return err
		}
	}
	return nil
}

// WriteTable writes the rows as an aligned table, with a header unless headers is false (for scripts): a line per
// GPU with a health problem (HealthLines), then the column names. The OWNER column names the workload in the user's
// words: the Kubernetes namespace/pod/container, a plain container, a Slurm job or a systemd unit. Every cell is
// escaped for a terminal (internal/terminal): a process name, a cgroup directory or a runtime's name can hold
// control characters that would otherwise act on the terminal.
func WriteTable(w io.Writer, snap *gpu.Snapshot, rows []Row, headers bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	// Rows read from Prometheus have a node, and the table a NODE column.
	nodes := slices.ContainsFunc(rows, func(r Row) bool { return r.Node != "" })
	if headers {
		if snap.Simulated {
			fmt.Fprintln(tw, "# simulated GPU data (--demo or --gpu.simulated-config)")
		}
		for _, l := range HealthLines(snap) {
			fmt.Fprintln(tw, "# "+terminal.Escape(l))
		}
		if nodes {
			fmt.Fprint(tw, "NODE\t")
		}
		fmt.Fprintln(tw, "GPU\tPID\tTYPE\tPROCESS\tMEMORY\tSM\tOWNER\tCONTAINER ID")
	}
	for _, r := range rows {
		gpuCol := strconv.Itoa(r.GPU)
		if r.GPUInstance != nil {
			gpuCol += fmt.Sprintf(" (GI %d CI %d)", *r.GPUInstance, *r.ComputeInstance)
		}
		if nodes {
			fmt.Fprintf(tw, "%s\t", terminal.Escape(r.Node))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", gpuCol, r.PID, terminal.Escape(r.ProcessType),
			dash(terminal.Escape(r.ProcessName)), memory(r.UsedMemoryBytes), percent(r.SMUtilization),
			terminal.Escape(Owner(r)), dash(terminal.Escape(shortID(r.ContainerID))))
	}
	return tw.Flush()
}

// Owner names the row's workload in the user's words: "pod namespace/pod/container", "container NAME",
// "slurm job ID", "service UNIT", or "-" when nothing is known.
func Owner(r Row) string {
	switch {
	case r.Pod != "":
		s := r.Namespace + "/" + r.Pod
		if r.Container != "" {
			s += "/" + r.Container
		}
		return "pod " + s
	case r.PodUID != "":
		return "pod uid " + r.PodUID
	case r.Container != "":
		return "container " + r.Container
	case r.SlurmJobID != "":
		return "slurm job " + r.SlurmJobID
	case r.SystemdUnit != "":
		return "service " + r.SystemdUnit
	case r.ContainerID != "":
		return "container"
	}
	return "-"
}

func memory(b *uint64) string {
	if b == nil {
		return "-"
	}
	return fmt.Sprintf("%d MiB", *b>>20)
}

func percent(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", *v*100)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
