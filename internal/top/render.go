package top

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
)

// Frame is everything one drawing shows.
type Frame struct {
	Screen Screen
	View   View
	Time   time.Time // of the reading
	// Err is why the last reading failed; the screen then shows the reading before it.
	Err string
	// Width is the terminal's width in columns. Height is its height in lines, 0 for no limit (plain output).
	Width, Height int
	// Interactive adds the bars, the key help and the filter being typed.
	Interactive bool
	// Editing is true while the filter is typed; View.Filter is then the text so far.
	Editing bool
	// Scroll is the first process row shown, when they do not all fit; Render keeps it within the rows.
	Scroll int
	// Help shows the keys instead of the reading.
	Help bool
}

// Styles colour a frame. The zero value draws plain text.
type Styles struct {
	Title, Header, Dim, Alert, Warn, Key lipgloss.Style
	Low, Mid, High                       lipgloss.Style // bars by how full they are
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
		Low:    lipgloss.NewStyle().Foreground(lipgloss.Color("10")),
		Mid:    lipgloss.NewStyle().Foreground(lipgloss.Color("11")),
		High:   lipgloss.NewStyle().Foreground(lipgloss.Color("9")),
	}
}

const (
	minWidth   = 40
	maxSignals = 4 // lines of signals, the last one saying how many more
	unlimited  = 1 << 20
)

// Render draws a frame as lines no wider than f.Width and, when f.Height is set, no more than f.Height of them.
// Without a width (plain output) nothing is cut. Every text of the frame is escaped for the terminal first, so
// that widths and cuts count what the terminal shows.
func Render(f Frame, st Styles) string {
	f = escaped(f)
	w := width(f)
	if f.Help {
		return finish(f, help(f, st), st)
	}
	lines := upper(f, w, st)
	add := func(s string) { lines = append(lines, s) }

	s := f.Screen
	cols := processColumns(s.Rows, w, f.View.Group, s.Cluster)
	add(st.Header.Render(pad(cols.line("NODE", "GPU", "PID", "USER", "PROCESS", "MEMORY", "SM", "AGE", "OWNER"), f)))
	at := f.Time
	if !s.Time.IsZero() {
		at = s.Time
	}
	first, room := scroll(f, len(lines))
	if first > 0 {
		add(st.Dim.Render(fmt.Sprintf("… %d rows above", first)))
		room--
	}
	for i := first; i < len(s.Rows); i++ {
		if i-first == room-1 && len(s.Rows)-i > 1 {
			add(st.Dim.Render(fmt.Sprintf("… %d more rows", len(s.Rows)-i)))
			break
		}
		r := s.Rows[i]
		add(cols.line(r.Node, r.GPU, r.PID, dash(r.User), dash(r.Process), ps.Memory(r.Memory), ps.Percent(r.SM),
			age(r.Started, at), r.Owner))
	}
	if len(s.Rows) == 0 {
		if f.View.Filter != "" {
			add(st.Dim.Render("no process matches the filter"))
		} else {
			add(st.Dim.Render("no GPU processes"))
		}
	}
	return finish(f, lines, st)
}

// width is the columns a frame may use: the terminal's, or without one, no limit.
func width(f Frame) int {
	if f.Width <= 0 {
		return unlimited
	}
	return max(f.Width, minWidth)
}

// upper is a frame's lines above the process table: the title, an error, the GPUs (or the nodes), their health,
// the signals and the warnings.
func upper(f Frame, w int, st Styles) []string {
	var lines []string
	add := func(s string) { lines = append(lines, s) }

	s := f.Screen
	title := fmt.Sprintf("gpu-pod-exporter top  %s  %s  %s", f.Time.Format("15:04:05"), ps.Plural(len(s.GPUs), "GPU"),
		ps.Plural(s.Processes, "process"))
	if s.Cluster {
		title = clusterTitle(f)
	}
	if s.Simulated {
		title += "  (simulated)"
	}
	add(st.Title.Render(ansi.Truncate(title, w, "…")))
	if f.Err != "" {
		// In full, over as many lines as it takes: the end of an error is often what to do about it.
		for _, l := range strings.Split(ansi.Wrap("reading failed: "+f.Err, w, " "), "\n") {
			add(st.Alert.Render(l))
		}
	}

	if s.Cluster {
		lines = append(lines, nodeSection(f, w, st)...)
	} else {
		add(st.Header.Render(pad(gpuHeader(s, w, f.Interactive), f)))
		for _, g := range s.GPUs {
			add(gpuLine(g, s, w, f.Interactive, st))
		}
	}
	if h := healthLine(s.GPUs); h != "" {
		add(st.Alert.Render(ansi.Truncate(h, w, "…")))
	}
	for i, sig := range s.Signals {
		if f.Height > 0 && i == maxSignals-1 && len(s.Signals) > maxSignals {
			add(st.Dim.Render(fmt.Sprintf("  … %d more signals", len(s.Signals)-i)))
			break
		}
		mark, style := "!", st.Alert
		switch sig.Kind {
		case IdleAllocation:
			mark, style = "○", st.Warn
		case NodeProblem:
			mark = "×"
		}
		add(style.Render(ansi.Truncate(mark+" "+sig.String(), w, "…")))
	}
	for _, warning := range s.Warnings {
		add(st.Warn.Render(ansi.Truncate("warning: "+warning, w, "…")))
	}
	return lines
}

// scroll is the first process row to show and the lines the rows have, below the upper part's and the table
// header's above lines: every row without a height; on a terminal, what the height leaves, the view kept within the
// rows so that the last page is full. A view scrolled down says how many rows are above, one lost down says how
// many are below; each takes a line of the room.
func scroll(f Frame, above int) (first, room int) {
	rows := len(f.Screen.Rows)
	if f.Height <= 0 {
		return 0, rows
	}
	room = max(f.Height-above-1, 1) // the key help's line
	if rows <= room || room < 3 {
		return 0, room
	}
	return min(max(f.Scroll, 0), rows-(room-1)), room
}

// ScrollLimits are, for a frame, the last row a scroll may start at, and a page: the rows one screen shows.
func ScrollLimits(f Frame) (last, page int) {
	f = escaped(f)
	above := len(upper(f, width(f), Styles{})) + 1
	f.Scroll = len(f.Screen.Rows)
	last, room := scroll(f, above)
	return last, max(room-2, 1)
}

// finish adds the key help (or the filter being typed) at the bottom of a terminal's frame, and cuts or trims each
// line.
func finish(f Frame, lines []string, st Styles) string {
	w := width(f)
	if f.Interactive {
		if f.Height > 0 {
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
	{"m  s  g", "sort by memory, SM utilization or GPU"},
	{"w", "group by workload (a cluster: then by namespace)"},
	{"n", "a cluster: each node's GPUs under its line"},
	{"/", "filter: a namespace, or part of an owner or node name"},
	{"  Enter  Esc", "keep the filter; clear it"},
	{"↑ ↓  k j", "scroll the processes a row"},
	{"PgUp PgDn  Home End", "scroll a page, to the top, to the bottom"},
	{"? h", "this help; any key goes back"},
	{"q  Ctrl-C", "quit"},
}

// help is the key help, in place of the reading.
func help(f Frame, st Styles) []string {
	lines := []string{st.Title.Render("gpu-pod-exporter top: keys"), ""}
	for _, k := range keyHelp {
		lines = append(lines, fmt.Sprintf("  %s  %s", st.Key.Render(fit(k[0], 19, false)), k[1]))
	}
	return append(lines, "", st.Dim.Render("USER: the process's owner, with --collector.process-user (on with --demo)."),
		st.Dim.Render("AGE: how long the process has run."))
}

// age is how long a process has run at a reading, in its two largest units: "45s", "12m", "3h20m", "18h", "2d4h",
// "13d"; "-" when unknown.
func age(started, at time.Time) string {
	if started.IsZero() || at.IsZero() {
		return "-"
	}
	d := max(at.Sub(started), 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 24*time.Hour && int(d.Minutes())%60 == 0:
		return fmt.Sprintf("%dh", int(d.Hours()))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	case int(d.Hours())%24 == 0:
		return fmt.Sprintf("%dd", int(d.Hours())/24)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// escaped returns the frame with every text that comes from the node, or from the person's typing, escaped for
// the terminal (internal/terminal): process names, owners, GPU names, warnings and errors can hold control
// characters that would hide rows, forge them or retitle the window. Render's own words are plain.
func escaped(f Frame) Frame {
	f.Err = terminal.Escape(f.Err)
	f.View.Filter = terminal.Escape(f.View.Filter)
	s := &f.Screen
	s.GPUs = slices.Clone(s.GPUs)
	for i := range s.GPUs {
		g := &s.GPUs[i]
		g.Name, g.Mode, g.Node = terminal.Escape(g.Name), terminal.Escape(g.Mode), terminal.Escape(g.Node)
	}
	// A cluster's node names come from Prometheus' labels; a node's GPUs find it by its escaped name.
	s.Nodes = slices.Clone(s.Nodes)
	for i := range s.Nodes {
		s.Nodes[i].Name = terminal.Escape(s.Nodes[i].Name)
	}
	s.Signals = slices.Clone(s.Signals)
	for i := range s.Signals {
		sig := &s.Signals[i]
		sig.GPU, sig.Owner, sig.Node = terminal.Escape(sig.GPU), terminal.Escape(sig.Owner), terminal.Escape(sig.Node)
	}
	s.Rows = slices.Clone(s.Rows)
	for i := range s.Rows {
		r := &s.Rows[i]
		r.GPU, r.PID, r.Process, r.User = terminal.Escape(r.GPU), terminal.Escape(r.PID), terminal.Escape(r.Process), terminal.Escape(r.User)
		r.Owner, r.Namespace, r.Node = terminal.Escape(r.Owner), terminal.Escape(r.Namespace), terminal.Escape(r.Node)
	}
	s.Warnings = slices.Clone(s.Warnings)
	for i, w := range s.Warnings {
		s.Warnings[i] = terminal.Escape(w)
	}
	return f
}

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
	bar = min(max((rest-name)/2, 3), 30)
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

func gpuLine(g GPU, s Screen, w int, bars bool, st Styles) string {
	name, bar := gpuWidths(s, w, bars)
	bars = bar > 0
	b := []string{indexCell(g, st), fit(g.Name, name, false)}
	ratio := gpu.Value{}
	if g.MemoryUsed.Valid && g.MemoryTotal.Valid && g.MemoryTotal.V > 0 {
		ratio = gpu.Known(g.MemoryUsed.V / g.MemoryTotal.V)
	}
	mem := "-"
	if g.MemoryUsed.Valid && g.MemoryTotal.Valid {
		mem = fmt.Sprintf("%.0f/%.0fG", g.MemoryUsed.V/(1<<30), g.MemoryTotal.V/(1<<30))
	}
	if bars {
		b = append(b, meter(g.Utilization, bar, st)+" "+fit(ps.Percent(g.Utilization), 4, true),
			meter(ratio, bar, st)+" "+fit(mem, 9, true))
	} else {
		b = append(b, fit(ps.Percent(g.Utilization), 4, true), fit(mem, 9, true))
	}
	temp, power := "-", "-"
	if g.Temperature.Valid {
		temp = fmt.Sprintf("%.0f°C", g.Temperature.V)
	}
	if g.Power.Valid {
		power = fmt.Sprintf("%.0fW", g.Power.V)
	}
	b = append(b, fit(temp, 4, true), fit(power, 5, true), fit(g.Mode, 10, false))
	if s.AllocationsKnown {
		b = append(b, allocCell(g, st))
	}
	return strings.Join(b, " ")
}

// allocCell says how many pods hold the GPU, marked "!" when a pod uses it without an allocation and "○" when a
// pod holds it idle; the signal lines below name them.
func allocCell(g GPU, st Styles) string {
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

// meter is a bar of width cells, coloured by how full it is.
func meter(v gpu.Value, width int, st Styles) string {
	if !v.Valid {
		return strings.Repeat(" ", width)
	}
	r := min(max(v.V, 0), 1)
	full := int(r*float64(width) + 0.5)
	style := st.Low
	switch {
	case r >= 0.9:
		style = st.High
	case r >= 0.6:
		style = st.Mid
	}
	return style.Render(strings.Repeat("█", full)) + st.Dim.Render(strings.Repeat("░", width-full))
}

// columns are the process table's widths; a column of width 0 is not shown.
type columns struct{ node, gpu, pid, user, process, age, owner int }

// processColumns sizes the process table: the owner gets what the other columns leave. A cluster's table starts
// with the node; USER shows when users are looked up, AGE when start times are known.
func processColumns(rows []Row, w int, grouped, cluster bool) columns {
	c := columns{gpu: 3, pid: 7, process: 7}
	if grouped {
		c.pid = 8
	}
	if cluster {
		c.node = 4
	}
	for _, r := range rows {
		c.gpu = max(c.gpu, min(ansi.StringWidth(r.GPU), 11))
		c.process = max(c.process, min(ansi.StringWidth(r.Process), 24))
		if cluster {
			c.node = max(c.node, min(ansi.StringWidth(r.Node), 16))
		}
		if r.User != "" {
			c.user = max(c.user, 4, min(ansi.StringWidth(r.User), 12))
		}
		if !r.Started.IsZero() {
			c.age = 6
		}
	}
	fixed := c.gpu + 1 + c.pid + 1 + 1 + 8 + 1 + 4 + 1
	for _, optional := range []int{c.node, c.user, c.age} {
		if optional > 0 {
			fixed += optional + 1
		}
	}
	c.process = min(c.process, max((w-fixed)/4, 7))
	c.owner = max(w-fixed-c.process, 10)
	return c
}

func (c columns) line(node, gpuCol, pid, user, process, mem, sm, age, owner string) string {
	var cells []string
	if c.node > 0 {
		cells = append(cells, fit(node, c.node, false))
	}
	cells = append(cells, fit(gpuCol, c.gpu, false), fit(pid, c.pid, true))
	if c.user > 0 {
		cells = append(cells, fit(user, c.user, false))
	}
	cells = append(cells, fit(process, c.process, false), fit(mem, 8, true), fit(sm, 4, true))
	if c.age > 0 {
		cells = append(cells, fit(age, c.age, true))
	}
	return strings.Join(append(cells, shorten(owner, c.owner)), " ")
}

// shorten cuts an owner to width columns in the middle, so that a long pod name keeps its container: "pod
// ml-training/bert-finetune-7c…/trainer".
func shorten(owner string, width int) string {
	if ansi.StringWidth(owner) <= width {
		return owner
	}
	i := strings.LastIndex(owner, "/")
	if i < 0 || ansi.StringWidth(owner[i:]) > width/3 {
		return ansi.Truncate(owner, width, "…")
	}
	tail := owner[i:]
	return ansi.Truncate(owner[:i], width-ansi.StringWidth(tail), "…") + tail
}

func footerLine(f Frame, st Styles) string {
	if f.Editing {
		return ansi.Truncate(st.Key.Render("/")+" filter by namespace or owner: "+f.View.Filter+"█  "+
			st.Dim.Render("enter apply · esc clear"), max(f.Width, minWidth), "")
	}
	parts := []string{
		"sort " + st.Key.Render(f.View.Sort.String()) + ": " + st.Key.Render("m") + "em " + st.Key.Render("s") + "m " + st.Key.Render("g") + "pu",
		st.Key.Render("w") + " group",
		st.Key.Render("/") + " filter",
		st.Key.Render("?") + " help",
		st.Key.Render("q") + " quit",
	}
	switch {
	case f.Screen.Cluster && f.View.Group && !f.View.Namespaces:
		parts[1] = st.Key.Render("w") + " namespaces"
	case f.View.Group:
		parts[1] = st.Key.Render("w") + " ungroup"
	}
	if f.View.Filter != "" {
		parts[2] = st.Key.Render("/") + " filter: " + f.View.Filter
	}
	if f.Screen.Cluster {
		byNode := st.Key.Render("n") + " by node"
		if f.View.ByNode {
			byNode = st.Key.Render("n") + " nodes only"
		}
		parts = slices.Insert(parts, 2, byNode)
	}
	line := strings.Join(parts, " · ")
	if ansi.StringWidth(line) > max(f.Width, minWidth) {
		// Narrow: the sort keys are left to the help, so that help and quit stay in sight.
		parts[0] = "sort " + st.Key.Render(f.View.Sort.String())
		line = strings.Join(parts, " · ")
	}
	return ansi.Truncate(line, max(f.Width, minWidth), "…")
}

// fit pads or truncates s to exactly width columns.
func fit(s string, width int, right bool) string {
	s = ansi.Truncate(s, width, "…")
	gap := strings.Repeat(" ", width-ansi.StringWidth(s))
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
