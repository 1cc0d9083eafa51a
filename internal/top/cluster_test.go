package top

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
)

func clusterRow(node string, g int, pid uint32, mem float64, sm float64, id attribution.Identity) ps.Row {
	b := uint64(mem * gib)
	return ps.Row{Node: node, GPU: g, PID: pid, ProcessName: "python3", ProcessType: "compute", MemoryUsedBytes: &b,
		SMUtilization: &sm, Identity: id}
}

func podID(ns, pod, container string) attribution.Identity {
	return attribution.Identity{Namespace: ns, Pod: pod, Container: container}
}

// threeNodes: gpu-a has a MIG GPU and an idle allocation, gpu-b an unrequested use, gpu-c's exporter is down; a
// Slurm job runs on gpu-a and gpu-b.
func threeNodes() *Cluster {
	two := func(n int) *int { return &n }
	return &Cluster{
		Time: time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC),
		Nodes: []Node{
			{Name: "gpu-a", AllocationsKnown: true, LastSeen: true, Age: time.Second},
			{Name: "gpu-b", AllocationsKnown: true, LastSeen: true, Age: time.Second},
			{Name: "gpu-c", State: NodeDown, LastSeen: true, Age: 12 * time.Second},
		},
		GPUs: []GPU{
			{Node: "gpu-a", Index: 0, Name: "A100-SXM4-80GB", Utilization: gpu.Known(0.4), MemoryUsed: gpu.Known(20 * gib),
				MemoryTotal: gpu.Known(80 * gib), Mode: "MIG ×2", InUse: true, AllocatedPods: 2, IdlePods: 1},
			{Node: "gpu-a", Index: 1, Name: "A100-SXM4-80GB", Utilization: gpu.Known(0.8), MemoryUsed: gpu.Known(30 * gib),
				MemoryTotal: gpu.Known(80 * gib), Mode: "1 workload", InUse: true},
			{Node: "gpu-b", Index: 0, Name: "H100 80GB HBM3", Utilization: gpu.Known(0.9), MemoryUsed: gpu.Known(60 * gib),
				MemoryTotal: gpu.Known(80 * gib), Mode: "shared ×2", InUse: true, Unrequested: 1},
		},
		Signals: []Signal{
			NewSignal(Unrequested, "gpu-b", 0, nil, nil, "ds/sneaky-0/jupyter"),
			NewSignal(IdleAllocation, "gpu-a", 0, two(2), two(0), "ml/idle-0/nb"),
		},
		Rows: []ps.Row{
			clusterRow("gpu-a", 0, 10, 20, 0.3, podID("ml", "train-0", "trainer")),
			clusterRow("gpu-a", 1, 11, 30, 0.8, attribution.Identity{SlurmJobID: "4711"}),
			clusterRow("gpu-b", 0, 11, 40, 0.6, attribution.Identity{SlurmJobID: "4711"}),
			clusterRow("gpu-b", 0, 12, 20, 0.3, podID("ds", "sneaky-0", "jupyter")),
			clusterRow("gpu-b", 0, 13, 1, 0.01, podID("ml", "serve-0", "server")),
		},
	}
}

func TestClusterNodeLinesAndSignals(t *testing.T) {
	s := Build(Reading{Cluster: threeNodes()}, View{})
	var nodes []string
	for _, n := range s.Nodes {
		nodes = append(nodes, fmt.Sprintf("%s gpus=%d busy=%d util=%v mem=%v/%v idle=%d unreq=%d", n.Name, n.GPUs, n.Busy,
			n.Utilization, n.MemoryUsed.V/gib, n.MemoryTotal.V/gib, n.IdleAllocations, n.Unrequested))
	}
	want := "gpu-a gpus=2 busy=2 util={0.6000000000000001 true} mem=50/160 idle=1 unreq=0\n" +
		"gpu-b gpus=1 busy=1 util={0.9 true} mem=60/80 idle=0 unreq=1\n" +
		"gpu-c gpus=0 busy=0 util={0 false} mem=0/0 idle=0 unreq=0"
	if strings.Join(nodes, "\n") != want {
		t.Errorf("nodes:\n%s\nwant\n%s", strings.Join(nodes, "\n"), want)
	}
	var sigs []string
	for _, sig := range s.Signals {
		sigs = append(sigs, sig.String())
	}
	wantSigs := "node gpu-c: stale: exporter down, last reading 12s ago\n" +
		"unrequested use: ds/sneaky-0/jupyter on GPU 0 of gpu-b\n" +
		"idle allocation: ml/idle-0/nb holds GPU 0:2/0 of gpu-a"
	if strings.Join(sigs, "\n") != wantSigs {
		t.Errorf("signals:\n%s\nwant\n%s", strings.Join(sigs, "\n"), wantSigs)
	}
	if !s.AllocationsKnown || s.Processes != 5 || len(s.Rows) != 5 {
		t.Errorf("allocations known %v, %d processes, %d rows", s.AllocationsKnown, s.Processes, len(s.Rows))
	}
}

// The filter narrows everything: by a node's name, or to the nodes that run what matches.
func TestClusterFilter(t *testing.T) {
	for _, c := range []struct {
		filter, nodes, pids string
		signals             int
	}{
		{"gpu-b", "[gpu-b]", "[11 12 13]", 1},
		{"ml", "[gpu-a gpu-b]", "[10 13]", 1},
		{"slurm", "[gpu-a gpu-b]", "[11 11]", 0},
		{"sneaky", "[gpu-b]", "[12]", 1},
		{"gpu-c", "[gpu-c]", "[]", 1},
		{"nothing", "[]", "[]", 0},
	} {
		s := Build(Reading{Cluster: threeNodes()}, View{Filter: c.filter})
		var nodes, pids []string
		for _, n := range s.Nodes {
			nodes = append(nodes, n.Name)
		}
		for _, r := range s.Rows {
			pids = append(pids, r.PID)
		}
		if fmt.Sprint(nodes) != c.nodes || fmt.Sprint(pids) != c.pids || len(s.Signals) != c.signals {
			t.Errorf("/%s: nodes %v pids %v %d signals, want %s %s %d", c.filter, nodes, pids, len(s.Signals), c.nodes, c.pids, c.signals)
		}
	}
}

func TestClusterGroups(t *testing.T) {
	rows := func(v View) string {
		var out []string
		for _, r := range Build(Reading{Cluster: threeNodes()}, v).Rows {
			out = append(out, fmt.Sprintf("%s|%s|%s|%s|%s", r.Node, r.GPU, r.PID, ps.Memory(r.Memory), r.Owner))
		}
		return strings.Join(out, "\n")
	}
	// By workload: a pod on its node, the Slurm job over both of its nodes.
	if got, want := rows(View{Group: true, Sort: ByMemory}), "2 nodes|2 GPUs|2 procs|70.0 GiB|slurm job 4711\n"+
		"gpu-a|0|10|20.0 GiB|pod ml/train-0\n"+
		"gpu-b|0|12|20.0 GiB|pod ds/sneaky-0\n"+
		"gpu-b|0|13|1.0 GiB|pod ml/serve-0"; got != want {
		t.Errorf("by workload:\n%s\nwant\n%s", got, want)
	}
	// By namespace: which namespaces hold the most GPU memory.
	if got, want := rows(View{Group: true, Namespaces: true, Sort: ByMemory}), "2 nodes|2 GPUs|2 procs|70.0 GiB|slurm job 4711\n"+
		"2 nodes|2 GPUs|2 procs|21.0 GiB|namespace ml\n"+
		"gpu-b|0|12|20.0 GiB|namespace ds"; got != want {
		t.Errorf("by namespace:\n%s\nwant\n%s", got, want)
	}
	// By node: node by node, by memory within each.
	if got, want := rows(View{ByNode: true, Sort: ByMemory}), "gpu-a|1|11|30.0 GiB|slurm job 4711\n"+
		"gpu-a|0|10|20.0 GiB|pod ml/train-0/trainer\n"+
		"gpu-b|0|11|40.0 GiB|slurm job 4711\n"+
		"gpu-b|0|12|20.0 GiB|pod ds/sneaky-0/jupyter\n"+
		"gpu-b|0|13|1.0 GiB|pod ml/serve-0/server"; got != want {
		t.Errorf("by node:\n%s\nwant\n%s", got, want)
	}
}

func TestRenderClusterAt80Columns(t *testing.T) {
	at := time.Date(2026, 12, 1, 3, 0, 5, 0, time.UTC)
	frame := func(v View) []string {
		out := Render(Frame{Screen: Build(Reading{Cluster: threeNodes()}, v), View: v, Time: at, Width: 80, Height: 24, Interactive: true}, Styles{})
		lines := strings.Split(out, "\n")
		for i := range lines {
			lines[i] = strings.TrimRight(lines[i], " ")
		}
		return lines
	}
	lines := frame(View{})
	want := []string{
		"gpu-pod-exporter top  03:00:00  3 nodes (1 stale)  3 GPUs  5 processes",
		"NODE  GPUS BUSY UTIL     MEMORY IDLE UNREQ EXPORTER",
		"gpu-a    2    2  60%    50/160G    1     0 up",
		"gpu-b    1    1  90%     60/80G    0     1 up",
		"gpu-c    -    -    -          -    -     - stale 12s (down)",
		"× node gpu-c: stale: exporter down, last reading 12s ago",
		"! unrequested use: ds/sneaky-0/jupyter on GPU 0 of gpu-b",
		"○ idle allocation: ml/idle-0/nb holds GPU 0:2/0 of gpu-a",
		"NODE  GPU     PID PROCESS   MEMORY   SM OWNER",
		"gpu-a 0        10 python3 20.0 GiB  30% pod ml/train-0/trainer",
	}
	if strings.Join(lines[:len(want)], "\n") != strings.Join(want, "\n") {
		t.Errorf("frame:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if got := lines[23]; got != "sort GPU: mem sm gpu · w group · n by node · / filter · ? help · q quit" {
		t.Errorf("key help: %q", got)
	}

	// n: each node's GPUs under its line.
	lines = frame(View{ByNode: true})
	want = []string{
		"GPU NAME           UTIL         MEMORY            TEMP POWER MODE       ALLOC",
		"gpu-a  2 GPUs · 2 busy · 1 idle allocation · up",
	}
	if lines[1] != want[0] || lines[2] != want[1] || !strings.HasPrefix(lines[3], "  0 A100-SXM4-80GB") ||
		!strings.HasSuffix(lines[3], "MIG ×2     2 pods…") || !strings.HasPrefix(lines[4], "  1 A100-SXM4-80GB") ||
		lines[5] != "gpu-b  1 GPU · 1 busy · 1 unrequested use · up" || !strings.HasSuffix(lines[6], "shared ×2  none !") ||
		lines[7] != "gpu-c  0 GPUs · 0 busy · stale 12s (down)" {
		t.Errorf("by node:\n%s", strings.Join(lines, "\n"))
	}
	if got := lines[23]; got != "sort GPU: mem sm gpu · w group · n nodes only · / filter · ? help · q quit" {
		t.Errorf("key help: %q", got)
	}
}

// A thousand nodes: the node lines take a third of the terminal and say how many more there are; the processes
// keep their room.
func TestRenderManyNodesFits(t *testing.T) {
	c := &Cluster{}
	for i := range 1000 {
		name := fmt.Sprintf("node-%04d", i)
		c.Nodes = append(c.Nodes, Node{Name: name, LastSeen: true})
		for g := range 8 {
			c.GPUs = append(c.GPUs, GPU{Node: name, Index: g, Name: "H100", Mode: "idle"})
			c.Rows = append(c.Rows, clusterRow(name, g, uint32(100+g), 1, 0.1, podID("ml", fmt.Sprintf("p-%d-%d", i, g), "c")))
		}
	}
	for _, v := range []View{{}, {ByNode: true}, {Group: true}} {
		for _, size := range [][2]int{{80, 24}, {132, 43}} {
			out := Render(Frame{Screen: Build(Reading{Cluster: c}, v), View: v, Width: size[0], Height: size[1], Interactive: true}, Styles{})
			lines := strings.Split(out, "\n")
			if len(lines) != size[1] {
				t.Errorf("%+v %v: %d lines", v, size, len(lines))
			}
			for i, l := range lines {
				if ansi.StringWidth(l) > size[0] {
					t.Errorf("%+v %v: line %d is too wide: %q", v, size, i, l)
				}
			}
			s := strings.Join(lines, "\n")
			if !strings.Contains(s, "more lines (/ filters by node)") || !strings.Contains(s, "more rows") {
				t.Errorf("%+v %v: no note of what does not fit:\n%s", v, size, s)
			}
		}
	}
}

// Node names come from Prometheus' labels: each reaches the terminal escaped, and a node's GPUs still find it.
func TestRenderClusterEscapesNodeNames(t *testing.T) {
	c := threeNodes()
	const evil = "gpu-a\x1b]0;pwned\a"
	rename := func(s *string) {
		if *s == "gpu-a" {
			*s = evil
		}
	}
	for i := range c.Nodes {
		rename(&c.Nodes[i].Name)
	}
	for i := range c.GPUs {
		rename(&c.GPUs[i].Node)
	}
	for i := range c.Signals {
		rename(&c.Signals[i].Node)
	}
	for i := range c.Rows {
		rename(&c.Rows[i].Node)
	}
	for _, v := range []View{{}, {ByNode: true}, {Group: true}} {
		out := Render(Frame{Screen: Build(Reading{Cluster: c}, v), View: v, Width: 100, Height: 30, Interactive: true}, colored(t))
		if strings.Contains(out, "\x1b]0;") || strings.Contains(out, "\a") {
			t.Errorf("%+v: a node name's escape reached the terminal:\n%q", v, out)
		}
		if v.ByNode && !strings.Contains(ansi.Strip(out), "gpu-a\\x1b]0;pwned\\a  2 GPUs") {
			t.Errorf("by node: no escaped node line with its GPUs:\n%s", ansi.Strip(out))
		}
	}
}
