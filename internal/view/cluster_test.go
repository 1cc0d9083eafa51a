package view

import (
	"slices"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// A GPU counts each pod once, however many of its containers a signal names, and a pod is its own name, not the
// text up to a slash in it: the names come from Prometheus' labels, which can hold anything.
func TestSummarizeCountsPodsByTheirNames(t *testing.T) {
	r := &Reading{
		Nodes: []Node{{Name: "a"}},
		GPUs:  []GPU{{Node: "a", Index: 0}, {Node: "a", Index: 1}},
		Signals: []Signal{
			AllocationSignal(Unrequested, "a", 0, false, 0, 0, "ml", "train/0", "c"),
			AllocationSignal(Unrequested, "a", 0, false, 0, 0, "ml", "train/1", "c"),
			AllocationSignal(Unrequested, "a", 0, false, 0, 0, "ml", "train/1", "sidecar"),
			AllocationSignal(IdleAllocation, "a", 1, true, 1, 0, "ml", "serve", "c"),
			AllocationSignal(IdleAllocation, "a", 1, true, 2, 0, "ml", "serve", "c"),
		},
	}
	Summarize(r)
	if g := r.GPUs[0]; g.Unrequested != 2 || g.IdlePods != 0 {
		t.Errorf("GPU 0: %d pods unrequested, %d idle; want 2, 0", g.Unrequested, g.IdlePods)
	}
	if g := r.GPUs[1]; g.Unrequested != 0 || g.IdlePods != 1 {
		t.Errorf("GPU 1: %d pods unrequested, %d idle; want 0, 1", g.Unrequested, g.IdlePods)
	}
}

// The namespace filter keeps a signal by its pod's namespace, whole: not by the text before a slash.
func TestNamespaceFilterReadsTheSignalsNamespace(t *testing.T) {
	for _, c := range []struct {
		namespace, filter string
		keep              bool
	}{
		{"ml", "ns:ml", true},
		{"ml", "ns:ML", true},
		{"ml/x", "ns:ml", false},
		{"ml", "ns:m", false},
	} {
		s := AllocationSignal(Unrequested, "a", 0, false, 0, 0, c.namespace, "p", "c")
		if got := ParseFilter(c.filter).Signal(&s); got != c.keep {
			t.Errorf("signal in namespace %q, filter %q: kept %v, want %v", c.namespace, c.filter, got, c.keep)
		}
	}
	health := Signal{Kind: GPUHealth, Text: "ml/p/c"}
	if ParseFilter("ns:ml").Signal(&health) {
		t.Error("the namespace filter keeps a GPU's health signal")
	}
}

// A node's memory is the sum of its GPUs' only when every GPU reports it: a sum that left one out would read as the
// node's whole.
func TestANodesMemoryIsUnknownWhenAGPUsIs(t *testing.T) {
	const g = 1 << 30
	r := &Reading{
		Nodes: []Node{{Name: "a"}, {Name: "b"}, {Name: "c"}},
		GPUs: []GPU{
			{Node: "a", Index: 0, MemoryUsed: gpu.Known(40 * g), MemoryTotal: gpu.Known(80 * g)},
			{Node: "a", Index: 1, MemoryUsed: gpu.Known(10 * g), MemoryTotal: gpu.Known(80 * g)},
			{Node: "b", Index: 0, MemoryUsed: gpu.Known(40 * g), MemoryTotal: gpu.Known(80 * g)},
			{Node: "b", Index: 1, MemoryTotal: gpu.Known(80 * g)},
			{Node: "c", Index: 0, MemoryTotal: gpu.Known(80 * g)},
			{Node: "c", Index: 1, MemoryUsed: gpu.Known(40 * g), MemoryTotal: gpu.Known(80 * g)},
		},
	}
	Summarize(r)
	var got []string
	for _, n := range r.Nodes {
		got = append(got, n.Name+" "+MemoryPair(n.MemoryUsed, n.MemoryTotal))
	}
	if want := []string{"a 50/160G", "b -", "c -"}; !slices.Equal(got, want) {
		t.Errorf("nodes' memory %q, want %q", got, want)
	}
}
