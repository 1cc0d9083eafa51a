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
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
)

// Row is one process on one GPU, in the `ps --output json` shape of docs/reference.md: the process's keys, named
// as the process series' metrics and labels are, then its owner's identity labels that are InPS
// (attribution.IdentityLabels). Unknown numbers are null. A row read from Prometheus has its node first; a node's own
// rows have none.
type Row struct {
	Node            string   `json:"node,omitempty"`
	GPU             int      `json:"gpu"`
	UUID            string   `json:"uuid"`
	PID             uint32   `json:"pid"`
	ProcessName     string   `json:"process_name"`
	ProcessType     string   `json:"process_type"`
	MemoryUsedBytes *uint64  `json:"memory_used_bytes"`
	SMUtilization   *float64 `json:"sm_utilization_ratio"`
	GPUInstance     *int     `json:"gpu_instance"`
	ComputeInstance *int     `json:"compute_instance"`
	// Started is when the process started, zero when unknown (top's AGE).
	Started time.Time `json:"-"`
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
			row := Row{GPU: d.Index, UUID: d.UUID, PID: p.PID, ProcessName: o.Name, ProcessType: p.Type,
				Started: o.Started, Identity: o.Identity}
			if p.UsedMemoryBytes.Valid {
				b := uint64(p.UsedMemoryBytes.V)
				row.MemoryUsedBytes = &b
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

// WriteJSONLine writes one reading as one line of JSON Lines, for a stream of readings (ps --watch): the time of
// the reading and its rows, {"time":"2026-12-01T10:00:00.123Z","processes":[...]}.
func WriteJSONLine(w io.Writer, at time.Time, rows []Row) error {
	if rows == nil {
		rows = []Row{}
	}
	b, err := json.Marshal(struct {
		Time      time.Time `json:"time"`
		Processes []Row     `json:"processes"`
	}{at.UTC(), rows})
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
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

// Empty says, for a reading that left no row, why: the node has no GPU process, or none passes the filter.
func (f Filter) Empty(total int) string {
	if total == 0 {
		return "no GPU processes"
	}
	var given []string
	if f.Namespace != "" {
		given = append(given, "--namespace="+f.Namespace)
	}
	if f.Owner != "" {
		given = append(given, "--owner="+f.Owner)
	}
	return fmt.Sprintf("no GPU process matches %s (%s in all)", strings.Join(given, " "), Plural(total, "process"))
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

// Table says what WriteTable prints besides the rows: the header lines, and the wide columns.
type Table struct {
	Headers bool // the health lines and the column names; off for scripts
	Wide    bool // TYPE and CONTAINER ID as well (-o wide)
}

// WriteTable writes the rows as an aligned table in the format top shows them: a line per GPU with a health problem
// (HealthLines) and the column names, then NODE (rows read from Prometheus), GPU, PID, USER (when users are looked
// up), PROCESS, MEMORY, SM and OWNER, and with Wide TYPE and CONTAINER ID. The OWNER column names the workload in the
// user's words: the Kubernetes namespace/pod/container, a plain container, a Slurm job or a systemd unit. Every cell
// is escaped for a terminal (internal/terminal): a process name, a cgroup directory or a runtime's name can hold
// control characters that would otherwise act on the terminal.
func WriteTable(w io.Writer, snap *gpu.Snapshot, rows []Row, t Table) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	nodes := slices.ContainsFunc(rows, func(r Row) bool { return r.Node != "" })
	users := slices.ContainsFunc(rows, func(r Row) bool { return r.User != "" })
	line := func(node, gpu, pid, user, typ, process, memory, sm, owner, containerID string) {
		var cells []string
		if nodes {
			cells = append(cells, node)
		}
		cells = append(cells, gpu, pid)
		if users {
			cells = append(cells, user)
		}
		if t.Wide {
			cells = append(cells, typ)
		}
		cells = append(cells, process, memory, sm, owner)
		if t.Wide {
			cells = append(cells, containerID)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if t.Headers {
		if snap.Simulated {
			fmt.Fprintln(tw, "# simulated GPU data (--demo or --gpu.simulated-config)")
		}
		for _, l := range HealthLines(snap) {
			fmt.Fprintln(tw, "# "+terminal.Escape(l))
		}
		line("NODE", "GPU", "PID", "USER", "TYPE", "PROCESS", "MEMORY", "SM", "OWNER", "CONTAINER ID")
	}
	for _, r := range rows {
		line(terminal.Escape(r.Node), GPUColumn(r.GPU, r.GPUInstance, r.ComputeInstance), strconv.FormatUint(uint64(r.PID), 10),
			dash(terminal.Escape(r.User)), terminal.Escape(r.ProcessType), dash(terminal.Escape(r.ProcessName)),
			Memory(bytesValue(r.MemoryUsedBytes)), Percent(ratioValue(r.SMUtilization)), terminal.Escape(Owner(r)),
			dash(terminal.Escape(shortID(r.ContainerID))))
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

// The cells that ps and top print alike.

// GPUColumn names a process's GPU: "3", or "2:1/0" for GPU 2's MIG device of GPU instance 1, compute instance 0.
func GPUColumn(index int, gi, ci *int) string {
	s := strconv.Itoa(index)
	if gi != nil && ci != nil {
		s += fmt.Sprintf(":%d/%d", *gi, *ci)
	}
	return s
}

// Memory is an amount of GPU memory: "512 MiB" below a GiB, "22.0 GiB" from one; "-" when unknown.
func Memory(v gpu.Value) string {
	switch {
	case !v.Valid:
		return "-"
	case v.V < 1<<30:
		return fmt.Sprintf("%.0f MiB", v.V/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", v.V/(1<<30))
}

// Percent is a ratio as a whole percentage, "41%"; "-" when unknown.
func Percent(v gpu.Value) string {
	if !v.Valid {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", v.V*100)
}

func bytesValue(b *uint64) gpu.Value {
	if b == nil {
		return gpu.Value{}
	}
	return gpu.Known(float64(*b))
}

func ratioValue(r *float64) gpu.Value {
	if r == nil {
		return gpu.Value{}
	}
	return gpu.Known(*r)
}

// Plural counts things: "1 GPU", "8 GPUs", "14 processes".
func Plural(n int, what string) string {
	switch {
	case n == 1:
		return "1 " + what
	case strings.HasSuffix(what, "s"):
		return fmt.Sprintf("%d %ses", n, what)
	}
	return fmt.Sprintf("%d %ss", n, what)
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
