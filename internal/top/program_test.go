package top

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/ansi"
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
		case "up":
			msg = tea.KeyMsg{Type: tea.KeyUp}
		case "down":
			msg = tea.KeyMsg{Type: tea.KeyDown}
		case "pgup":
			msg = tea.KeyMsg{Type: tea.KeyPgUp}
		case "pgdown":
			msg = tea.KeyMsg{Type: tea.KeyPgDown}
		case "home":
			msg = tea.KeyMsg{Type: tea.KeyHome}
		case "end":
			msg = tea.KeyMsg{Type: tea.KeyEnd}
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

// shownPIDs are the PIDs of the process rows a model's frame shows, and the lines that say rows are above or below.
func shownPIDs(m *model) (pids []string, above, below string) {
	lines := strings.Split(m.View(), "\n")
	header := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "GPU ") && strings.Contains(l, " OWNER") })
	for _, l := range lines[header+1 : len(lines)-1] { // the last is the key help
		switch f := strings.Fields(l); {
		case strings.HasPrefix(l, "… ") && strings.HasSuffix(l, " above"):
			above = l
		case strings.HasPrefix(l, "… "):
			below = l
		case len(f) > 1 && f[1] != "·":
			pids = append(pids, f[1])
		}
	}
	return pids, above, below
}

// Rows past the screen scroll with the arrows, j/k, PgUp/PgDn and Home/End, and the frame says how many rows are
// above and below; the view stays within the rows.
func TestScroll(t *testing.T) {
	m := &model{cfg: Config{Interval: time.Second}, ctx: context.Background()}
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	m.Update(readingMsg{rd: crowded()}) // 48 processes; 12 lines for them, one of which says how many more
	all := pids(m.screen.Rows)
	at := func(first int, n int) string { return strings.Join(strings.Fields(all)[first:first+n], " ") }
	check := func(keys string, wantFirst, wantRows int, wantAbove, wantBelow string) {
		t.Helper()
		got, above, below := shownPIDs(m)
		if strings.Join(got, " ") != at(wantFirst, wantRows) || above != wantAbove || below != wantBelow {
			t.Errorf("after %s: rows %v, above %q, below %q; want %s, %q, %q", keys, got, above, below, at(wantFirst, wantRows), wantAbove, wantBelow)
		}
		if n := strings.Count(m.View(), "\n") + 1; n != 24 {
			t.Errorf("after %s: %d lines", keys, n)
		}
	}
	check("nothing", 0, 11, "", "… 37 more rows")
	press(m, "j")
	check("j", 1, 10, "… 1 rows above", "… 37 more rows")
	press(m, "down", "down")
	check("j ↓ ↓", 3, 10, "… 3 rows above", "… 35 more rows")
	press(m, "k")
	check("k", 2, 10, "… 2 rows above", "… 36 more rows")
	press(m, "pgdown") // a page is the 10 rows shown between the two lines
	check("PgDn", 12, 10, "… 12 rows above", "… 26 more rows")
	press(m, "pgup", "up")
	check("PgUp ↑", 1, 10, "… 1 rows above", "… 37 more rows")
	press(m, "end")
	check("End", 37, 11, "… 37 rows above", "")
	press(m, "j", "pgdown", "down")
	check("End j PgDn ↓", 37, 11, "… 37 rows above", "")
	press(m, "home", "k", "pgup", "up")
	check("Home k PgUp ↑", 0, 11, "", "… 37 more rows")
	press(m, "end", "m")
	all = pids(m.screen.Rows)
	check("End m", 0, 11, "", "… 37 more rows") // a new order starts at the top
}

// ? and h show the keys in place of the reading; any key but q goes back, q still quits.
func TestHelp(t *testing.T) {
	m := &model{cfg: Config{Interval: time.Second}, ctx: context.Background()}
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	m.Update(readingMsg{rd: node()})
	for _, key := range []string{"?", "h"} {
		press(m, key)
		v := m.View()
		for _, k := range keyHelp {
			if !strings.Contains(v, k[0]) || !strings.Contains(v, k[1]) {
				t.Errorf("%s: the help lacks %q:\n%s", key, k, v)
			}
		}
		if strings.Contains(v, "ollama") || strings.Count(v, "\n")+1 != 24 {
			t.Errorf("%s: the help is not a whole screen in place of the reading:\n%s", key, v)
		}
		for _, l := range strings.Split(v, "\n") {
			if ansi.StringWidth(l) > 80 {
				t.Errorf("%s: a help line is wider than the terminal: %q", key, l)
			}
		}
		press(m, "m")
		if v := m.View(); m.view.Sort != ByGPU || !strings.Contains(v, "ollama") {
			t.Errorf("%s then m: the key must only leave the help (sort %s):\n%s", key, m.view.Sort, v)
		}
	}
	press(m, "?")
	if cmd := press(m, "q"); cmd == nil {
		t.Error("q in the help does not quit")
	}
}
