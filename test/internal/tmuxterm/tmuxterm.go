// Package tmuxterm runs a command in a real terminal for the end-to-end tests: a tmux server of the test's own,
// whose screen is read with capture-pane and typed into with send-keys.
package tmuxterm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// Wait is how long a screen may take to show what a test waits for.
const Wait = 15 * time.Second

// Terminal is one tmux server of the test's own, with one window running a command.
type Terminal struct {
	t      *testing.T
	socket string
}

// Start runs argv in a new tmux window of width×height. The window stays after the command ends
// (remain-on-exit), so that its last screen and exit status can be read; the test's failure shows the last screen.
func Start(t *testing.T, width, height int, argv ...string) *Terminal {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is not installed (scripts/test.sh installs it)")
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "tmux.conf")
	if err := os.WriteFile(conf, []byte("set -g remain-on-exit on\nset -g status off\nset -g history-limit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	term := &Terminal{t: t, socket: filepath.Join(dir, "tmux.sock")}
	term.Tmux(append([]string{"-f", conf, "new-session", "-d", "-s", "top", "-x", fmt.Sprint(width), "-y", fmt.Sprint(height)}, argv...)...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last screen:\n%s", term.Tmux("capture-pane", "-p", "-t", "top"))
		}
		exec.Command("tmux", "-S", term.socket, "kill-server").Run()
	})
	return term
}

// On is the same terminal for a subtest, which its failures then fail.
func (term *Terminal) On(t *testing.T) *Terminal { return &Terminal{t: t, socket: term.socket} }

// T is the test the terminal fails.
func (term *Terminal) T() *testing.T { return term.t }

// Tmux runs a tmux command against the terminal's server and returns its output.
func (term *Terminal) Tmux(args ...string) string {
	term.t.Helper()
	cmd := exec.Command("tmux", append([]string{"-S", term.socket}, args...)...)
	// The window is a person's terminal: CI's CI=true, which tells terminal libraries that no terminal is there and
	// so to draw without colours, stays out of it.
	cmd.Env = []string{"TERM=xterm-256color"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CI=") && !strings.HasPrefix(kv, "TERM=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		term.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Screen is what the window shows now, without colours.
func (term *Terminal) Screen() string { return term.Tmux("capture-pane", "-p", "-t", "top") }

// Lines is the screen as lines, trailing blanks removed.
func (term *Terminal) Lines() []string {
	lines := strings.Split(strings.TrimSuffix(term.Screen(), "\n"), "\n")
	for i := range lines {
		lines[i] = strings.TrimRight(lines[i], " ")
	}
	return lines
}

// WaitFor polls the screen until cond holds for its lines, and returns them.
func (term *Terminal) WaitFor(what string, cond func(lines []string) bool) []string {
	term.t.Helper()
	var lines []string
	testkit.WaitFor(term.t, Wait, what, func() bool {
		lines = term.Lines()
		return cond(lines)
	})
	return lines
}

// WaitForText polls the screen until it shows every text, and returns its lines.
func (term *Terminal) WaitForText(texts ...string) []string {
	term.t.Helper()
	return term.WaitFor(fmt.Sprintf("the screen to show %q", texts), func(lines []string) bool {
		s := strings.Join(lines, "\n")
		for _, text := range texts {
			if !strings.Contains(s, text) {
				return false
			}
		}
		return true
	})
}

// Keys types keys: tmux key names (Enter, Escape, the arrows and paging keys) or literal text.
func (term *Terminal) Keys(keys ...string) {
	term.t.Helper()
	for _, k := range keys {
		switch k {
		case "Enter", "Escape", "BSpace", "Up", "Down", "PageUp", "PageDown", "Home", "End":
			term.Tmux("send-keys", "-t", "top", k)
		default:
			term.Tmux("send-keys", "-t", "top", "-l", k)
		}
	}
}

// Format expands a tmux format (#{pane_dead}, #{alternate_on}, ...) for the window.
func (term *Terminal) Format(f string) string {
	return strings.TrimSpace(term.Tmux("display-message", "-p", "-t", "top", f))
}
