package top

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// Config is what the view reads and how it starts.
type Config struct {
	// Read takes one reading of the node, or of the cluster, for the options in force (a cluster's grouped view
	// reads the workloads' history).
	Read     func(ctx context.Context, o Options) (*view.Reading, error)
	Interval time.Duration
	Options  Options
	// Host reads what a process's /proc says, for its detail, if the PID is still the process that started then;
	// nil when the processes run on other machines (a cluster's).
	Host func(pid uint32, started time.Time) view.Host
}

// Run shows the live view on the terminal until the person presses q (or Ctrl-C) or ctx ends. The terminal's
// screen and modes are restored on the way out. Signals are the caller's to turn into ctx's end: bubbletea's own
// handler races the caller's for SIGTERM and can hang the program's shutdown (its send on a loop that has ended;
// charmbracelet/bubbletea#1806).
func Run(ctx context.Context, cfg Config, opts ...tea.ProgramOption) error {
	opts = append([]tea.ProgramOption{tea.WithContext(ctx), tea.WithAltScreen(), tea.WithoutSignalHandler()}, opts...)
	_, err := tea.NewProgram(newModel(ctx, cfg), opts...).Run()
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		return nil // stopped by a signal: a normal way to leave
	}
	return err
}

// RunPlain writes a plain table every interval, for output that is not a terminal: no colours, no bars, no
// cursor movement, a blank line between tables. It stops after count readings (0: when ctx ends). A failed
// reading is reported on errOut and the next one tried; output that cannot be written ends it.
func RunPlain(ctx context.Context, cfg Config, count int, out, errOut io.Writer) error {
	sep := ""
	for n := 1; ; n++ {
		started := time.Now()
		rd, err := cfg.Read(ctx, cfg.Options)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			fmt.Fprintf(errOut, "gpu-pod-exporter top: %s\n", terminal.Escape(err.Error()))
		default:
			frame := Frame{Screen: Build(rd, cfg.Options), Options: cfg.Options, Time: time.Now(), Cursor: -1}
			if _, err := fmt.Fprintln(out, sep+Render(frame, Styles{})); err != nil {
				return fmt.Errorf("writing output: %w", err)
			}
			sep = "\n"
		}
		if count > 0 && n >= count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(untilNext(started, cfg.Interval)):
		}
	}
}

// untilNext is the wait before the next reading: readings start an interval apart, so that a slow source (a
// Prometheus answering for a thousand nodes) does not stretch the interval, and one that takes longer than the
// interval is followed at once, never overlapped.
func untilNext(started time.Time, interval time.Duration) time.Duration {
	return max(interval-time.Since(started), 0)
}

// model is the bubbletea program: the latest reading, the options the keys chose, the cursor, and the terminal's
// size.
type model struct {
	cfg     Config
	ctx     context.Context
	options Options

	reading *view.Reading
	screen  Screen
	at      time.Time
	err     string
	editing bool
	// cursor is the selected row, and cursorKey the row it is on, so that it stays on it when the rows move;
	// scroll is the first row shown.
	cursor, scroll int
	cursorKey      string
	// help shows the keys, notes the signals and warnings, detail a process, instead of the reading.
	help, notes bool
	detail      *Detail
	// quitting blanks the last frame: bubbletea may draw it once more after leaving the alternate screen (after a
	// resize it does), where it would stay on the person's terminal.
	quitting bool

	width, height int
}

func newModel(ctx context.Context, cfg Config) *model {
	return &model{cfg: cfg, ctx: ctx, options: cfg.Options}
}

type readingMsg struct {
	rd      *view.Reading
	err     error
	started time.Time
	at      time.Time
}

type tickMsg struct{}

func (m *model) Init() tea.Cmd { return m.read() }

// read is a command that takes a reading off the program's loop, so that keys stay responsive while the GPUs are
// slow to answer. It reads with the options of now, copied here on the loop: the keys change the model's while it
// runs.
func (m *model) read() tea.Cmd {
	read, ctx, o := m.cfg.Read, m.ctx, m.options
	return func() tea.Msg {
		started := time.Now()
		rd, err := read(ctx, o)
		return readingMsg{rd, err, started, time.Now()}
	}
}

func (m *model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		m.place()
	case readingMsg:
		if msg.err != nil {
			m.err = msg.err.Error()
		} else {
			m.reading, m.err, m.at = msg.rd, "", msg.at
			m.rebuild()
			if m.detail != nil {
				m.look(m.detail.GPUs[0].Node, m.detail.GPUs[0].PID, m.detail.Workload)
			}
		}
		return m, tea.Tick(untilNext(msg.started, m.cfg.Interval), func(time.Time) tea.Msg { return tickMsg{} })
	case tickMsg:
		return m, m.read()
	case tea.KeyMsg:
		if (m.help || m.notes) && msg.String() != "q" && msg.String() != "ctrl+c" {
			m.help, m.notes = false, false // any key leaves the help
			return m, nil
		}
		if m.editing {
			m.edit(msg)
			m.cursor, m.scroll, m.cursorKey = 0, 0, ""
		} else if quit := m.keys(msg); quit {
			m.quitting = true
			return m, tea.Quit
		}
		m.rebuild()
	}
	return m, nil
}

// keys acts on keys outside the filter prompt; it reports whether the person asked to quit. Keys typed faster
// than the terminal is read come as one message of several runes.
func (m *model) keys(k tea.KeyMsg) bool {
	if k.Type != tea.KeyRunes || k.Alt {
		return m.key(k.String())
	}
	for i, r := range k.Runes {
		if m.editing { // "/" opened the prompt: the rest is the filter's
			m.edit(tea.KeyMsg{Type: tea.KeyRunes, Runes: k.Runes[i:]})
			return false
		}
		if m.key(string(r)) {
			return true
		}
	}
	return false
}

func (m *model) key(k string) bool {
	if m.detail != nil {
		switch k {
		case "q", "ctrl+c":
			return true
		case "esc", "enter", "backspace", "left", "h":
			m.detail = nil
		}
		return false
	}
	_, page := RowsShown(m.frame())
	moved := true
	switch k {
	case "q", "ctrl+c":
		return true
	case "esc":
		m.options.Filter = ""
		m.cursor, m.scroll, m.cursorKey = 0, 0, ""
	case "m", "M":
		m.options.Sort = view.ByMemory
	case "s", "S":
		m.options.Sort = view.BySM
	case "g", "G":
		m.options.Sort = view.ByGPU
	case "a", "A":
		m.options.Sort = view.ByAge
	case "w", "W":
		// A cluster's rows group by workload, then by namespace, then not.
		switch {
		case m.cluster() && m.options.Group && !m.options.Namespaces:
			m.options.Namespaces = true
		default:
			m.options.Group, m.options.Namespaces = !m.options.Group, false
		}
		m.cursor, m.scroll = 0, 0
	case "n", "N":
		m.options.ByNode = !m.options.ByNode
	case "/":
		m.editing = true
	case "?", "h", "H":
		m.help = true
	case "e", "E":
		m.notes = true
	case "enter":
		if m.cursor < len(m.screen.Rows) {
			r := m.screen.Rows[m.cursor]
			if r.Proc != nil {
				var workload *Row
				if m.screen.Grouped {
					workload = &r
				}
				m.look(r.Proc.Node, r.Proc.PID, workload)
			}
		}
	case "up", "k", "K":
		m.cursor--
	case "down", "j", "J":
		m.cursor++
	case "pgup":
		m.cursor -= page
		m.scroll -= page
	case "pgdown":
		m.cursor += page
		m.scroll += page
	case "home":
		m.cursor, m.scroll = 0, 0
	case "end":
		m.cursor, m.scroll = len(m.screen.Rows)-1, len(m.screen.Rows)
	default:
		moved = false
	}
	if moved {
		m.cursor = min(max(m.cursor, 0), max(len(m.screen.Rows)-1, 0))
		m.cursorKey = ""
		if m.cursor < len(m.screen.Rows) {
			m.cursorKey = m.screen.Rows[m.cursor].Key
		}
	}
	return false
}

// look opens the detail of the process PID of node: its rows on every GPU, and its /proc on this node.
func (m *model) look(node string, pid uint32, workload *Row) {
	d := &Detail{At: m.at, Workload: workload}
	if m.detail != nil {
		d.Host = m.detail.Host
	}
	for _, p := range m.reading.Processes {
		if p.Node == node && p.PID == pid {
			d.GPUs = append(d.GPUs, p)
		}
	}
	if len(d.GPUs) > 0 && m.cfg.Host != nil && node == "" {
		h := m.cfg.Host(pid, d.GPUs[0].Started)
		d.Host = &h
	}
	m.detail = d
}

// edit types the filter; the rows follow each key.
func (m *model) edit(k tea.KeyMsg) {
	switch k.Type {
	case tea.KeyEnter:
		m.editing = false
	case tea.KeyEsc, tea.KeyCtrlC:
		m.editing, m.options.Filter = false, ""
	case tea.KeyBackspace:
		if r := []rune(m.options.Filter); len(r) > 0 {
			m.options.Filter = string(r[:len(r)-1])
		}
	case tea.KeyRunes, tea.KeySpace:
		if !k.Alt && len(m.options.Filter) < 64 {
			m.options.Filter += string(k.Runes)
		}
	}
}

// cluster reports whether the view shows many nodes.
func (m *model) cluster() bool { return m.reading != nil && m.reading.Cluster }

// rebuild lays out the reading again, and keeps the cursor on its row.
func (m *model) rebuild() {
	if m.reading == nil {
		return
	}
	m.screen = Build(m.reading, m.options)
	if m.cursorKey != "" {
		for i, r := range m.screen.Rows {
			if r.Key == m.cursorKey {
				m.cursor = i
				break
			}
		}
	}
	m.place()
}

// place keeps the cursor within the rows and the scroll where the frame shows the cursor.
func (m *model) place() {
	m.cursor = min(max(m.cursor, 0), max(len(m.screen.Rows)-1, 0))
	if m.reading != nil && m.height > 0 {
		m.scroll, _ = RowsShown(m.frame())
	}
}

func (m *model) View() string {
	if m.quitting {
		return ""
	}
	if m.reading == nil {
		if m.err != "" {
			return "gpu-pod-exporter top: " + terminal.Escape(m.err) + "\n(q to quit)"
		}
		return "gpu-pod-exporter top: reading…"
	}
	return Render(m.frame(), Colors())
}

// frame is what the terminal shows now.
func (m *model) frame() Frame {
	return Frame{
		Screen: m.screen, Options: m.options, Time: m.at, Err: m.err, Width: m.width, Height: m.height,
		Interactive: true, Editing: m.editing, Cursor: m.cursor, Scroll: m.scroll, Help: m.help, Notes: m.notes,
		Detail: m.detail,
	}
}
