package top

import (
	"fmt"
	"slices"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// The process table: its columns, which give way to the owner, the owner cut where it matters least, and the
// rows a screen shows around the cursor.

// columns are the process table's widths; a column of width 0 is not shown.
type columns struct{ node, gpu, pid, user, process, sm, age, history, owner int }

// processColumns sizes the process table: the owner gets what the other columns leave. A cluster's table starts
// with the node; USER shows when users are looked up, AGE when start times are known, HISTORY (a workload's SM
// over the last minutes) when grouped on a wide terminal.
func processColumns(s Screen, w int, grouped bool) columns {
	c := columns{gpu: 3, pid: 7, process: 7, sm: 4}
	if grouped {
		c.pid, c.sm = 8, 5
	}
	if s.Cluster {
		c.node = 4
	}
	for _, r := range s.Rows {
		c.gpu = max(c.gpu, min(ansi.StringWidth(r.GPU), maxGPUColumn))
		c.process = max(c.process, min(ansi.StringWidth(r.Process), 24))
		if s.Cluster {
			c.node = max(c.node, min(ansi.StringWidth(r.Node), 16))
		}
		if r.User != "" {
			c.user = max(c.user, 4, min(ansi.StringWidth(r.User), 12))
		}
		if r.Age != "" && r.Age != "-" {
			c.age = 6
		}
		if r.History != nil && w >= 100 {
			c.history = 12
		}
	}
	fixed := func() int {
		n := c.gpu + 1 + c.pid + 1 + 8 + 1 + c.sm + 1
		for _, optional := range []int{c.node, c.user, c.age, c.history} {
			if optional > 0 {
				n += optional + 1
			}
		}
		return n
	}
	// Narrow: the owner keeps 24 columns at least, for which the history, the age, then the user give way.
	for _, drop := range []*int{&c.history, &c.age, &c.user} {
		if w-fixed()-7-1 >= minOwner {
			break
		}
		*drop = 0
	}
	c.process = min(c.process, max((w-fixed())/4, 7))
	c.owner = max(w-fixed()-c.process-1, 10)
	return c
}

// minOwner is the least room the owner gets while other columns can give way.
const minOwner = 24

func (c columns) header(grouped bool) string {
	sm, pid := "SM", "PID"
	if grouped {
		sm, pid = "ΣSM", "PROCS"
	}
	return c.line("NODE", "GPU", pid, "USER", "PROCESS", "MEMORY", sm, "AGE", "HISTORY", "OWNER")
}

func (c columns) row(r Row, st Styles) string {
	history := ""
	if c.history > 0 {
		history, _ = sparkline(r.History, c.history, max(r.HistoryScale, 1))
	}
	return c.line(r.Node, r.GPU, r.PID, dash(r.User), dash(r.Process), r.Memory, r.SM, dash(r.Age), history,
		fitOwner(r.Owner, c.owner))
}

func (c columns) line(node, gpuCol, pid, user, process, mem, sm, age, history, owner string) string {
	var cells []string
	if c.node > 0 {
		cells = append(cells, fit(node, c.node, false))
	}
	cells = append(cells, fit(gpuCol, c.gpu, false), fit(pid, c.pid, true))
	if c.user > 0 {
		cells = append(cells, fit(user, c.user, false))
	}
	cells = append(cells, fit(process, c.process, false), fit(mem, 8, true), fit(sm, c.sm, true))
	if c.age > 0 {
		cells = append(cells, fit(age, c.age, true))
	}
	if c.history > 0 {
		cells = append(cells, fit(history, c.history, false))
	}
	return strings.Join(append(cells, owner), " ")
}

// fitOwner writes an owner in width columns, cutting what matters least first: a pod's namespace, then its
// container, each to a letter and "…", then the kind's word ("pod "), and the pod's name last. One name (a
// container, a job, a service) loses its kind's word, then its end.
func fitOwner(o view.Owner, width int) string {
	full := o.String()
	if ansi.StringWidth(full) <= width {
		return full
	}
	names := slices.Clone(o.Names)
	prefix := o.Kind + " "
	text := func() string { return prefix + strings.Join(names, "/") }
	shrink := func(i int) {
		if over := ansi.StringWidth(text()) - width; over > 0 && i < len(names) {
			if keep := max(ansi.StringWidth(names[i])-over, 2); keep < ansi.StringWidth(names[i]) {
				names[i] = ansi.Truncate(names[i], keep, "…")
			}
		}
	}
	if o.Kind == view.KindPod && len(names) > 0 {
		shrink(0) // the namespace
		if len(names) == 3 {
			shrink(2) // the container
		}
	}
	if ansi.StringWidth(text()) > width && len(names) > 0 {
		prefix = "" // the names say more than the kind's word
	}
	shrink(len(names) - 1 - boolInt(o.Kind == view.KindPod && len(names) == 3))
	return ansi.Truncate(text(), width, "…")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// firstRow is the first process row to show in room lines: the scroll kept within the rows so that the last page
// is full, and moved so that the cursor is on the screen.
func firstRow(f Frame, room int) int {
	rows := len(f.Screen.Rows)
	if rows <= room {
		return 0
	}
	last := rows - room // room < 3: the rows alone, without the lines that say what is cut
	if room >= 3 {
		last = rows - (room - 1) // the last page: a line says what is above, none what is below
	}
	first := min(max(f.Scroll, 0), last)
	if f.Cursor < 0 {
		return first
	}
	cursor := min(f.Cursor, rows-1)
	if cursor < first {
		first = cursor
	}
	for first < last {
		from, n := visible(first, room, rows)
		if cursor < from+n {
			break
		}
		first++
	}
	return first
}

// visible are the rows shown from first in room lines: the first of them and how many. A view scrolled down says
// how many rows are above, one that does not reach the end how many are below; each takes a line of the room, when
// there are three or more.
func visible(first, room, rows int) (from, n int) {
	n = room
	if room < 3 {
		return first, min(n, rows-first)
	}
	if first > 0 {
		n--
	}
	if first+n < rows {
		n--
	}
	return first, min(n, rows-first)
}

// tableLines are the table's header and its rows from first, in room lines.
func tableLines(f Frame, cols columns, header string, first, room int, st Styles) []string {
	s := f.Screen
	lines := []string{header}
	if len(s.Rows) == 0 {
		if f.Options.Filter != "" || !f.Options.Base.Empty() {
			lines = append(lines, st.Dim.Render("no process matches the filter"))
		} else {
			lines = append(lines, st.Dim.Render("no GPU processes"))
		}
		return lines
	}
	from, n := visible(first, room, len(s.Rows))
	if room >= 3 && from > 0 {
		lines = append(lines, st.Dim.Render(fmt.Sprintf("… %d rows above", from)))
	}
	for i := from; i < from+n; i++ {
		line := cols.row(s.Rows[i], st)
		if f.Interactive && i == f.Cursor {
			line = st.Cursor.Render(fit(ansi.Strip(line), width(f), false))
		}
		lines = append(lines, line)
	}
	if room >= 3 && from+n < len(s.Rows) {
		lines = append(lines, st.Dim.Render(fmt.Sprintf("… %d more rows", len(s.Rows)-from-n)))
	}
	return lines
}

// RowsShown are, for a frame, the first row shown and how many rows one screen shows, for the cursor's keys.
func RowsShown(f Frame) (first, page int) {
	f = escaped(f)
	l := layout(f, Styles{})
	from, n := visible(l.first, l.room, len(f.Screen.Rows))
	return from, max(n, 1)
}
