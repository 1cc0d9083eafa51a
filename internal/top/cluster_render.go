package top

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// nodeSection is a cluster screen's upper part: a line per node, or with ByNode each node's line followed by its
// GPUs' lines. A node with a GPU that has a health problem is marked as the GPU is.
func nodeSection(f Frame, w int, st Styles) []string {
	s := f.Screen
	var lines []string
	if f.Options.ByNode {
		lines = append(lines, st.Header.Render(pad(gpuHeader(s, w, f.Interactive), f)))
		gpus := make(map[string][]view.GPU)
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
		lines = append(lines, st.Header.Render(pad(cols.line("  NODE", "GPUS", "BUSY", "UTIL", "MEMORY", "IDLE", "UNREQ", "EXPORTER"), f)))
		for _, n := range s.Nodes {
			lines = append(lines, nodeLine(n, cols, st))
		}
	}
	if len(s.Nodes) == 0 {
		lines = append(lines, st.Dim.Render("no node matches the filter"))
	}
	return lines
}

type nodeCols struct{ name, exporter int }

// nodeColumns sizes the node table: the name gets up to 24 columns, the exporter's state what is left.
func nodeColumns(s Screen, w int) nodeCols {
	const fixed = 4 + 1 + 4 + 1 + 4 + 1 + 10 + 1 + 4 + 1 + 5 + 1 // GPUS BUSY UTIL MEMORY IDLE UNREQ, with spaces
	c := nodeCols{name: 6}
	for _, n := range s.Nodes {
		c.name = max(c.name, min(ansi.StringWidth(n.Name)+2, 26))
	}
	c.name = min(c.name, max(w-fixed-1-12, 8))
	c.exporter = max(w-fixed-c.name-1, 8)
	return c
}

func (c nodeCols) line(name, gpus, busy, util, mem, idle, unreq, exporter string) string {
	return strings.Join([]string{fit(name, c.name, false), fit(gpus, 4, true), fit(busy, 4, true), fit(util, 4, true),
		fit(mem, 10, true), fit(idle, 4, true), fit(unreq, 5, true), ansi.Truncate(exporter, c.exporter, "…")}, " ")
}

// nodeLine is one node: marked ✗ when a GPU of it has a health problem, its GPUs, how many are in use, their mean
// utilization and memory, its idle allocations and unrequested uses ("-" where its allocations are not known),
// and its exporter's state.
func nodeLine(n view.Node, c nodeCols, st Styles) string {
	gpus, busy := "-", "-"
	if n.GPUs > 0 {
		gpus, busy = fmt.Sprint(n.GPUs), fmt.Sprint(n.Busy)
	}
	idle, unreq := "-", "-"
	if n.AllocationsKnown && n.GPUs > 0 {
		idle, unreq = fmt.Sprint(n.IdleAllocations), fmt.Sprint(n.Unrequested)
	}
	mark := "  "
	if n.Unhealthy > 0 {
		mark = healthMark + " "
	}
	exporter := n.StateText()
	if n.Unhealthy > 0 && n.State == view.NodeUp {
		exporter += " · " + view.Plural(n.Unhealthy, "GPU") + " " + healthMark
	}
	line := c.line(mark+n.Name, gpus, busy, view.Percent(n.Utilization), view.MemoryPair(n.MemoryUsed, n.MemoryTotal),
		idle, unreq, exporter)
	return nodeStyle(n, st, st.Dim.UnsetFaint()).Render(line)
}

// nodeStyle colours a node by its worst: a stale node, one that cannot read its GPUs, a GPU with a health problem
// or an unrequested use alerts; idle allocations warn.
func nodeStyle(n view.Node, st Styles, normal interface{ Render(...string) string }) interface{ Render(...string) string } {
	switch {
	case n.State != view.NodeUp || n.Unrequested > 0 || n.Unhealthy > 0:
		return st.Alert
	case n.IdleAllocations > 0:
		return st.Warn
	}
	return normal
}

// nodeSummary is a node's line above its GPUs: "gpu-a  2 GPUs · 1 busy · 1 idle allocation · up".
func nodeSummary(n view.Node) string {
	parts := []string{view.Plural(n.GPUs, "GPU"), fmt.Sprintf("%d busy", n.Busy)}
	if n.Unhealthy > 0 {
		parts = append(parts, fmt.Sprintf("%d %s", n.Unhealthy, healthMark))
	}
	if n.AllocationsKnown {
		if n.Unrequested > 0 {
			parts = append(parts, view.Plural(n.Unrequested, "unrequested use"))
		}
		if n.IdleAllocations > 0 {
			parts = append(parts, view.Plural(n.IdleAllocations, "idle allocation"))
		}
	}
	parts = append(parts, n.StateText())
	return n.Name + "  " + strings.Join(parts, " · ")
}
