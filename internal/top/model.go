// Package top is `gpu-pod-exporter top`: a live view of the node's GPUs and who uses them. Its layout model is a
// pure function from one reading to a screen (a header line per GPU, allocation signals, process rows), which the
// terminal program and the plain refreshing output both render.
package top

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// Reading is one attributed reading of the node and what the kubelet's allocations say about it, or a reading of
// many nodes (Cluster, with Result nil).
type Reading struct {
	Result      *reading.Reading
	Allocations allocation.Signals
	Cluster     *Cluster
}

// Sort orders the process rows.
type Sort int

// The orders the keys select.
const (
	ByGPU    Sort = iota // GPU, then PID
	ByMemory             // most memory first
	BySM                 // highest SM utilization first
)

func (s Sort) String() string {
	switch s {
	case ByMemory:
		return "memory"
	case BySM:
		return "SM"
	}
	return "GPU"
}

// ParseSort reads a --sort value.
func ParseSort(s string) (Sort, error) {
	switch strings.ToLower(s) {
	case "gpu":
		return ByGPU, nil
	case "memory", "mem":
		return ByMemory, nil
	case "sm":
		return BySM, nil
	}
	return ByGPU, fmt.Errorf("unknown sort %q: want gpu, memory or sm", s)
}

// View is how the person looking wants the rows: their order, a filter and whether to group by workload.
type View struct {
	Sort Sort
	// Filter keeps the rows whose namespace is the text, or whose owner contains it (case-insensitive).
	Filter string
	// Group shows one row per workload (a pod, a container, a Slurm job, a service) with its memory and SM
	// utilization summed over its processes and GPUs.
	Group bool
	// Namespaces, with Group, makes a pod's row its namespace's: all its pods together (a cluster's view).
	Namespaces bool
	// ByNode shows each node's GPUs under its line, and orders the rows node by node (a cluster's view).
	ByNode bool
}

// Screen is one reading laid out for a person.
type Screen struct {
	Simulated bool
	// Cluster is true for a reading of many nodes: Nodes has a line per node, and GPUs, signals and rows name theirs.
	Cluster bool
	Nodes   []Node
	// Time is when a cluster reading was evaluated (zero for a node's: the frame's time).
	Time time.Time
	GPUs []GPU
	// AllocationsKnown is true when the kubelet's allocations were read (or a simulated node has them): only then
	// do GPU.AllocatedPods and the signals mean anything.
	AllocationsKnown bool
	// Signals name what needs a person's attention: use of a GPU that was not allocated, allocations left idle.
	Signals []Signal
	Rows    []Row
	// Processes counts the reading's GPU processes, before the filter.
	Processes int
	// Warnings are what could not be read.
	Warnings []string
}

// GPU is one GPU's header line.
type GPU struct {
	Index                   int
	Name                    string // without the "NVIDIA " every name starts with
	Utilization             gpu.Value
	MemoryUsed, MemoryTotal gpu.Value // bytes
	Temperature             gpu.Value // °C
	Power, PowerLimit       gpu.Value // W
	Mode                    string    // MIG, MPS or time-slicing, and by how many
	AllocatedPods           int       // distinct pods the kubelet allocated this GPU or its MIG devices to
	Unrequested, IdlePods   int       // pods using it without an allocation; pods holding it and running nothing
	// Health names what is wrong with the GPU now (ps.Health); empty when nothing is.
	Health []string
	// InUse: a workload has processes on it.
	InUse bool
	// Node is the GPU's node in a cluster reading; AllocationsUnknown is true when that node's allocations are not
	// known while others' are.
	Node               string
	AllocationsUnknown bool
}

// SignalKind is what a signal says.
type SignalKind int

// The allocation signals.
const (
	Unrequested    SignalKind = iota // a pod uses a GPU that no allocation gives it
	IdleAllocation                   // a pod holds a GPU and runs nothing on it
	NodeProblem                      // a node of a cluster reading is stale, or cannot read its GPUs
)

// Signal is one allocation signal about one pod's container on one GPU or MIG device, or a node's problem.
type Signal struct {
	Kind  SignalKind
	GPU   string // as in the GPU column: "3", or "2:1/0" for a MIG device
	Owner string // namespace/pod/container; a NodeProblem's words
	// Node is the node of a cluster reading.
	Node   string
	gpuIdx int
}

func (s Signal) String() string {
	where := "GPU " + s.GPU
	if s.Node != "" {
		where += " of " + s.Node
	}
	switch s.Kind {
	case Unrequested:
		return fmt.Sprintf("unrequested use: %s on %s", s.Owner, where)
	case NodeProblem:
		return fmt.Sprintf("node %s: %s", s.Node, s.Owner)
	}
	return fmt.Sprintf("idle allocation: %s holds %s", s.Owner, where)
}

// Row is one process, or with View.Group one workload.
type Row struct {
	GPU       string // "0"; "2:1/0" for GPU 2's MIG device GI 1 CI 0; "0,1" for a workload on two GPUs
	PID       string // the PID, or the number of processes of a workload ("3 procs")
	Process   string // the process name; a workload's first, with "+N" other names
	Memory    gpu.Value
	SM        gpu.Value
	Owner     string // as ps's OWNER column; a grouped pod without its container
	Namespace string
	// Node is the row's node in a cluster reading; "3 nodes" for a workload on three.
	Node string
	// User is the process owner's user name or uid when users are looked up; a workload's first, with "+N" others.
	User string
	// Started is when the process started, a workload's earliest; zero when unknown.
	Started time.Time

	node string
	gpu  int
	pid  uint32
}

// Build lays out a reading. It is pure: the same reading and view give the same screen.
func Build(rd Reading, v View) Screen {
	if rd.Cluster != nil {
		return buildCluster(rd.Cluster, v)
	}
	r := rd.Result
	s := Screen{Simulated: r.Snapshot.Simulated, AllocationsKnown: rd.Allocations.Known}
	for _, d := range r.Snapshot.Devices {
		s.GPUs = append(s.GPUs, header(r, d))
		s.Processes += len(d.Processes)
	}
	slices.SortFunc(s.GPUs, func(a, b GPU) int { return cmp.Compare(a.Index, b.Index) })
	if rd.Allocations.Known {
		s.Signals = signals(rd.Allocations, s.GPUs)
	}
	s.Warnings = ps.Warnings(r.Snapshot)

	if v.Group {
		s.Rows = group(ps.Rows(r), v.Filter, workloadKey)
	} else {
		s.Rows = processRows(ps.Rows(r), v.Filter)
	}
	sortRows(s.Rows, v)
	return s
}

func processRows(all []ps.Row, filter string) []Row {
	rows := []Row{}
	for _, p := range all {
		if !matches(p, filter) {
			continue
		}
		row := Row{GPU: ps.GPUColumn(p.GPU, p.GPUInstance, p.ComputeInstance), PID: strconv.FormatUint(uint64(p.PID), 10),
			Process: p.ProcessName, Owner: ps.Owner(p), Namespace: p.Namespace, Node: p.Node, User: p.User, Started: p.Started,
			node: p.Node, gpu: p.GPU, pid: p.PID}
		if p.MemoryUsedBytes != nil {
			row.Memory = gpu.Known(float64(*p.MemoryUsedBytes))
		}
		if p.SMUtilization != nil {
			row.SM = gpu.Known(*p.SMUtilization)
		}
		rows = append(rows, row)
	}
	return rows
}

// matches is the `/` filter: a namespace, whole, or a part of the owner or of the node's name.
func matches(r ps.Row, filter string) bool {
	if filter == "" {
		return true
	}
	return strings.EqualFold(r.Namespace, filter) || ps.Filter{Owner: filter}.Match(r) ||
		r.Node != "" && strings.Contains(strings.ToLower(r.Node), strings.ToLower(filter))
}

func header(r *reading.Reading, d gpu.Device) GPU {
	g := GPU{
		Index: d.Index, Name: strings.TrimPrefix(d.Name, "NVIDIA "), Utilization: d.UtilizationRatio,
		MemoryUsed: d.MemoryUsedBytes, MemoryTotal: d.MemoryTotalBytes, Temperature: d.TemperatureCelsius,
		Power: d.PowerUsageWatts, Health: ps.Health(&d),
	}
	owners := make(map[string]bool)
	mps := false
	for _, p := range d.Processes {
		owners[workload(r, p)] = true
		mps = mps || p.Type == gpu.ProcessMPS
	}
	g.Mode = SharingMode(d.MIGMode == gpu.MIGEnabled, len(d.MIG), d.ProcessesListed, mps, len(owners))
	g.InUse = len(owners) > 0
	return g
}

// SharingMode says how a GPU is shared, from what gpu_info, gpu_mig_info, gpu_processes and gpu_workloads say of
// it: MIG and its instances, MPS or time-slicing and the workloads, one workload, idle, or "?" when its process
// list could not be read.
func SharingMode(mig bool, migInstances int, processesListed, mps bool, workloads int) string {
	switch {
	case mig:
		return fmt.Sprintf("MIG ×%d", migInstances)
	case !processesListed:
		return "?"
	case mps:
		return fmt.Sprintf("MPS ×%d", workloads)
	case workloads > 1:
		return fmt.Sprintf("shared ×%d", workloads)
	case workloads == 1:
		return "1 workload"
	}
	return "idle"
}

// workload names the owner of a process as sharing counts it: one pod container, container, job or service; a
// process nobody owns counts alone.
func workload(r *reading.Reading, p gpu.Process) string {
	key := r.Owner(p).Identity.Key()
	if key == (attribution.WorkloadKey{}) {
		return "pid " + strconv.FormatUint(uint64(p.PID), 10)
	}
	return fmt.Sprint(key)
}

// signals counts each GPU's allocations and lists the signals, GPU by GPU.
func signals(a allocation.Signals, gpus []GPU) []Signal {
	byIndex := make(map[int]*GPU, len(gpus))
	for i := range gpus {
		byIndex[gpus[i].Index] = &gpus[i]
	}
	type podOnGPU struct {
		gpu           int
		namespace, pd string
	}
	allocated, idle := make(map[podOnGPU]bool), make(map[podOnGPU]bool)
	var out []Signal
	for _, al := range a.Allocations {
		k := podOnGPU{al.GPU, al.Namespace, al.Pod}
		if g := byIndex[al.GPU]; g != nil && !allocated[k] {
			allocated[k] = true
			g.AllocatedPods++
		}
		if al.Processes == 0 {
			if g := byIndex[al.GPU]; g != nil && !idle[k] {
				idle[k] = true
				g.IdlePods++
			}
			out = append(out, Signal{Kind: IdleAllocation, GPU: ps.GPUColumn(al.GPU, instance(al.GPUInstance), instance(al.ComputeInstance)),
				Owner: al.Namespace + "/" + al.Pod + "/" + al.Container, gpuIdx: al.GPU})
		}
	}
	unrequested := make(map[podOnGPU]bool)
	for _, u := range a.Unrequested {
		k := podOnGPU{u.GPU, u.Namespace, u.Pod}
		if g := byIndex[u.GPU]; g != nil && !unrequested[k] {
			unrequested[k] = true
			g.Unrequested++
		}
		out = append(out, Signal{Kind: Unrequested, GPU: ps.GPUColumn(u.GPU, instance(u.GPUInstance), instance(u.ComputeInstance)),
			Owner: u.Namespace + "/" + u.Pod + "/" + u.Container, gpuIdx: u.GPU})
	}
	// Unrequested use first: it is the one that costs someone else their GPU.
	slices.SortStableFunc(out, func(x, y Signal) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.gpuIdx, y.gpuIdx), cmp.Compare(x.GPU, y.GPU), cmp.Compare(x.Owner, y.Owner))
	})
	return out
}

func instance(i int) *int {
	if i < 0 {
		return nil
	}
	return &i
}

// group makes one row per workload: a Kubernetes pod (all its containers), else whatever ps's OWNER names; key
// says which group a process belongs to and how its row names the owner. A process nobody owns stays a row of its
// own.
func group(all []ps.Row, filter string, key func(ps.Row) (key, owner string)) []Row {
	type place struct {
		node string
		gpu  int
	}
	type acc struct {
		row   Row
		gpus  []place
		nodes []string
		names []string
		users []string
		procs int
	}
	var order []string
	groups := make(map[string]*acc)
	for _, p := range all {
		if !matches(p, filter) {
			continue
		}
		k, owner := key(p)
		g := groups[k]
		if g == nil {
			g = &acc{row: Row{Owner: owner, Namespace: p.Namespace, node: p.Node, gpu: p.GPU, pid: p.PID}}
			groups[k] = g
			order = append(order, k)
		}
		g.procs++
		if pl := (place{p.Node, p.GPU}); !slices.Contains(g.gpus, pl) {
			g.gpus = append(g.gpus, pl)
		}
		if !slices.Contains(g.nodes, p.Node) {
			g.nodes = append(g.nodes, p.Node)
		}
		if p.ProcessName != "" && !slices.Contains(g.names, p.ProcessName) {
			g.names = append(g.names, p.ProcessName)
		}
		if p.MemoryUsedBytes != nil {
			g.row.Memory = gpu.Known(g.row.Memory.V + float64(*p.MemoryUsedBytes))
		}
		if p.User != "" && !slices.Contains(g.users, p.User) {
			g.users = append(g.users, p.User)
		}
		if !p.Started.IsZero() && (g.row.Started.IsZero() || p.Started.Before(g.row.Started)) {
			g.row.Started = p.Started
		}
		if p.SMUtilization != nil {
			g.row.SM = gpu.Known(g.row.SM.V + *p.SMUtilization)
		}
		g.row.node, g.row.gpu, g.row.pid = min(g.row.node, p.Node), min(g.row.gpu, p.GPU), min(g.row.pid, p.PID)
	}
	rows := make([]Row, 0, len(order))
	for _, k := range order {
		g := groups[k]
		g.row.Node = g.nodes[0]
		if len(g.nodes) > 1 {
			g.row.Node = fmt.Sprintf("%d nodes", len(g.nodes))
			g.row.GPU = fmt.Sprintf("%d GPUs", len(g.gpus))
		} else {
			gpus := make([]int, len(g.gpus))
			for i, pl := range g.gpus {
				gpus[i] = pl.gpu
			}
			slices.Sort(gpus)
			cols := make([]string, len(gpus))
			for i, n := range gpus {
				cols[i] = strconv.Itoa(n)
			}
			g.row.GPU = strings.Join(cols, ",")
		}
		g.row.PID = strconv.FormatUint(uint64(g.row.pid), 10)
		if g.procs > 1 {
			g.row.PID = fmt.Sprintf("%d procs", g.procs)
		}
		if len(g.users) > 0 {
			g.row.User = g.users[0]
			if len(g.users) > 1 {
				g.row.User += fmt.Sprintf(" +%d", len(g.users)-1)
			}
		}
		if len(g.names) > 0 {
			g.row.Process = g.names[0]
			if len(g.names) > 1 {
				g.row.Process += fmt.Sprintf(" +%d", len(g.names)-1)
			}
		}
		rows = append(rows, g.row)
	}
	return rows
}

// workloadKey groups a pod's containers together, and otherwise processes with the same owner; a process nobody
// owns is a group of its own.
func workloadKey(p ps.Row) (key, owner string) {
	owner = ps.Owner(p)
	switch {
	case p.Pod != "":
		return "pod\x00" + p.Namespace + "\x00" + p.Pod, "pod " + p.Namespace + "/" + p.Pod
	case owner == "-" || owner == "container":
		return "pid\x00" + p.Node + "\x00" + strconv.FormatUint(uint64(p.PID), 10), owner
	}
	return owner, owner
}

// namespaceKey groups the pods of a namespace together, and everything else as workloadKey does.
func namespaceKey(p ps.Row) (key, owner string) {
	if p.Namespace != "" {
		return "namespace\x00" + p.Namespace, "namespace " + p.Namespace
	}
	return workloadKey(p)
}

// sortRows orders rows; unknown values sort last, and ties go by node, GPU then PID so that rows do not jump
// about between readings. With ByNode, rows are ordered node by node first.
func sortRows(rows []Row, v View) {
	value := func(r Row) gpu.Value { return gpu.Value{} }
	switch v.Sort {
	case ByMemory:
		value = func(r Row) gpu.Value { return r.Memory }
	case BySM:
		value = func(r Row) gpu.Value { return r.SM }
	}
	slices.SortStableFunc(rows, func(a, b Row) int {
		if v.ByNode {
			if c := cmp.Compare(a.node, b.node); c != 0 {
				return c
			}
		}
		va, vb := value(a), value(b)
		if va.Valid != vb.Valid {
			if va.Valid {
				return -1
			}
			return 1
		}
		return cmp.Or(-cmp.Compare(va.V, vb.V), cmp.Compare(a.node, b.node), cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.pid, b.pid),
			cmp.Compare(a.Owner, b.Owner))
	})
}
