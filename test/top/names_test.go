//go:build e2e

package top

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unicode/utf8"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal/terminaltest"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/tmuxterm"
)

// commEnv makes the test binary a process that names itself, as any local user can, and waits to be killed.
const commEnv = "GPE_TEST_NAME_ITSELF"

// nameItself is the helper process: it writes its name to /proc/self/comm, says so, and waits.
func nameItself(name string) {
	if err := os.WriteFile("/proc/self/comm", []byte(name), 0); err != nil {
		fmt.Println("writing /proc/self/comm:", err)
		os.Exit(1)
	}
	fmt.Println("named")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	<-stop
	os.Exit(0)
}

// named starts a process that names itself name and returns its PID once it has.
func named(t *testing.T, name string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), commEnv+"="+name)
	p := e2eutil.Start(t, cmd)
	testkit.WaitFor(t, wait, "a process to name itself", func() bool { return strings.Contains(p.Output(), "named\n") })
	return p.Pid
}

// attackNode starts a process named after each attack, and one named "after" last, and writes a simulated node
// that lists them on its GPUs 0 and 1 with no preset identity: their names are read from procfs as a real GPU
// process's are. It returns the node file and the PIDs, "after"'s last.
func attackNode(t *testing.T) (path string, pids []int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("gpus:\n")
	for gpu, names := range [][]string{nil, {"after"}} {
		if gpu == 0 {
			for _, a := range terminaltest.Attacks {
				names = append(names, a.Text)
			}
		}
		fmt.Fprintf(&b, "  - uuid: GPU-%d1111111-2222-3333-4444-555555555555\n    name: NVIDIA A100-SXM4-80GB\n"+
			"    memory_total_bytes: 85899345920\n    processes:\n", gpu)
		for _, name := range names {
			pid := named(t, name)
			pids = append(pids, pid)
			fmt.Fprintf(&b, "      - {pid: %d, type: compute, used_memory_bytes: 1073741824}\n", pid)
		}
	}
	path = filepath.Join(t.TempDir(), "node.yaml")
	write(t, path, b.String())
	return path, pids
}

// shown is how a process named with an attack is shown: escaped, after attribution has made it valid UTF-8 (U+FFFD for a run
// of invalid bytes), as every label value is.
func shown(a terminaltest.Attack) string {
	if utf8.ValidString(a.Text) {
		return a.Escaped
	}
	return strings.ToValidUTF8(a.Text, "\uFFFD")
}

// A process that names itself with a terminal attack is one row of ps, its name escaped; the row after it shows;
// JSON keeps the name exact.
func TestPSEscapesProcessNames(t *testing.T) {
	node, pids := attackNode(t)
	out, err := exec.Command(binary, "ps", "--gpu.simulated-config="+node, "--no-headers").Output()
	if err != nil {
		t.Fatalf("ps: %v\n%s", err, out)
	}
	terminaltest.Shown(t, string(out), false)
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(pids) {
		t.Fatalf("%d lines for %d processes:\n%s", len(lines), len(pids), out)
	}
	for i, a := range terminaltest.Attacks {
		if want := fmt.Sprintf(`^0 +%d +%s  `, pids[i], regexp.QuoteMeta(shown(a))); !regexp.MustCompile(want).MatchString(lines[i]) {
			t.Errorf("%s: row %q, want it to match %s", a.Name, lines[i], want)
		}
	}
	if want := fmt.Sprintf(`^1 +%d +after  `, pids[len(pids)-1]); !regexp.MustCompile(want).MatchString(lines[len(pids)-1]) {
		t.Errorf("last row %q, want it to match %s", lines[len(pids)-1], want)
	}

	out, err = exec.Command(binary, "ps", "--gpu.simulated-config="+node, "-o", "json").Output()
	if err != nil {
		t.Fatalf("ps -o json: %v\n%s", err, out)
	}
	var rows []struct {
		PID  int    `json:"pid"`
		Name string `json:"process_name"`
	}
	if err := json.Unmarshal(out, &rows); err != nil || len(rows) != len(pids) {
		t.Fatalf("ps -o json: %d rows, %v\n%s", len(rows), err, out)
	}
	for i, a := range terminaltest.Attacks {
		if utf8.ValidString(a.Text) && rows[i].Name != a.Text {
			t.Errorf("%s: JSON process_name %q, want %q", a.Name, rows[i].Name, a.Text)
		}
	}
}

// The same processes in top on a real terminal: every name shows escaped on its own row, the row after the
// concealing name is not concealed, no forged row appears, and the window keeps its title.
func TestTopEscapesProcessNames(t *testing.T) {
	node, pids := attackNode(t)
	term := tmuxterm.Start(t, 160, 24, topInShell("--gpu.simulated-config="+node, "--interval=200ms")...)
	title := term.Format("#{pane_title}")
	lines := term.WaitForText("q quit", "after")

	if got := pidColumn(lines); len(got) != len(pids) {
		t.Errorf("%d process rows for %d processes:\n%s", len(got), len(pids), strings.Join(lines, "\n"))
	}
	for i, a := range terminaltest.Attacks {
		if !matchesLine(lines, fmt.Sprintf(`^0 +%d %s +1\.0 GiB `, pids[i], regexp.QuoteMeta(shown(a)))) {
			t.Errorf("%s: no row of PID %d showing %s in\n%s", a.Name, pids[i], shown(a), strings.Join(lines, "\n"))
		}
	}
	if matchesLine(lines, `^0 +1 +compute`) {
		t.Errorf("a forged row:\n%s", strings.Join(lines, "\n"))
	}
	if got := term.Format("#{pane_title}"); got != title {
		t.Errorf("the window title changed from %q to %q", title, got)
	}
	colored := term.Tmux("capture-pane", "-p", "-e", "-t", "top")
	for _, sgr := range regexp.MustCompile(`\x1b\[([0-9;:]*)m`).FindAllStringSubmatch(colored, -1) {
		if conceals(sgr[1]) {
			t.Errorf("the screen has concealed text (SGR %q):\n%q", sgr[1], colored)
			break
		}
	}
	quit(term)
}

// conceals reports whether an SGR sequence's parameters turn on concealed text (8), skipping the colour numbers
// of 38 and 48.
func conceals(params string) bool {
	p := strings.FieldsFunc(params, func(r rune) bool { return r == ';' || r == ':' })
	for i := 0; i < len(p); i++ {
		n, _ := strconv.Atoi(p[i])
		switch {
		case n == 8:
			return true
		case (n == 38 || n == 48 || n == 58) && i+1 < len(p):
			if p[i+1] == "5" {
				i += 2
			} else {
				i += 4
			}
		}
	}
	return false
}
