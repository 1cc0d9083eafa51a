package top

import (
	"fmt"
	"math"
	"strings"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// A GPU's line: its bars, or once there is history its sparklines, and its marks.

// gpuWidths shares the width of a GPU line between the name and the two bars; the other columns are fixed.
func gpuWidths(s Screen, w int, bars bool) (name, bar int) {
	fixed := 3 + 1 + 4 + 1 + 9 + 1 + 4 + 1 + 5 + 1 + 10 // index, util %, memory, temperature, power, mode, with spaces
	if s.AllocationsKnown {
		fixed += 1 + 7
	}
	longest := 4
	for _, g := range s.GPUs {
		longest = max(longest, ansi.StringWidth(g.Name))
	}
	rest := w - fixed - 1
	if bars && rest-2 < 8+2*5 {
		bars = false // too narrow for bars worth reading: numbers only
	}
	if !bars {
		return min(longest, max(rest, 8)), 0
	}
	rest -= 2 // the spaces after the bars
	name = min(longest, 24, max(rest/2, 8))
	bar = min(max((rest-name)/2, 3), view.HistoryPoints)
	return name, bar
}

func gpuHeader(s Screen, w int, bars bool) string {
	name, bar := gpuWidths(s, w, bars)
	bars = bar > 0
	b := []string{fit("GPU", 3, true), fit("NAME", name, false)}
	if bars {
		b = append(b, fit("UTIL", bar+1+4, false), fit("MEMORY", bar+1+9, false))
	} else {
		b = append(b, fit("UTIL", 4, true), fit("MEMORY", 9, true))
	}
	b = append(b, fit("TEMP", 4, true), fit("POWER", 5, true), fit("MODE", 10, false))
	if s.AllocationsKnown {
		b = append(b, fit("ALLOC", 7, false))
	}
	return strings.Join(b, " ")
}

func gpuLine(g view.GPU, s Screen, w int, bars bool, st Styles) string {
	name, bar := gpuWidths(s, w, bars)
	bars = bar > 0
	b := []string{indexCell(g, st), fit(g.Name, name, false)}
	ratio := gpu.Value{}
	if g.MemoryUsed.Valid && g.MemoryTotal.Valid && g.MemoryTotal.V > 0 {
		ratio = gpu.Known(g.MemoryUsed.V / g.MemoryTotal.V)
	}
	mem := view.MemoryPair(g.MemoryUsed, g.MemoryTotal)
	if bars {
		var util, memory []float64
		if s.History != nil {
			if h := s.History.GPUs[view.GPUKey(g.Node, g.UUID)]; h != nil {
				util, memory = h.Utilization, h.Memory
			}
		}
		b = append(b, meter(g.Utilization, util, bar, st)+" "+fit(view.Percent(g.Utilization), 4, true),
			meter(ratio, memory, bar, st)+" "+fit(mem, 9, true))
	} else {
		b = append(b, fit(view.Percent(g.Utilization), 4, true), fit(mem, 9, true))
	}
	temp, power := "-", "-"
	if g.Temperature.Valid {
		temp = fmt.Sprintf("%.0f°C", g.Temperature.V)
	}
	if g.Power.Valid {
		power = fmt.Sprintf("%.0fW", g.Power.V)
	}
	b = append(b, fit(temp, 4, true), fit(power, 5, true), fit(g.Mode(), 10, false))
	if s.AllocationsKnown {
		b = append(b, allocCell(g, st))
	}
	return strings.Join(b, " ")
}

// indexCell is a GPU line's first cell: its index, marked when the GPU has a health problem.
func indexCell(g view.GPU, st Styles) string {
	if len(g.Health) == 0 {
		return fit(fmt.Sprint(g.Index), 3, true)
	}
	return st.Alert.Render(healthMark + fit(fmt.Sprint(g.Index), 2, true))
}

// allocCell says how many pods hold the GPU, marked "!" when a pod uses it without an allocation and "○" when a
// pod holds it idle; the signal lines name them.
func allocCell(g view.GPU, st Styles) string {
	if g.AllocationsUnknown {
		return fit("-", 7, false)
	}
	text := "none"
	switch {
	case g.AllocatedPods == 1:
		text = "1 pod"
	case g.AllocatedPods > 1:
		text = fmt.Sprintf("%d pods", g.AllocatedPods)
	}
	switch {
	case g.Unrequested > 0:
		return st.Alert.Render(fit(text+" !", 7, false))
	case g.IdlePods > 0:
		return st.Warn.Render(fit(text+" ○", 7, false))
	}
	return fit(text, 7, false)
}

// meter is a bar of width cells, coloured by how full it is; with a history of at least two points, the history
// instead, as a sparkline over the last minutes whose last cell is now.
func meter(v gpu.Value, history []float64, width int, st Styles) string {
	if spark, ok := sparkline(history, width, 1); ok {
		return styleOf(v, st).Render(spark)
	}
	if !v.Valid {
		return strings.Repeat(" ", width)
	}
	r := min(max(v.V, 0), 1)
	full := int(r*float64(width) + 0.5)
	return styleOf(v, st).Render(strings.Repeat("█", full)) + st.Dim.Render(strings.Repeat("░", width-full))
}

func styleOf(v gpu.Value, st Styles) lipgloss.Style {
	switch {
	case v.Valid && v.V >= 0.9:
		return st.High
	case v.Valid && v.V >= 0.6:
		return st.Mid
	}
	return st.Low
}

// sparkLevels draw a sparkline, from empty to full.
var sparkLevels = []rune("▁▂▃▄▅▆▇█")

// sparkline draws a history of ratios (scaled by scale: a sum over 8 GPUs has 8) in width cells, each the mean of
// its share of the points, the last cell the latest; a cell with no point is blank. ok is false while fewer than
// half the cells (and two) have a point: there is not history enough to draw yet.
func sparkline(points []float64, width int, scale float64) (string, bool) {
	if width <= 0 || scale <= 0 {
		return "", false
	}
	cells := make([]rune, width)
	drawn := 0
	n := len(points)
	for c := range width {
		// The points of cell c: the last cell ends with the last point.
		lo, hi := n-(width-c)*n/width, n-(width-c-1)*n/width
		if width > n {
			lo, hi = n-(width-c), n-(width-c)+1
		}
		sum, k := 0.0, 0
		for i := max(lo, 0); i < hi && i < n; i++ {
			if i >= 0 && !math.IsNaN(points[i]) {
				sum += points[i]
				k++
			}
		}
		if k == 0 {
			cells[c] = ' '
			continue
		}
		r := min(max(sum/float64(k)/scale, 0), 1)
		cells[c] = sparkLevels[int(math.Round(r*float64(len(sparkLevels)-1)))]
		drawn++
	}
	return string(cells), drawn >= max(2, (width+1)/2)
}
