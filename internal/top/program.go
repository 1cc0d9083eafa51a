package top

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
)

// Config is what the view reads and how it starts.
type Config struct {
	// Read takes one reading of the node.
	Read     func(ctx context.Context) (Reading, error)
	Interval time.Duration
	View     View
}

// Run shows the live view on the terminal until the person presses q (or Ctrl-C) or ctx ends. The terminal's
// screen and modes are restored on the way out. Signals are the caller's to turn into ctx's end: bubbletea's own
// handler races the caller's for SIGTERM and can hang the program's shutdown (its send on a loop that has ended;
// charmbracelet/bubbletea#1806).
func Run(ctx context.Context, cfg Config, opts ...tea.ProgramOption) error {
	opts = append([]tea.ProgramOption{tea.WithContext(ctx), tea.WithAltScreen(), tea.WithoutSignalHandler()}, opts...)
	_, err := tea.NewProgram(&model{cfg: cfg, ctx: ctx, view: cfg.View}, opts...).Run()
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
		rd, err := cfg.Read(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			fmt.Fprintf(errOut, "gpu-pod-exporter top: %s\n", terminal.Escape(err.Error()))
		default:
			frame := Frame{Screen: Build(rd, cfg.View), View: cfg.View, Time: time.Now()}
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

// model is the bubbletea program: the latest reading, the view the keys chose, and the terminal's size.
type model struct {
	cfg  Config
	ctx  context.Context
	view View

	reading *Reading
	screen  Screen
	at      time.Time
	err     string
	editing bool
	// scroll is the first process row shown; help shows the keys instead of the reading.
	scroll int
	help   bool
	// quitting blanks the last frame: bubbletea may draw it once more after leaving the alternate screen (after a
	// resize it does), where it would stay on the person's terminal.
	quitting bool

	width, height int
}

type readingMsg struct {
	rd      Reading
	err     error
	started time.Time
	at      time.Time
}

type tickMsg struct{}

func (m *model) Init() tea.Cmd { return m.read }

// read takes a reading off the program's loop, so that keys stay responsive while the GPUs are slow to answer.
func (m *model) read() tea.Msg {
	started := time.Now()
	rd, err := m.cfg.Read(m.ctx)
	return readingMsg{rd, err, started, time.Now()}
}

func (m *model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case readingMsg:
		if msg.err != nil {
			m.err = msg.err.Error()
		} else {
			m.reading, m.err, m.at = &msg.rd, "", msg.at
			m.rebuild()
		}
		return m, tea.Tick(untilNext(msg.started, m.cfg.Interval), func(time.Time) tea.Msg { return tickMsg{} })
	case tickMsg:
		return m, m.read
	case tea.KeyMsg:
		if m.help && msg.String() != "q" && msg.String() != "ctrl+c" {
			m.help = false // any key leaves the help
			return m, nil
		}
		if m.editing {
			m.edit(msg)
			m.scroll = 0
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
	last, page := ScrollLimits(m.frame())
	switch k {
	case "q", "ctrl+c":
		return true
	case "esc":
		m.view.Filter, m.scroll = "", 0
	case "m", "M":
		m.view.Sort, m.scroll = ByMemory, 0
	case "s", "S":
		m.view.Sort, m.scroll = BySM, 0
	case "g", "G":
		m.view.Sort, m.scroll = ByGPU, 0
	case "w", "W":
		// A cluster's rows group by workload, then by namespace, then not.
		switch {
		case m.cluster() && m.view.Group && !m.view.Namespaces:
			m.view.Namespaces = true
		default:
			m.view.Group, m.view.Namespaces = !m.view.Group, false
		}
		m.scroll = 0
	case "n", "N":
		m.view.ByNode = !m.view.ByNode
	case "/":
		m.editing = true
	case "?", "h", "H":
		m.help = true
	case "up", "k", "K":
		m.scroll--
	case "down", "j", "J":
		m.scroll++
	case "pgup":
		m.scroll -= page
	case "pgdown":
		m.scroll += page
	case "home":
		m.scroll = 0
	case "end":
		m.scroll = last
	}
	m.scroll = min(max(m.scroll, 0), last)
	return false
}

// edit types the filter; the rows follow each key.
func (m *model) edit(k tea.KeyMsg) {
	switch k.Type {
	case tea.KeyEnter:
		m.editing = false
	case tea.KeyEsc, tea.KeyCtrlC:
		m.editing, m.view.Filter = false, ""
	case tea.KeyBackspace:
		if r := []rune(m.view.Filter); len(r) > 0 {
			m.view.Filter = string(r[:len(r)-1])
		}
	case tea.KeyRunes, tea.KeySpace:
		if !k.Alt && len(m.view.Filter) < 64 {
			m.view.Filter += string(k.Runes)
		}
	}
}

// cluster reports whether the view shows many nodes.
func (m *model) cluster() bool { return m.reading != nil && m.reading.Cluster != nil }

func (m *model) rebuild() {
	if m.reading != nil {
		m.screen = Build(*m.reading, m.view)
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
		return "gpu-pod-exporter top: reading the GPUs…"
	}
	return Render(m.frame(), Colors())
}

// frame is what the terminal shows now.
func (m *model) frame() Frame {
	return Frame{
		Screen: m.screen, View: m.view, Time: m.at, Err: m.err, Width: m.width, Height: m.height,
		Interactive: true, Editing: m.editing, Scroll: m.scroll, Help: m.help,
	}
}
