package top

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

func press(m *model, keys ...string) tea.Cmd {
	var cmd tea.Cmd
	for _, k := range keys {
		var msg tea.KeyMsg
		switch k {
		case "enter":
			msg = tea.KeyMsg{Type: tea.KeyEnter}
		case "esc":
			msg = tea.KeyMsg{Type: tea.KeyEsc}
		case "backspace":
			msg = tea.KeyMsg{Type: tea.KeyBackspace}
		default:
			msg = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
		}
		_, cmd = m.Update(msg)
	}
	return cmd
}

// The keys act on the view the model draws; the terminal itself is tested in test/top.
func TestKeys(t *testing.T) {
	m := &model{cfg: Config{Interval: time.Second}, ctx: context.Background()}
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	if _, cmd := m.Update(readingMsg{rd: node()}); cmd == nil {
		t.Fatal("a reading schedules no next one")
	}
	if got := pids(m.screen.Rows); got != "10 11 12 20 21 30 31 32" {
		t.Fatalf("rows before any key: %s", got)
	}
	press(m, "m")
	if got := pids(m.screen.Rows); m.view.Sort != ByMemory || got != "20 12 21 31 11 10 32 30" {
		t.Errorf("m: sort %s, rows %s", m.view.Sort, got)
	}
	press(m, "s")
	if m.view.Sort != BySM {
		t.Errorf("s: sort %s", m.view.Sort)
	}
	press(m, "g", "w")
	if !m.view.Group || !strings.Contains(m.View(), "2 procs") {
		t.Errorf("w: not grouped:\n%s", m.View())
	}
	press(m, "w", "/", "t", "r", "i", "x", "backspace")
	if !m.editing || m.view.Filter != "tri" || pids(m.screen.Rows) != "30 31" {
		t.Errorf("typing a filter: editing %v, filter %q, rows %s", m.editing, m.view.Filter, pids(m.screen.Rows))
	}
	if cmd := press(m, "q"); cmd != nil || m.view.Filter != "triq" {
		t.Error("q while typing the filter must type, not quit")
	}
	press(m, "backspace", "enter")
	if m.editing || m.view.Filter != "tri" || !strings.Contains(m.View(), "/ filter: tri") {
		t.Errorf("enter: editing %v, filter %q", m.editing, m.view.Filter)
	}
	press(m, "/", "x", "esc")
	if m.editing || m.view.Filter != "" {
		t.Errorf("esc: editing %v, filter %q", m.editing, m.view.Filter)
	}
	// Keys typed faster than they are read arrive together, and each acts.
	press(m, "wm/ml")
	if !m.view.Group || m.view.Sort != ByMemory || !m.editing || m.view.Filter != "ml" {
		t.Errorf("keys together: %+v, editing %v", m.view, m.editing)
	}
	cmd := press(m, "esc", "wgq")
	if m.view.Group || m.view.Sort != ByGPU {
		t.Errorf("wg: %+v", m.view)
	}
	if cmd == nil {
		t.Fatal("q does not quit")
	}
	if _, ok := cmd().(tea.QuitMsg); !ok {
		t.Error("q's command is not quit")
	}
}

// A failed reading is shown over the last good one, which stays on screen.
func TestFailedReadingKeepsTheLastOne(t *testing.T) {
	m := &model{cfg: Config{Interval: time.Second}, ctx: context.Background()}
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	m.Update(readingMsg{err: errors.New("nvml: GPU is lost")})
	if v := m.View(); !strings.Contains(v, "nvml: GPU is lost") {
		t.Errorf("first reading failed:\n%s", v)
	}
	m.Update(readingMsg{rd: node()})
	m.Update(readingMsg{err: errors.New("collection timed out")})
	v := m.View()
	if !strings.Contains(v, "reading failed: collection timed out") || !strings.Contains(v, "service ollama.service") {
		t.Errorf("failed reading over a good one:\n%s", v)
	}
}

func TestRunPlain(t *testing.T) {
	reads := 0
	cfg := Config{Interval: time.Millisecond, View: View{Filter: "inference"}, Read: func(context.Context) (Reading, error) {
		reads++
		if reads == 2 {
			return Reading{}, errors.New("collection timed out")
		}
		return node(), nil
	}}
	var out, errOut bytes.Buffer
	if err := RunPlain(context.Background(), cfg, 3, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	tables := strings.Split(out.String(), "\n\n")
	if reads != 3 || len(tables) != 2 {
		t.Fatalf("%d reads; want 2 tables, none for the failed reading:\n%s", reads, out.String())
	}
	for _, table := range tables {
		if !strings.HasPrefix(table, "gpu-pod-exporter top ") || strings.Count(table, "pod inference/") != 2 || strings.Contains(table, "ollama") {
			t.Errorf("table:\n%s", table)
		}
	}
	if errOut.String() != "gpu-pod-exporter top: collection timed out\n" {
		t.Errorf("errors: %q", errOut.String())
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := RunPlain(ctx, cfg, 0, &out, &errOut); err != nil {
		t.Errorf("an ended context is a normal stop: %v", err)
	}
}

// A reading's error text names the node's things (a runtime's answer, a path) and is escaped wherever it is shown.
func TestReadingErrorsAreEscaped(t *testing.T) {
	failed := errors.New("runtime said \x1b]0;pwned\x07\nforged")
	const shown = `runtime said \x1b]0;pwned\a\nforged`
	m := &model{cfg: Config{Interval: time.Second}, ctx: context.Background()}
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	m.Update(readingMsg{err: failed})
	if v := m.View(); !strings.Contains(v, shown) {
		t.Errorf("first reading failed:\n%q", v)
	}
	m.Update(readingMsg{rd: node()})
	m.Update(readingMsg{err: failed})
	if v := m.View(); !strings.Contains(v, "reading failed: "+shown) {
		t.Errorf("failed reading over a good one:\n%q", v)
	}

	cfg := Config{Interval: time.Millisecond, Read: func(context.Context) (Reading, error) { return Reading{}, failed }}
	var out, errOut bytes.Buffer
	if err := RunPlain(context.Background(), cfg, 1, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if want := "gpu-pod-exporter top: " + shown + "\n"; errOut.String() != want {
		t.Errorf("plain output's error: %q, want %q", errOut.String(), want)
	}
}
