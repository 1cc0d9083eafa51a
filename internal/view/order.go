package view

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Sort is an order of processes or workloads.
type Sort int

// The orders.
const (
	ByGPU    Sort = iota // node, GPU, then PID
	ByMemory             // most memory first
	BySM                 // highest SM utilization first
	ByAge                // longest running first
	ByPID
	ByUser
	ByOwner
)

var sortNames = []struct {
	names []string
	sort  Sort
}{
	{[]string{"gpu"}, ByGPU}, {[]string{"memory", "mem"}, ByMemory}, {[]string{"sm"}, BySM}, {[]string{"age"}, ByAge},
	{[]string{"pid"}, ByPID}, {[]string{"user"}, ByUser}, {[]string{"owner"}, ByOwner},
}

// SortNames are the names ParseSort reads, for a flag's help and completion.
func SortNames() []string {
	var out []string
	for _, s := range sortNames {
		out = append(out, s.names...)
	}
	return out
}

func (s Sort) String() string {
	for _, n := range sortNames {
		if n.sort == s {
			if s == BySM {
				return "SM"
			}
			if s == ByGPU {
				return "GPU"
			}
			return n.names[0]
		}
	}
	return "GPU"
}

// ParseSort reads a --sort value.
func ParseSort(s string) (Sort, error) {
	for _, n := range sortNames {
		if slices.Contains(n.names, strings.ToLower(s)) {
			return n.sort, nil
		}
	}
	return ByGPU, fmt.Errorf("unknown sort %q: want one of %s", s, strings.Join(SortNames(), ", "))
}

// sortKey is what a sort compares of a process or a workload.
type sortKey struct {
	node          string
	gpu           int
	pid           uint32
	memory, sm    gpu.Value
	started       time.Time
	user, owner   string
	name, gpuCell string
}

// compare orders two keys by s; unknown values go last, and ties go by node, GPU then PID, so that rows do not jump
// about between readings.
func (s Sort) compare(a, b *sortKey) int {
	value := func(v, w gpu.Value) int {
		if v.Valid != w.Valid {
			if v.Valid {
				return -1
			}
			return 1
		}
		return -cmp.Compare(v.V, w.V)
	}
	c := 0
	switch s {
	case ByMemory:
		c = value(a.memory, b.memory)
	case BySM:
		c = value(a.sm, b.sm)
	case ByAge:
		switch {
		case a.started.IsZero() != b.started.IsZero():
			c = cmp.Compare(boolRank(a.started.IsZero()), boolRank(b.started.IsZero()))
		default:
			c = a.started.Compare(b.started)
		}
	case ByPID:
		c = cmp.Compare(a.pid, b.pid)
	case ByUser:
		c = cmp.Compare(a.user, b.user)
	case ByOwner:
		c = cmp.Compare(a.owner, b.owner)
	}
	return cmp.Or(c, cmp.Compare(a.node, b.node), cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.gpuCell, b.gpuCell),
		cmp.Compare(a.pid, b.pid), cmp.Compare(a.owner, b.owner))
}

func (p *Process) sortKey(s Sort) sortKey {
	k := sortKey{node: p.Node, gpu: p.GPU, pid: p.PID, memory: p.Memory, sm: p.SM, started: p.Started, user: p.Identity.User}
	if s == ByOwner {
		k.owner = p.Owner().String()
	}
	if p.MIG {
		k.gpuCell = p.GPUColumn()
	}
	return k
}

// SortProcesses orders processes by s, in place: it sorts their keys, then moves each process once, so that a
// cluster's 32,000 rows are not copied.
func SortProcesses(ps []Process, s Sort) {
	keys := make([]sortKey, len(ps))
	idx := make([]int, len(ps))
	for i := range ps {
		keys[i], idx[i] = ps[i].sortKey(s), i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return s.compare(&keys[a], &keys[b]) })
	// idx[i] is the process that goes to i: follow each cycle of the permutation with one process in hand.
	for i := range idx {
		if idx[i] < 0 || idx[i] == i {
			continue
		}
		held := ps[i]
		j := i
		for idx[j] != i {
			next := idx[j]
			ps[j] = ps[next]
			idx[j] = -1
			j = next
		}
		ps[j] = held
		idx[j] = -1
	}
}

// Grouping is what processes are grouped into.
type Grouping int

// The groupings.
const (
	Processes  Grouping = iota // a row per process per GPU
	Workloads                  // a row per workload (WorkloadOf)
	Namespaces                 // a row per Kubernetes namespace, and per workload outside one
)

// Workload is the processes of one workload (or one namespace), summed.
type Workload struct {
	Owner     Owner
	Namespace string
	// Nodes it runs on; GPUs its GPUs (and MIG devices) as the GPU column names them, of all its nodes, and Places
	// the distinct GPUs of its nodes.
	Nodes  []string
	GPUs   []string
	Places int
	// Processes counts its processes, one per process per GPU; Names and Users are their distinct names and users,
	// in the order first seen.
	Processes    int
	Names, Users []string
	// Memory and SM are summed over its processes and GPUs: an SM of 7.6 is eight GPUs' worth, nearly all busy.
	Memory, SM gpu.Value
	// Started is its earliest process's start.
	Started time.Time
	// Key is the workload's name as History keeps it (WorkloadName), or its namespace's.
	Key string
	// Process is its first process.
	Process *Process
	first   sortKey
}

// Group sums processes into workloads (or namespaces), in the order of their first process. A workload is one
// identity (WorkloadOf) on one node; a Slurm job's identity is the job wherever it runs, so its nodes are one.
func Group(ps []Process, by Grouping) []Workload {
	index := make(map[string]int)
	places := make(map[[2]string]bool)
	var out []Workload
	for i := range ps {
		p := &ps[i]
		key, owner := workloadKey(p, by)
		j, ok := index[key]
		if !ok {
			j = len(out)
			index[key] = j
			out = append(out, Workload{Owner: owner, Namespace: p.Identity.Namespace, Key: key, Process: p, first: p.sortKey(ByGPU)})
		}
		w := &out[j]
		w.Processes++
		column := p.GPUColumn()
		if place := [2]string{p.Node + "\x00" + column, key}; !places[place] {
			places[place] = true
			w.Places++
		}
		w.GPUs = appendNew(w.GPUs, column)
		w.Nodes = appendNew(w.Nodes, p.Node)
		if p.Name != "" {
			w.Names = appendNew(w.Names, p.Name)
		}
		if p.Identity.User != "" {
			w.Users = appendNew(w.Users, p.Identity.User)
		}
		w.Memory = add(w.Memory, p.Memory)
		w.SM = add(w.SM, p.SM)
		if !p.Started.IsZero() && (w.Started.IsZero() || p.Started.Before(w.Started)) {
			w.Started = p.Started
		}
		w.first.pid = min(w.first.pid, p.PID)
	}
	for i := range out {
		slices.SortFunc(out[i].GPUs, compareGPUColumns)
	}
	return out
}

// workloadKey is the group of a process, and its owner as the group's row names it.
func workloadKey(p *Process, by Grouping) (string, Owner) {
	id := &p.Identity
	if by == Namespaces && id.Namespace != "" {
		return "namespace\x00" + id.Namespace, Owner{KindNamespace, []string{id.Namespace}}
	}
	key := WorkloadName(p.Node, id)
	o := OwnerOf(id)
	if o.Kind == KindPod && id.Container == "" {
		o.Names = o.Names[:2]
	}
	if o.Kind == KindContainer && len(o.Names) == 0 {
		o = Owner{} // containers no runtime named are not one workload's: they are the unnamed one
	}
	return key, o
}

// WorkloadName names the workload of an identity on a node, as Workload.Key and History name it: its identity
// (WorkloadOf), and its node unless it is a Slurm job, which is the job wherever it runs. A pod or a service is of
// one node; the same names on another node are another workload.
func WorkloadName(node string, id *attribution.Identity) string {
	k := WorkloadOf(id)
	key := strings.Join(k[:], "\x00")
	if id.SlurmJobID == "" {
		key = node + "\x00" + key
	}
	return key
}

// SortWorkloads orders workloads by s, as SortProcesses orders processes; a workload's node, GPU and PID are its
// first process's.
func SortWorkloads(ws []Workload, s Sort) {
	slices.SortStableFunc(ws, func(a, b Workload) int {
		ka, kb := a.first, b.first
		ka.memory, ka.sm, ka.started, kb.memory, kb.sm, kb.started = a.Memory, a.SM, a.Started, b.Memory, b.SM, b.Started
		ka.owner, kb.owner = a.Owner.String(), b.Owner.String()
		if len(a.Users) > 0 {
			ka.user = a.Users[0]
		}
		if len(b.Users) > 0 {
			kb.user = b.Users[0]
		}
		return s.compare(&ka, &kb)
	})
}

// boolRank puts false before true.
func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

func add(sum, v gpu.Value) gpu.Value {
	if !v.Valid {
		return sum
	}
	return gpu.Known(sum.V + v.V)
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// compareGPUColumns orders GPU columns by index, then MIG device: "2" < "2:1/0" < "10".
func compareGPUColumns(a, b string) int {
	ia, ra, _ := strings.Cut(a, ":")
	ib, rb, _ := strings.Cut(b, ":")
	na, _ := strconv.Atoi(ia)
	nb, _ := strconv.Atoi(ib)
	return cmp.Or(cmp.Compare(na, nb), cmp.Compare(ra, rb))
}
