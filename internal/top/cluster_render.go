package top

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
)

// clusterTitle is a cluster screen's first line: when it was read, and how many nodes, GPUs and processes.
func clusterTitle(f Frame) string {
	s := f.Screen
	at := f.Time
	if !s.Time.IsZero() {
		at = s.Time
	}
	stale := 0
	for _, n := range s.Nodes {
		if n.Stale() {
			stale++
		}
	}
	nodes := ps.Plural(len(s.Nodes), "node")
	if stale > 0 {
		nodes += fmt.Sprintf(" (%d stale)", stale)
	}
	return fmt.Sprintf("gpu-pod-exporter top  %s  %s  %s  %s", at.Format("15:04:05"), nodes, ps.Plural(len(s.GPUs), "GPU"),
		ps.Plural(s.Processes, "process"))
}

// nodeSection is a cluster screen's upper part: a line per node, or with ByNode each node's line followed by its
// GPUs' lines. On a terminal it takes at most a third of the height, so that the processes keep their room.
func nodeSection(f Frame, w int, st Styles) []string {
	s := f.Screen
	var lines []string
	if f.View.ByNode {
		lines = append(lines, st.Header.Render(pad(gpuHeader(s, w, f.Interactive), f)))
		gpus := make(map[string][]GPU)
		for _, g := range s.GPUs {
			gpus[g.Node] = append(gpus[g.Node], g)
		}
		for _, n := range s.Nodes {
			lines = append(lines, nodeStyle(n, st, st.Title).Render(ansi.Truncate(nodeSummary(n), w, "…")))
			for _, g := range gpus[n.Name] {
				lines = append(lines, gpuLine(g, s, w, f.Interactive, st))
			}
		}
	} else {
		cols := nodeColumns(s, w)
		lines = append(lines, st.Header.Render(pad(cols.line("NODE", "GPUS", "BUSY", "UTIL", "MEMORY", "IDLE", "UNREQ", "EXPORTER"), f)))
		for _, n := range s.Nodes {
			lines = append(lines, nodeLine(n, cols, st))
		}
	}
	if len(s.Nodes) == 0 {
		lines = append(lines, st.Dim.Render("no node matches the filter"))
	}
	if f.Height > 0 {
		room := max(f.Height/3, 4)
		if len(lines) > room {
			more := len(lines) - room + 1
			lines = append(lines[:room-1], st.Dim.Render(fmt.Sprintf("… %d more lines (/ filters by node)", more)))
		}
	}
	return lines
}

type nodeCols struct{ name, exporter int }

// nodeColumns sizes the node table: the name gets up to 24 columns, the exporter's state what is left.
func nodeColumns(s Screen, w int) nodeCols {
	const fixed = 4 + 1 + 4 + 1 + 4 + 1 + 10 + 1 + 4 + 1 + 5 + 1 // GPUS BUSY UTIL MEMORY IDLE UNREQ, with spaces
	c := nodeCols{name: 4}
	for _, n := range s.Nodes {
		c.name = max(c.name, min(ansi.StringWidth(n.Name), 24))
	}
	c.name = min(c.name, max(w-fixed-1-12, 8))
	c.exporter = max(w-fixed-c.name-1, 8)
	return c
}

func (c nodeCols) line(name, gpus, busy, util, mem, idle, unreq, exporter string) string {
	return strings.Join([]string{fit(name, c.name, false), fit(gpus, 4, true), fit(busy, 4, true), fit(util, 4, true),
		fit(mem, 10, true), fit(idle, 4, true), fit(unreq, 5, true), ansi.Truncate(exporter, c.exporter, "…")}, " ")
}

// nodeLine is one node: its GPUs, how many are in use, their mean utilization and memory, its idle allocations
// and unrequested uses ("-" where its allocations are not known), and its exporter's state.
func nodeLine(n Node, c nodeCols, st Styles) string {
	gpus, busy, mem := "-", "-", "-"
	if n.GPUs > 0 {
		gpus, busy = fmt.Sprint(n.GPUs), fmt.Sprint(n.Busy)
	}
	if n.MemoryUsed.Valid && n.MemoryTotal.Valid {
		mem = fmt.Sprintf("%.0f/%.0fG", n.MemoryUsed.V/(1<<30), n.MemoryTotal.V/(1<<30))
	}
	idle, unreq := "-", "-"
	if n.AllocationsKnown && n.GPUs > 0 {
		idle, unreq = fmt.Sprint(n.IdleAllocations), fmt.Sprint(n.Unrequested)
	}
	line := c.line(n.Name, gpus, busy, ps.Percent(n.Utilization), mem, idle, unreq, n.stateCell())
	return nodeStyle(n, st, st.Dim.UnsetFaint()).Render(line)
}

// nodeStyle colours a node by its worst: a stale node or one that cannot read its GPUs alerts, unrequested use
// alerts, idle allocations warn.
func nodeStyle(n Node, st Styles, normal interface{ Render(...string) string }) interface{ Render(...string) string } {
	switch {
	case n.State != NodeUp || n.Unrequested > 0:
		return st.Alert
	case n.IdleAllocations > 0:
		return st.Warn
	}
	return normal
}

// nodeSummary is a node's line above its GPUs: "gpu-a  2 GPUs · 1 busy · 1 idle allocation · up".
func nodeSummary(n Node) string {
	parts := []string{ps.Plural(n.GPUs, "GPU"), fmt.Sprintf("%d busy", n.Busy)}
	if n.AllocationsKnown {
		if n.Unrequested > 0 {
			parts = append(parts, ps.Plural(n.Unrequested, "unrequested use"))
		}
		if n.IdleAllocations > 0 {
			parts = append(parts, ps.Plural(n.IdleAllocations, "idle allocation"))
		}
	}
	parts = append(parts, n.stateCell())
	return n.Name + "  " + strings.Join(parts, " · ")
}
