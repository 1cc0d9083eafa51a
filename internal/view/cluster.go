package view

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Summarize completes a cluster's reading once its nodes, GPUs, processes and allocation signals are in: each
// GPU's health, each node's counts, a signal per GPU with a health problem and per node that cannot be trusted,
// everything in its order.
func Summarize(r *Reading) {
	r.Cluster = true
	slices.SortFunc(r.Nodes, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	byName := make(map[string]*Node, len(r.Nodes))
	for i := range r.Nodes {
		n := &r.Nodes[i]
		n.GPUs, n.Busy, n.Unhealthy, n.IdleAllocations, n.Unrequested = 0, 0, 0, 0, 0
		n.Utilization, n.MemoryUsed, n.MemoryTotal = gpu.Value{}, gpu.Value{}, gpu.Value{}
		byName[n.Name] = n
		r.Simulated = r.Simulated || n.Simulated
		r.AllocationsKnown = r.AllocationsKnown || n.AllocationsKnown
	}
	utilization := make(map[*Node]int)
	for i := range r.GPUs {
		g := &r.GPUs[i]
		n := byName[g.Node]
		if n == nil {
			continue
		}
		n.GPUs++
		if g.InUse() {
			n.Busy++
		}
		if len(g.Health) > 0 {
			n.Unhealthy++
		}
		if g.Utilization.Valid {
			n.Utilization = add(n.Utilization, g.Utilization)
			utilization[n]++
		}
		// A sum that left out a GPU would read as the node's whole: unknown for one GPU is unknown for the node.
		if n.GPUs == 1 {
			n.MemoryUsed, n.MemoryTotal = g.MemoryUsed, g.MemoryTotal
		} else {
			n.MemoryUsed, n.MemoryTotal = addKnown(n.MemoryUsed, g.MemoryUsed), addKnown(n.MemoryTotal, g.MemoryTotal)
		}
		if s, ok := HealthSignal(g); ok {
			r.Signals = append(r.Signals, s)
		}
	}
	for n, k := range utilization {
		n.Utilization.V /= float64(k)
	}
	// Each GPU's pods idle and using it unrequested, once each, from the signals of its containers.
	byGPU := make(map[string]*GPU, len(r.GPUs))
	for i := range r.GPUs {
		byGPU[r.GPUs[i].Node+"\x00"+strconv.Itoa(r.GPUs[i].Index)] = &r.GPUs[i]
	}
	type podOnGPU struct {
		kind           SignalKind
		node           string
		gpu            int
		namespace, pod string
	}
	pods := make(map[podOnGPU]bool)
	for _, s := range r.Signals {
		if n := byName[s.Node]; n != nil {
			switch s.Kind {
			case Unrequested:
				n.Unrequested++
			case IdleAllocation:
				n.IdleAllocations++
			}
		}
		if s.Kind != Unrequested && s.Kind != IdleAllocation {
			continue
		}
		g := byGPU[s.Node+"\x00"+strconv.Itoa(s.gpuIndex)]
		if k := (podOnGPU{s.Kind, s.Node, s.gpuIndex, s.Namespace, s.Pod}); g != nil && !pods[k] {
			pods[k] = true
			if s.Kind == Unrequested {
				g.Unrequested++
			} else {
				g.IdlePods++
			}
		}
	}
	for _, n := range r.Nodes {
		if n.State != NodeUp {
			r.Signals = append(r.Signals, Signal{Kind: NodeProblem, Severity: Unreadable, Node: n.Name, Text: n.Problem()})
		}
	}
	slices.SortFunc(r.GPUs, func(a, b GPU) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(a.Index, b.Index))
	})
	SortProcesses(r.Processes, ByGPU)
	SortSignals(r.Signals)
}

// Filtered is the part of a reading that a filter keeps: the processes that match it; in a cluster, the nodes
// whose name matches or that run a matching process, with their GPUs, and the signals that match it. A node's own
// GPUs and signals are all kept: there are few, and the filter is about who uses them.
func (r *Reading) Filtered(f Filter) *Reading {
	if f.Empty() {
		return r
	}
	out := *r
	out.Processes = make([]Process, 0, len(r.Processes)/4)
	running := make(map[string]bool)
	for i := range r.Processes {
		if f.Process(&r.Processes[i]) {
			out.Processes = append(out.Processes, r.Processes[i])
			running[r.Processes[i].Node] = true
		}
	}
	if !r.Cluster {
		return &out
	}
	out.Nodes, out.GPUs, out.Signals = nil, nil, nil
	kept := make(map[string]bool)
	for _, n := range r.Nodes {
		if running[n.Name] || f.Node(n.Name) {
			kept[n.Name] = true
			out.Nodes = append(out.Nodes, n)
		}
	}
	for _, g := range r.GPUs {
		if kept[g.Node] {
			out.GPUs = append(out.GPUs, g)
		}
	}
	for _, s := range r.Signals {
		if f.Signal(&s) || s.Kind == NodeProblem && kept[s.Node] {
			out.Signals = append(out.Signals, s)
		}
	}
	return &out
}

// addKnown is the sum of two values, unknown when either is.
func addKnown(a, b gpu.Value) gpu.Value {
	if !a.Valid || !b.Valid {
		return gpu.Value{}
	}
	return gpu.Known(a.V + b.V)
}
