package top

import (
	"fmt"
	"strings"
)

// healthMark is the mark of a GPU with a health problem, in its line and on the health line.
const healthMark = "✗"

// indexCell is a GPU line's first cell: its index, marked when the GPU has a health problem.
func indexCell(g GPU, st Styles) string {
	if len(g.Health) == 0 {
		return fit(fmt.Sprint(g.Index), 3, true)
	}
	return st.Alert.Render(healthMark + fit(fmt.Sprint(g.Index), 2, true))
}

// healthLine names the problems of every GPU that has one, on one line so that the process rows keep their room;
// empty when all are healthy. `ps` prints a line per GPU.
func healthLine(gpus []GPU) string {
	var parts []string
	for _, g := range gpus {
		if len(g.Health) > 0 {
			parts = append(parts, fmt.Sprintf("GPU %d: %s", g.Index, strings.Join(g.Health, ", ")))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return healthMark + " " + strings.Join(parts, " · ")
}
