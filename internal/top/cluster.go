package top

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
)

// Cluster is a reading of many nodes, already in the node view's terms: what internal/cluster reads from
// Prometheus. Build lays it out like a node's reading, with a line per node above the GPUs.
type Cluster struct {
	// Time is when the reading was evaluated.
	Time time.Time
	// Nodes are the nodes' states, by name; their counts are filled in by Build from the GPUs and signals.
	Nodes []Node
	// GPUs have their Node set, by node then index.
	GPUs []GPU
	// Signals have their Node set.
	Signals []Signal
	// Rows have their Node set.
	Rows     []ps.Row
	Warnings []string
}

// NodeState is whether a node's readings are current.
type NodeState int

// The states of a node, by how much of it can be trusted.
const (
	NodeUp         NodeState = iota // its exporter answers and reads its GPUs
	NodeSourceDown                  // its exporter answers but cannot read the GPUs: no GPU series
	NodeDown                        // Prometheus cannot scrape its exporter (up == 0)
	NodeStale                       // its last reading is older than two scrape intervals
)

// Node is one node's line.
type Node struct {
	Name  string
	State NodeState
	// Age is how long ago its last reading was taken; LastSeen is false when none was seen in the window queried.
	Age      time.Duration
	LastSeen bool
	// AllocationsKnown is true when its exporter reads the kubelet's allocations.
	AllocationsKnown bool
	Simulated        bool

	// Filled in by Build from the node's GPUs and signals.
	GPUs, Busy                   int
	Utilization                  gpu.Value // mean over the GPUs that report it
	MemoryUsed, MemoryTotal      gpu.Value // bytes, summed
	IdleAllocations, Unrequested int
}

// Stale reports whether the node's readings are not current: its exporter is down or its last reading is old.
func (n Node) Stale() bool { return n.State == NodeDown || n.State == NodeStale }

// Problem says what is wrong with the node, "" when nothing is: the words of its signal line and of ps' warning.
func (n Node) Problem() string {
	last := "no reading in the last hour"
	if n.LastSeen {
		last = "last reading " + Age(n.Age) + " ago"
	}
	switch n.State {
	case NodeSourceDown:
		return "its exporter cannot read the GPUs"
	case NodeDown:
		return "stale: exporter down, " + last
	case NodeStale:
		return "stale: " + last
	}
	return ""
}

// stateCell is the node line's EXPORTER column.
func (n Node) stateCell() string {
	switch n.State {
	case NodeSourceDown:
		return "no GPU reading"
	case NodeDown:
		if n.LastSeen {
			return "stale " + Age(n.Age) + " (down)"
		}
		return "stale (down)"
	case NodeStale:
		if n.LastSeen {
			return "stale " + Age(n.Age)
		}
		return "stale"
	}
	return "up"
}

// Age writes a duration as a person reads an age: 45s, 12m, 3h, 2d.
func Age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(int(d.Seconds()), 0))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// buildCluster lays out a cluster reading. The filter keeps the nodes whose name contains it and the nodes that run
// a matching process, with their GPUs and signals, and the matching processes: at a thousand nodes, "/" is how a
// person finds one.
func buildCluster(c *Cluster, v View) Screen {
	s := Screen{Cluster: true, Time: c.Time, Warnings: c.Warnings}
	s.Processes = len(c.Rows)
	keep := make(map[string]bool) // nodes that run a matching process
	for _, r := range c.Rows {
		if matches(r, v.Filter) {
			keep[r.Node] = true
		}
	}
	filter := strings.ToLower(v.Filter)
	named := func(name string) bool { return strings.Contains(strings.ToLower(name), filter) }
	nodeMatch := func(name string) bool { return v.Filter == "" || keep[name] || named(name) }
	// A signal is kept for its node's name, or for its pod's namespace or owner; a node's problem with its node.
	signalMatch := func(sig Signal) bool {
		ns, _, _ := strings.Cut(sig.Owner, "/")
		return v.Filter == "" || named(sig.Node) || sig.Kind == NodeProblem && keep[sig.Node] ||
			sig.Kind != NodeProblem && (strings.EqualFold(ns, v.Filter) || strings.Contains(strings.ToLower(sig.Owner), filter))
	}
	byName := make(map[string]*Node)
	for _, n := range c.Nodes {
		if nodeMatch(n.Name) {
			n.GPUs, n.Busy, n.IdleAllocations, n.Unrequested = 0, 0, 0, 0
			s.Nodes = append(s.Nodes, n)
		}
	}
	for i := range s.Nodes {
		byName[s.Nodes[i].Name] = &s.Nodes[i]
		s.Simulated = s.Simulated || s.Nodes[i].Simulated
	}
	utilization := make(map[string]float64)
	reporting := make(map[string]int)
	for _, g := range c.GPUs {
		n := byName[g.Node]
		if n == nil {
			continue
		}
		s.GPUs = append(s.GPUs, g)
		n.GPUs++
		if g.InUse {
			n.Busy++
		}
		if g.Utilization.Valid {
			utilization[g.Node] += g.Utilization.V
			reporting[g.Node]++
		}
		if g.MemoryUsed.Valid {
			n.MemoryUsed = gpu.Known(n.MemoryUsed.V + g.MemoryUsed.V)
		}
		if g.MemoryTotal.Valid {
			n.MemoryTotal = gpu.Known(n.MemoryTotal.V + g.MemoryTotal.V)
		}
	}
	for name, k := range reporting {
		byName[name].Utilization = gpu.Known(utilization[name] / float64(k))
	}
	for _, sig := range c.Signals {
		n := byName[sig.Node]
		if n == nil {
			continue
		}
		switch sig.Kind {
		case Unrequested:
			n.Unrequested++
		case IdleAllocation:
			n.IdleAllocations++
		}
		if signalMatch(sig) {
			s.Signals = append(s.Signals, sig)
		}
	}
	s.AllocationsKnown = false
	for _, n := range s.Nodes {
		if sig := (Signal{Kind: NodeProblem, Node: n.Name, Owner: n.Problem()}); n.State != NodeUp && signalMatch(sig) {
			s.Signals = append(s.Signals, sig)
		}
		s.AllocationsKnown = s.AllocationsKnown || n.AllocationsKnown
	}
	sortSignals(s.Signals)

	switch {
	case v.Group && v.Namespaces:
		s.Rows = group(c.Rows, v.Filter, namespaceKey)
	case v.Group:
		s.Rows = group(c.Rows, v.Filter, workloadKey)
	default:
		s.Rows = processRows(c.Rows, v.Filter)
	}
	sortRows(s.Rows, v)
	return s
}

// sortSignals puts the nodes that cannot be trusted first, then the use that costs someone else their GPU, then
// idle allocations, each by node and GPU.
func sortSignals(sigs []Signal) {
	rank := map[SignalKind]int{NodeProblem: 0, Unrequested: 1, IdleAllocation: 2}
	slices.SortStableFunc(sigs, func(x, y Signal) int {
		return cmp.Or(cmp.Compare(rank[x.Kind], rank[y.Kind]), cmp.Compare(x.Node, y.Node), cmp.Compare(x.gpuIdx, y.gpuIdx),
			cmp.Compare(x.GPU, y.GPU), cmp.Compare(x.Owner, y.Owner))
	})
}

// NewSignal is a signal about a pod's container on one GPU or MIG device of a node, for readers outside this
// package.
func NewSignal(kind SignalKind, node string, gpuIndex int, gi, ci *int, owner string) Signal {
	return Signal{Kind: kind, Node: node, GPU: ps.GPUColumn(gpuIndex, gi, ci), Owner: owner, gpuIdx: gpuIndex}
}
