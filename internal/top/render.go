package top

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// Frame is everything one drawing shows.
type Frame struct {
	Screen  Screen
	Options Options
	// Time is when the frame is drawn; a reading without a time of its own is shown as of then.
	Time time.Time
	// Err is why the last reading failed; the screen then shows the reading before it.
	Err string
	// Width is the terminal's width in columns. Height is its height in lines, 0 for no limit (plain output).
	Width, Height int
	// Interactive adds the bars, the cursor, the key help and the filter being typed.
	Interactive bool
	// Editing is true while the filter is typed; Options.Filter is then the text so far.
	Editing bool
	// Cursor is the selected row, -1 for none; Scroll is the first row shown when they do not all fit. Render keeps
	// both within the rows.
	Cursor, Scroll int
	// Help shows the keys, Notes every signal and warning, Detail the selected row's process, instead of the
	// reading.
	Help, Notes bool
	Detail      *Detail
}

// Styles colour a frame. The zero value draws plain text.
type Styles struct {
	Title, Header, Dim, Alert, Warn, Key, Cursor lipgloss.Style
	Low, Mid, High                               lipgloss.Style // bars by how full they are
}

// Colors are the styles of the terminal program; lipgloss leaves out what the terminal cannot show.
func Colors() Styles {
	return Styles{
		Title:  lipgloss.NewStyle().Bold(true),
		Header: lipgloss.NewStyle().Bold(true).Reverse(true),
		Dim:    lipgloss.NewStyle().Faint(true),
		Alert:  lipgloss.NewStyle().Foreground(lipgloss.Color("9")).Bold(true),
		Warn:   lipgloss.NewStyle().Foreground(lipgloss.Color("11")),
		Key:    lipgloss.NewStyle().Bold(true),
		Cursor: lipgloss.NewStyle().Reverse(true),
		Low:    lipgloss.NewStyle().Foreground(lipgloss.Color("10")),
		Mid:    lipgloss.NewStyle().Foreground(lipgloss.Color("11")),
		High:   lipgloss.NewStyle().Foreground(lipgloss.Color("9")),
	}
}

const (
	minWidth   = 40
	maxSignals = 4 // lines of signals on a terminal, the last one saying how many more
	unlimited  = 1 << 20
	// healthMark marks a GPU or node with a health problem, in its line and on the health line.
	healthMark = "✗"
)

// Render draws a frame as lines no wider than f.Width and, when f.Height is set, no more than f.Height of them:
// the title, the GPUs (or nodes), the signals and the warnings, the process table's header and at least one row,
// and the key help, each part cut to what the height leaves it. Without a width (plain output) nothing is cut.
// Every text of the reading is escaped for the terminal first, so that widths and cuts count what the terminal
// shows.
func Render(f Frame, st Styles) string {
	f = escaped(f)
	switch {
	case f.Help:
		return finish(f, help(f, st), st)
	case f.Notes:
		return finish(f, notes(f, st), st)
	case f.Detail != nil:
		return finish(f, detailLines(f, st), st)
	}
	l := layout(f, st)
	lines := append(l.upper, l.table...)
	return finish(f, lines, st)
}

// laidOut is a frame's parts, cut to the height: the upper part, and the process table with its header.
type laidOut struct {
	upper, table []string
	// first is the first row shown, room the lines the rows have.
	first, room int
}

// layout shares the height between the parts: the title and the table's header, the key help and one row always
// show; the GPU (or node) lines, the signals and the warnings get what they need of the rest, in that order, each
// cut to what is left with a line that says what was cut, and the rows get the rest.
func layout(f Frame, st Styles) laidOut {
	w := width(f)
	s := f.Screen
	title := []string{st.Title.Render(ansi.Truncate(titleLine(f), w, "…"))}
	if f.Err != "" {
		// In full, over as many lines as it takes: the end of an error is often what to do about it.
		for _, l := range strings.Split(ansi.Wrap("reading failed: "+f.Err, w, " "), "\n") {
			title = append(title, st.Alert.Render(l))
		}
	}
	var devices []string
	if s.Cluster {
		devices = nodeSection(f, w, st)
	} else {
		devices = append(devices, st.Header.Render(pad(gpuHeader(s, w, f.Interactive), f)))
		for _, g := range s.GPUs {
			devices = append(devices, gpuLine(g, s, w, f.Interactive, st))
		}
	}
	signals := signalLines(f, w, st)
	warnings := warningLines(f, w, st)
	cols := processColumns(s, w, f.Options.Group)
	header := st.Header.Render(pad(cols.header(s.Grouped), f))

	rows := len(s.Rows)
	if f.Height <= 0 {
		l := laidOut{upper: slices.Concat(title, devices, signals, warnings), first: 0, room: rows}
		l.table = tableLines(f, cols, header, 0, rows, st)
		return l
	}
	// The lines every frame has: the title (and error), the table's header, the key help, and a row.
	left := f.Height - len(title) - 1 - 1
	minRows := max(1, min(rows, (f.Height-10)/2))
	left -= minRows
	devicesRoom := max(min(len(devices), left-min(len(signals), 2)-min(len(warnings), 1)), min(len(devices), 2))
	if s.Cluster {
		devicesRoom = min(devicesRoom, max(f.Height/3, 4))
	}
	devices = cut(devices, devicesRoom, func(n int) string {
		if s.Cluster {
			return st.Dim.Render(fmt.Sprintf("… %d more lines (/ filters by node)", n))
		}
		return st.Dim.Render(fmt.Sprintf("… %d more GPUs", n))
	})
	left -= len(devices)
	signals = cut(signals, max(min(max(left-min(len(warnings), 1), 0), maxSignals), min(len(signals), 2)), func(n int) string {
		return st.Dim.Render(fmt.Sprintf("… %d more signals (e shows them)", n))
	})
	left -= len(signals)
	warnings = cut(warnings, max(left, 0), nil)
	left -= len(warnings)
	l := laidOut{upper: slices.Concat(title, devices, signals, warnings)}
	l.room = minRows + max(left, 0)
	l.first = firstRow(f, l.room)
	l.table = tableLines(f, cols, header, l.first, l.room, st)
	return l
}

// cut keeps at most n lines, the last of them saying how many were left out (more(k)); nil more cuts silently.
func cut(lines []string, n int, more func(int) string) []string {
	if len(lines) <= n {
		return lines
	}
	if n <= 0 {
		return nil
	}
	if more == nil {
		return lines[:n]
	}
	return append(slices.Clip(lines[:n-1]), more(len(lines)-n+1))
}

// width is the columns a frame may use: the terminal's, or without one, no limit.
func width(f Frame) int {
	if f.Width <= 0 {
		return unlimited
	}
	return max(f.Width, minWidth)
}

// titleLine is the frame's first line: when it was read, and how many GPUs and processes (and nodes), and what
// was deduplicated or left out.
func titleLine(f Frame) string {
	s := f.Screen
	at := f.Time
	if !s.Time.IsZero() {
		at = s.Time
	}
	parts := []string{"gpu-pod-exporter top", at.Format("15:04:05")}
	if s.Cluster {
		stale := 0
		for _, n := range s.Nodes {
			if n.Stale() {
				stale++
			}
		}
		nodes := view.Plural(len(s.Nodes), "node")
		if stale > 0 {
			nodes += fmt.Sprintf(" (%d stale)", stale)
		}
		parts = append(parts, nodes)
	}
	parts = append(parts, view.Plural(len(s.GPUs), "GPU"), view.Plural(s.Total, "process"))
	if s.Duplicates > 0 {
		parts = append(parts, fmt.Sprintf("(%s scraped twice, shown once)", view.Plural(s.Duplicates, "series")))
	}
	if s.Dropped > 0 {
		parts = append(parts, fmt.Sprintf("(%s unknown)", view.Plural(s.Dropped, "value")))
	}
	title := strings.Join(parts, "  ")
	if s.Simulated {
		title += "  (simulated)"
	}
	return title
}

// signalLines are the signals, the most severe first, one a line; the GPUs' health problems share one line, so
// that the rows keep their room, where the first of them falls.
func signalLines(f Frame, w int, st Styles) []string {
	var lines []string
	var health []string
	healthAt := -1
	for _, sig := range f.Screen.Signals {
		if sig.Kind == view.GPUHealth {
			if healthAt < 0 {
				healthAt = len(lines)
				lines = append(lines, "")
			}
			health = append(health, sig.String())
			continue
		}
		mark, style := "!", st.Alert
		switch sig.Kind {
		case view.IdleAllocation:
			mark, style = "○", st.Warn
		case view.NodeProblem:
			mark = "×"
		}
		lines = append(lines, style.Render(ansi.Truncate(mark+" "+sig.String(), w, "…")))
	}
	if healthAt >= 0 {
		lines[healthAt] = st.Alert.Render(ansi.Truncate(healthMark+" "+strings.Join(health, " · "), w, "…"))
	}
	return lines
}

// warningLines are what could not be read: one line for one, and for more, one line that counts them and shows
// the first (on a terminal; e shows them all). Plain output has them all.
func warningLines(f Frame, w int, st Styles) []string {
	ws := f.Screen.Warnings
	if len(ws) == 0 {
		return nil
	}
	if len(ws) == 1 || !f.Interactive {
		var lines []string
		for _, warning := range ws {
			lines = append(lines, st.Warn.Render(ansi.Truncate("warning: "+warning, w, "…")))
		}
		return lines
	}
	return []string{st.Warn.Render(ansi.Truncate(fmt.Sprintf("%d warnings (e shows them): %s", len(ws), ws[0]), w, "…"))}
}

// finish adds the key help (or the filter being typed) at the bottom of a terminal's frame, and cuts or trims each
// line.
func finish(f Frame, lines []string, st Styles) string {
	w := width(f)
	if f.Interactive {
		if f.Height > 0 {
			if len(lines) > f.Height-1 {
				lines = lines[:max(f.Height-1, 0)]
			}
			for len(lines) < f.Height-1 {
				lines = append(lines, "")
			}
		}
		lines = append(lines, footerLine(f, st))
	}
	for i, l := range lines {
		if f.Interactive {
			lines[i] = ansi.Truncate(l, w, "") // a last guard: a terminal wraps what is wider and the screen scrolls
		} else {
			lines[i] = strings.TrimRight(l, " ")
		}
	}
	return strings.Join(lines, "\n")
}

// keyHelp lists top's keys, as ? shows them.
var keyHelp = [][2]string{
	{"m  s  g  a", "sort by memory, SM utilization, GPU or age"},
	{"w", "group by workload (a cluster: then by namespace)"},
	{"n", "a cluster: each node's GPUs under its line"},
	{"/", "filter: any text of a row; user: gpu: ns: node: pid: owner: for one field"},
	{"  Enter  Esc", "keep the filter; clear it"},
	{"↑ ↓  k j", "move the cursor a row"},
	{"PgUp PgDn  Home End", "a page, to the top, to the bottom"},
	{"Enter", "the process under the cursor: who owns it, its host CPU and memory"},
	{"e", "every signal and warning"},
	{"? h", "this help; any key goes back"},
	{"q  Ctrl-C", "quit"},
}

// help is the key help, in place of the reading.
func help(f Frame, st Styles) []string {
	lines := []string{st.Title.Render("gpu-pod-exporter top: keys"), ""}
	for _, k := range keyHelp {
		lines = append(lines, fmt.Sprintf("  %s  %s", st.Key.Render(fit(k[0], 19, false)), k[1]))
	}
	return append(lines, "",
		st.Dim.Render("USER: the process's owner, with --collector.process-user (on with --demo)."),
		st.Dim.Render("AGE: how long the process has run."),
		st.Dim.Render("ΣSM (w): SM utilization summed over the workload's processes and GPUs: 100% is one"),
		st.Dim.Render("  whole GPU busy, so 760% is 7.6 GPUs' worth. MEMORY is summed the same way."),
		st.Dim.Render("Bars become the last 5 minutes once there is history; the number is now."))
}

// notes lists every signal and warning in full, in place of the reading.
func notes(f Frame, st Styles) []string {
	w := width(f)
	lines := []string{st.Title.Render("gpu-pod-exporter top: signals and warnings"), ""}
	wrap := func(s string, style lipgloss.Style) {
		for _, l := range strings.Split(ansi.Wrap(s, w, " "), "\n") {
			lines = append(lines, style.Render(l))
		}
	}
	for _, sig := range f.Screen.Signals {
		mark, style := "!", st.Alert
		switch sig.Kind {
		case view.GPUHealth:
			mark = healthMark
		case view.IdleAllocation:
			mark, style = "○", st.Warn
		case view.NodeProblem:
			mark = "×"
		}
		wrap(mark+" "+sig.String(), style)
	}
	for _, warning := range f.Screen.Warnings {
		wrap("warning: "+warning, st.Warn)
	}
	if len(lines) == 2 {
		lines = append(lines, "nothing: no signal, no warning")
	}
	return append(lines, "", st.Dim.Render("any key goes back"))
}

// escaped returns the frame with every text that comes from the node, or from the person's typing, escaped for
// the terminal (internal/terminal): process names, owners, GPU names, warnings and errors can hold control
// characters that would hide rows, forge them or retitle the window. Render's own words are plain.
func escaped(f Frame) Frame {
	f.Err = terminal.Escape(f.Err)
	f.Options.Filter = terminal.Escape(f.Options.Filter)
	s := &f.Screen
	if s.Reading == nil {
		s.Reading = &view.Reading{}
	}
	r := *s.Reading
	s.Reading = &r
	r.GPUs = slices.Clone(r.GPUs)
	for i := range r.GPUs {
		g := &r.GPUs[i]
		g.Name, g.Node = terminal.Escape(g.Name), terminal.Escape(g.Node)
		g.Health = slices.Clone(g.Health)
		for j := range g.Health {
			g.Health[j] = terminal.Escape(g.Health[j])
		}
	}
	// A cluster's node names come from Prometheus' labels; a node's GPUs find it by its escaped name.
	r.Nodes = slices.Clone(r.Nodes)
	for i := range r.Nodes {
		r.Nodes[i].Name = terminal.Escape(r.Nodes[i].Name)
	}
	r.Signals = slices.Clone(r.Signals)
	for i := range r.Signals {
		sig := &r.Signals[i]
		sig.GPU, sig.Text, sig.Node = terminal.Escape(sig.GPU), terminal.Escape(sig.Text), terminal.Escape(sig.Node)
	}
	s.Rows = slices.Clone(s.Rows)
	for i := range s.Rows {
		row := &s.Rows[i]
		row.GPU, row.PID, row.Process, row.User = terminal.Escape(row.GPU), terminal.Escape(row.PID), terminal.Escape(row.Process), terminal.Escape(row.User)
		row.Node = terminal.Escape(row.Node)
		o := view.Owner{Kind: row.Owner.Kind, Names: slices.Clone(row.Owner.Names)}
		for j := range o.Names {
			o.Names[j] = terminal.Escape(o.Names[j])
		}
		row.Owner = o
	}
	r.Warnings = slices.Clone(r.Warnings)
	for i, w := range r.Warnings {
		r.Warnings[i] = terminal.Escape(w)
	}
	if f.Detail != nil {
		d := f.Detail.escaped()
		f.Detail = &d
	}
	return f
}

func footerLine(f Frame, st Styles) string {
	w := max(f.Width, minWidth)
	switch {
	case f.Editing:
		return ansi.Truncate(st.Key.Render("/")+" filter (text, user: gpu: ns: node:): "+f.Options.Filter+"█  "+
			st.Dim.Render("enter apply · esc clear"), w, "")
	case f.Detail != nil:
		return ansi.Truncate(st.Key.Render("Esc")+" back · "+st.Key.Render("q")+" quit", w, "…")
	}
	parts := []string{
		"sort " + st.Key.Render(f.Options.Sort.String()) + ": " + st.Key.Render("m") + "em " + st.Key.Render("s") + "m " + st.Key.Render("g") + "pu",
		st.Key.Render("w") + " group",
		st.Key.Render("/") + " filter",
		st.Key.Render("?") + " help",
		st.Key.Render("q") + " quit",
	}
	switch {
	case f.Screen.Reading != nil && f.Screen.Cluster && f.Options.Group && !f.Options.Namespaces:
		parts[1] = st.Key.Render("w") + " namespaces"
	case f.Options.Group:
		parts[1] = st.Key.Render("w") + " ungroup"
	}
	if f.Options.Filter != "" {
		parts[2] = st.Key.Render("/") + " filter: " + f.Options.Filter
	}
	if f.Screen.Reading != nil && f.Screen.Cluster {
		byNode := st.Key.Render("n") + " by node"
		if f.Options.ByNode {
			byNode = st.Key.Render("n") + " nodes only"
		}
		parts = slices.Insert(parts, 2, byNode)
	}
	line := strings.Join(parts, " · ")
	if ansi.StringWidth(line) > w {
		// Narrow: the sort keys are left to the help, so that help and quit stay in sight.
		parts[0] = "sort " + st.Key.Render(f.Options.Sort.String())
		line = strings.Join(parts, " · ")
	}
	return ansi.Truncate(line, w, "…")
}

// fit pads or truncates s to exactly width columns.
func fit(s string, width int, right bool) string {
	s = ansi.Truncate(s, width, "…")
	gap := strings.Repeat(" ", max(width-ansi.StringWidth(s), 0))
	if right {
		return gap + s
	}
	return s + gap
}

// pad fills a header to the terminal's width so that its reversed colours span the screen; plain output gets no
// trailing spaces.
func pad(s string, f Frame) string {
	if !f.Interactive || f.Width <= 0 {
		return strings.TrimRight(s, " ")
	}
	return fit(s, max(f.Width, minWidth), false)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
