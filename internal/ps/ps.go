// Package ps prints a reading of a node or of a cluster (internal/view) as the pod-aware process table an operator
// wants, as the JSON of docs/reference.md, or as the columns a person asks for; and the reading's notes (its
// health, what could not be read) as lines for stderr, so that stdout holds the rows alone.
package ps

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// row is a process in the `ps --output json` shape of docs/reference.md: the process's keys, named as the process
// series' metrics and labels are, then its owner's identity labels that are InPS (attribution.IdentityLabels).
// Unknown numbers are null. A row read from Prometheus has its node first; a node's own rows have none.
type row struct {
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
}

func rowOf(p *view.Process) row {
	r := row{Node: p.Node, GPU: p.GPU, UUID: p.UUID, PID: p.PID, ProcessName: p.Name, ProcessType: p.Type}
	if p.Memory.Valid {
		b := uint64(p.Memory.V)
		r.MemoryUsedBytes = &b
	}
	if p.SM.Valid {
		sm := p.SM.V
		r.SMUtilization = &sm
	}
	if p.MIG {
		gi, ci := p.GPUInstance, p.ComputeInstance
		r.GPUInstance, r.ComputeInstance = &gi, &ci
	}
	return r
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
		keys = append(keys, identityKey{l, append([]byte{','}, mustJSON(l.Name)...)})
	}
	return keys
}()

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // a plain string or number
	}
	return b
}

// appendJSON appends a process as one JSON object: prefix (`{"time":…,` or `{`), the process's keys, then one key
// per identity label InPS. Characters a terminal acts on are \u escapes, as the table shows them escaped
// (terminal.EscapeJSON): the value read back is exact.
func appendJSON(b, prefix []byte, p *view.Process) ([]byte, error) {
	obj, err := json.Marshal(rowOf(p))
	if err != nil {
		return nil, err
	}
	b = append(append(b, prefix...), obj[1:len(obj)-1]...) // without its braces
	for _, l := range identityKeys {
		value, err := json.Marshal(*l.Get(&p.Identity))
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, l.key...), ':'), value...)
	}
	return terminal.EscapeJSON(append(b, '}')), nil
}

// WriteJSON writes the processes as one JSON array, indented as json.Encoder indents it, a row at a time: a
// cluster's 32,000 rows are 18 MiB of text, which need not be held twice in memory to be printed.
func WriteJSON(w io.Writer, procs []view.Process) error {
	if len(procs) == 0 {
		_, err := io.WriteString(w, "[]\n")
		return err
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString("[\n")
	var obj []byte
	var indented bytes.Buffer
	for i := range procs {
		var err error
		if obj, err = appendJSON(obj[:0], []byte{'{'}, &procs[i]); err != nil {
			return err
		}
		indented.Reset()
		if err := json.Indent(&indented, obj, "  ", "  "); err != nil {
			return err
		}
		bw.WriteString("  ")
		bw.Write(indented.Bytes())
		if i < len(procs)-1 {
			bw.WriteByte(',')
		}
		bw.WriteByte('\n')
	}
	bw.WriteString("]\n")
	return bw.Flush()
}

// WriteJSONLines writes one reading as JSON Lines, for a stream of readings (ps --watch): a line per process, the
// same object as WriteJSON's with the reading's time first, {"time":"2026-12-01T10:00:00.123Z","gpu":0,…}.
func WriteJSONLines(w io.Writer, at time.Time, procs []view.Process) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	prefix := append(append([]byte(`{"time":`), mustJSON(at.UTC())...), ',')
	var line []byte
	for i := range procs {
		var err error
		if line, err = appendJSON(line[:0], prefix, &procs[i]); err != nil {
			return err
		}
		bw.Write(append(line, '\n'))
	}
	return bw.Flush()
}

// Notes are what a reading says besides its rows, one line each, for stderr: that it is simulated, a line per GPU
// with a health problem ("GPU 6: needs GPU reset, row remap pending, XID 48, 63"), duplicated series, values left
// out, nodes that cannot be trusted, and what could not be read ("warning: …"). Every line is escaped for a
// terminal.
func Notes(r *view.Reading) []string {
	var notes []string
	if r.Simulated {
		notes = append(notes, "# simulated GPU data (--demo or --gpu.simulated-config)")
	}
	for _, s := range r.Signals {
		if s.Kind == view.GPUHealth {
			notes = append(notes, "# "+terminal.Escape(s.String()))
		}
	}
	if r.Duplicates > 0 {
		notes = append(notes, fmt.Sprintf("# %s read twice (a node scraped by two jobs): each is shown once", view.Plural(r.Duplicates, "series")))
	}
	if r.Dropped > 0 {
		notes = append(notes, fmt.Sprintf("# %s left out as unknown: not a number, infinite or out of range", view.Plural(r.Dropped, "value")))
	}
	for _, n := range r.Nodes {
		if p := n.Problem(); p != "" {
			notes = append(notes, "warning: node "+terminal.Escape(n.Name)+": "+p)
		}
	}
	for _, w := range r.Warnings {
		notes = append(notes, "warning: "+terminal.Escape(w))
	}
	return notes
}

// Format is how the rows are printed: a table of columns, or JSON.
type Format struct {
	json    bool
	columns []column
	// custom: the person chose the columns (and their headers).
	custom bool
}

// FormatNames are the formats ParseFormat takes, as a shell completes them.
func FormatNames() []string { return []string{"table", "wide", "json", "custom-columns="} }

// JSON reports whether the format is JSON.
func (f Format) JSON() bool { return f.json }

// ParseFormat reads --output: table, wide, json, or custom-columns=HEADER:KEY,… whose keys are the JSON keys
// (node, pid, pod, memory_used_bytes…) and the table's own cells (owner, age, memory, sm, user), as kubectl's
// custom columns name theirs (a leading "." is allowed).
func ParseFormat(s string) (Format, error) {
	switch s {
	case "table", "":
		return Format{columns: tableColumns}, nil
	case "wide":
		return Format{columns: wideColumns}, nil
	case "json":
		return Format{json: true}, nil
	}
	spec, ok := strings.CutPrefix(s, "custom-columns=")
	if !ok {
		return Format{}, fmt.Errorf("%q: want table, wide, json or custom-columns=HEADER:KEY,… (keys: %s)", s, strings.Join(columnKeys(), ", "))
	}
	f := Format{custom: true}
	for _, part := range strings.Split(spec, ",") {
		header, key, ok := strings.Cut(part, ":")
		key = strings.TrimPrefix(strings.TrimSpace(key), ".")
		c, known := columnByKey(key)
		if !ok || header == "" || !known {
			return Format{}, fmt.Errorf("custom-columns: %q is not HEADER:KEY with KEY one of %s", part, strings.Join(columnKeys(), ", "))
		}
		c.header = header
		f.columns = append(f.columns, c)
	}
	return f, nil
}

// WriteTable writes the processes as an aligned table: the column names (headers), then a row per process. The
// default columns are NODE (a cluster's rows), GPU, PID, USER (when users are looked up), PROCESS, MEMORY, SM and
// OWNER, which names the workload in the user's words; wide adds TYPE, AGE and CONTAINER ID. Every cell is escaped
// for a terminal (internal/terminal): a process name, a cgroup directory or a runtime's name can hold control
// characters that would otherwise act on the terminal.
func WriteTable(w io.Writer, r *view.Reading, procs []view.Process, f Format, headers bool) error {
	cols := f.columns
	if !f.custom {
		cols = slices.DeleteFunc(slices.Clone(cols), func(c column) bool { return c.shown != nil && !c.shown(r, procs) })
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	cells := make([]string, len(cols))
	if headers {
		for i, c := range cols {
			cells[i] = terminal.Escape(c.header)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	for i := range procs {
		for j, c := range cols {
			cells[j] = terminal.Escape(c.cell(&procs[i], r.Time))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// column is one column of the table: its header, its key for custom-columns, its cell, and when the default table
// shows it (nil: always).
type column struct {
	header, key string
	cell        func(p *view.Process, at time.Time) string
	shown       func(r *view.Reading, procs []view.Process) bool
}

var (
	nodeColumn = column{header: "NODE", key: "node", cell: func(p *view.Process, _ time.Time) string { return p.Node },
		shown: func(r *view.Reading, _ []view.Process) bool { return r.Cluster }}
	gpuColumn = column{header: "GPU", key: "gpu", cell: func(p *view.Process, _ time.Time) string { return p.GPUColumn() }}
	pidColumn = column{header: "PID", key: "pid",
		cell: func(p *view.Process, _ time.Time) string { return strconv.FormatUint(uint64(p.PID), 10) }}
	userColumn = column{header: "USER", key: "user", cell: func(p *view.Process, _ time.Time) string { return dash(p.Identity.User) },
		shown: func(_ *view.Reading, procs []view.Process) bool {
			return slices.ContainsFunc(procs, func(p view.Process) bool { return p.Identity.User != "" })
		}}
	typeColumn    = column{header: "TYPE", key: "process_type", cell: func(p *view.Process, _ time.Time) string { return dash(p.Type) }}
	processColumn = column{header: "PROCESS", key: "process_name", cell: func(p *view.Process, _ time.Time) string { return dash(p.Name) }}
	memoryColumn  = column{header: "MEMORY", key: "memory", cell: func(p *view.Process, _ time.Time) string { return view.Memory(p.Memory) }}
	smColumn      = column{header: "SM", key: "sm", cell: func(p *view.Process, _ time.Time) string { return view.Percent(p.SM) }}
	ageColumn     = column{header: "AGE", key: "age", cell: func(p *view.Process, at time.Time) string { return view.AgeAt(p.Started, at) }}
	ownerColumn   = column{header: "OWNER", key: "owner", cell: func(p *view.Process, _ time.Time) string { return p.Owner().String() }}
	idColumn      = column{header: "CONTAINER ID", key: "container_id",
		cell: func(p *view.Process, _ time.Time) string { return dash(shortID(p.Identity.ContainerID)) }}

	tableColumns = []column{nodeColumn, gpuColumn, pidColumn, userColumn, processColumn, memoryColumn, smColumn, ownerColumn}
	wideColumns  = []column{nodeColumn, gpuColumn, pidColumn, userColumn, typeColumn, processColumn, memoryColumn, smColumn,
		ageColumn, ownerColumn, idColumn}
)

// rawColumns are the JSON keys that custom-columns can name besides the table's cells, with their values as the
// JSON has them (numbers in full, "" for unknown strings, <none> for null).
var rawColumns = []column{
	{key: "uuid", cell: func(p *view.Process, _ time.Time) string { return p.UUID }},
	{key: "memory_used_bytes", cell: func(p *view.Process, _ time.Time) string {
		if !p.Memory.Valid {
			return none
		}
		return strconv.FormatUint(uint64(p.Memory.V), 10)
	}},
	{key: "sm_utilization_ratio", cell: func(p *view.Process, _ time.Time) string {
		if !p.SM.Valid {
			return none
		}
		return strconv.FormatFloat(p.SM.V, 'g', -1, 64)
	}},
	{key: "gpu_instance", cell: func(p *view.Process, _ time.Time) string { return migNumber(p, p.GPUInstance) }},
	{key: "compute_instance", cell: func(p *view.Process, _ time.Time) string { return migNumber(p, p.ComputeInstance) }},
}

// none is what kubectl's custom columns print for a field without a value.
const none = "<none>"

func migNumber(p *view.Process, n int) string {
	if !p.MIG {
		return none
	}
	return strconv.Itoa(n)
}

// columnByKey finds the column a custom-columns key names: a cell of the table, a JSON key, or an identity label.
func columnByKey(key string) (column, bool) {
	for _, c := range append(append(slices.Clone(wideColumns), userColumn), rawColumns...) {
		if c.key == key {
			c.shown = nil
			return c, true
		}
	}
	for _, l := range identityKeys {
		if l.Name == key {
			return column{key: key, cell: func(p *view.Process, _ time.Time) string { return dash(*l.Get(&p.Identity)) }}, true
		}
	}
	return column{}, false
}

// columnKeys are the keys custom-columns reads, for its error.
func columnKeys() []string {
	var keys []string
	for _, c := range append(slices.Clone(wideColumns), rawColumns...) {
		keys = append(keys, c.key)
	}
	for _, l := range identityKeys {
		if !slices.Contains(keys, l.Name) {
			keys = append(keys, l.Name)
		}
	}
	return keys
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
