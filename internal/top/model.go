// Package top is `gpu-pod-exporter top`: a live view of a node's GPUs and who uses them, or of a whole cluster's.
// It renders a reading (internal/view) as a screen: a line per GPU (or per node), the signals, and the process
// rows; the terminal program adds keys, a cursor and a process's detail, and the plain output prints the same
// layout into a pipe.
package top

import (
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// Options are how the person looking wants the rows: their order, a filter, how they are grouped, and whether a
// cluster's GPUs show under their nodes.
type Options struct {
	Sort view.Sort
	// Filter is the filter as typed (`/`); Base is the one of the flags (--user, --gpu), which the typed one narrows.
	Filter string
	Base   view.Filter
	// Group shows a row per workload (a pod's container, a container, a Slurm job, a service) with its memory and
	// SM utilization summed over its processes and GPUs; Namespaces, with Group, a row per namespace (a cluster's
	// view).
	Group      bool
	Namespaces bool
	// ByNode shows each node's GPUs under its line, and orders the rows node by node (a cluster's view).
	ByNode bool
}

// grouping is the rows' grouping.
func (o Options) grouping() view.Grouping {
	switch {
	case o.Group && o.Namespaces:
		return view.Namespaces
	case o.Group:
		return view.Workloads
	}
	return view.Processes
}

// filter is the flags' filter narrowed by the typed one.
func (o Options) filter() view.Filter {
	return o.Base.With(view.ParseFilter(o.Filter))
}

// Screen is one reading laid out for a person: the part of the reading the filter keeps, and its rows.
type Screen struct {
	*view.Reading
	// Total counts the reading's processes before the filter.
	Total int
	Rows  []Row
	// Grouped: the rows are workloads (or namespaces).
	Grouped bool
}

// Row is one process, or one workload.
type Row struct {
	Node, GPU, PID, User, Process string
	Memory, SM                    string
	Age                           string
	Owner                         view.Owner
	// Proc is the row's process; a workload's first.
	Proc *view.Process
	// History is the workload's SM utilization over the history's span, summed over its GPUs (HistoryScale of
	// them); nil when none is kept.
	History      []float64
	HistoryScale float64
	// Key names the row across readings, so that the cursor stays on it.
	Key string
}

// Build lays out a reading. It is pure: the same reading and options give the same screen.
func Build(r *view.Reading, o Options) Screen {
	total := len(r.Processes)
	f := o.filter()
	r = r.Filtered(f)
	s := Screen{Reading: r, Total: total, Grouped: o.Group}
	procs := r.Processes
	if !o.Group {
		if o.Sort != view.ByGPU || o.ByNode {
			procs = slices.Clone(procs) // the reading's order is kept for the next build
			view.SortProcesses(procs, o.Sort)
		}
		if o.ByNode {
			sortByNode(procs)
		}
		s.Rows = make([]Row, len(procs))
		for i := range procs {
			s.Rows[i] = processRow(&procs[i], r)
		}
		return s
	}
	ws := view.Group(procs, o.grouping())
	view.SortWorkloads(ws, o.Sort)
	if o.ByNode {
		sortWorkloadsByNode(ws)
	}
	s.Rows = make([]Row, len(ws))
	for i := range ws {
		s.Rows[i] = workloadRow(&ws[i], r)
	}
	return s
}

func processRow(p *view.Process, r *view.Reading) Row {
	pid := strconv.FormatUint(uint64(p.PID), 10)
	return Row{
		Node: p.Node, GPU: p.GPUColumn(), PID: pid, User: p.Identity.User, Process: p.Name,
		Memory: view.Memory(p.Memory), SM: view.Percent(p.SM), Age: view.AgeAt(p.Started, r.Time), Owner: p.Owner(), Proc: p,
		Key: p.Node + "\x00" + p.UUID + "\x00" + pid,
	}
}

func workloadRow(w *view.Workload, r *view.Reading) Row {
	row := Row{Memory: view.Memory(w.Memory), SM: view.Percent(w.SM), Owner: w.Owner, Key: w.Key, Proc: w.Process,
		Age: view.AgeAt(w.Started, r.Time)}
	row.Node, row.HistoryScale = w.Nodes[0], float64(w.Places)
	row.GPU = strings.Join(w.GPUs, ",")
	if len(w.Nodes) > 1 {
		row.Node = view.Plural(len(w.Nodes), "node")
	}
	if len(w.Nodes) > 1 || len(row.GPU) > maxGPUColumn {
		row.GPU = view.Plural(w.Places, "GPU")
	}
	row.PID = view.Plural(w.Processes, "proc")
	if w.Processes == 1 {
		row.PID = strconv.FormatUint(uint64(w.Process.PID), 10)
	}
	row.User = firstAndMore(w.Users)
	row.Process = firstAndMore(w.Names)
	if r.History != nil {
		row.History = r.History.Workloads[w.Key]
	}
	return row
}

// maxGPUColumn is the widest the GPU column gets: a workload on more GPUs than it lists in it says how many.
const maxGPUColumn = 11

// firstAndMore is "alice", or "alice +2" for three.
func firstAndMore(list []string) string {
	switch len(list) {
	case 0:
		return ""
	case 1:
		return list[0]
	}
	return list[0] + " +" + strconv.Itoa(len(list)-1)
}

func sortByNode(procs []view.Process) {
	slices.SortStableFunc(procs, func(a, b view.Process) int { return strings.Compare(a.Node, b.Node) })
}

func sortWorkloadsByNode(ws []view.Workload) {
	slices.SortStableFunc(ws, func(a, b view.Workload) int { return strings.Compare(a.Nodes[0], b.Nodes[0]) })
}
