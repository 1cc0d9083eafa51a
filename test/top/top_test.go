//go:build e2e

// Package top drives the real binary's `top` in a real terminal, tmux, on the demo node and on a node file that
// changes between readings: it reads the screen with capture-pane and types with send-keys. It also checks that
// `top` and `ps --watch` print plain tables into a pipe.
package top

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/tmuxterm"
)

var binary string

func TestMain(m *testing.M) {
	if name, ok := os.LookupEnv(commEnv); ok {
		nameItself(name)
	}
	e2eutil.Main(m, &binary)
}

// wait is how long a screen, or a command's output, may take to show what a test waits for.
const wait = tmuxterm.Wait

// topInShell runs `top` with args the way a person does at a shell prompt: text before it, and after it its exit
// status and the terminal's modes, so that a test can see that the terminal was given back as it was.
func topInShell(args ...string) []string {
	script := `echo "before top"; "$0" top "$@"; echo "top exited $?"; stty -a; echo "modes shown"; read -r done`
	return append([]string{"sh", "-c", script, binary}, args...)
}

// pidColumn gives the PIDs of the process rows on screen, in order.
func pidColumn(lines []string) []string {
	var pids []string
	inTable := false
	for _, l := range lines {
		f := strings.Fields(l)
		switch {
		case len(f) > 2 && f[0] == "GPU" && f[1] == "PID":
			inTable = true
		case inTable && len(f) > 1 && f[0] != "…" && regexp.MustCompile(`^\d+$`).MatchString(f[1]):
			pids = append(pids, f[1])
		}
	}
	return pids
}

// quit presses q and checks that top exits with status 0 and leaves the terminal as it found it: the normal screen
// back with what was on it, the cursor shown, and the line discipline's cooked mode and echo on.
func quit(term *tmuxterm.Terminal) {
	term.T().Helper()
	term.Keys("q")
	restored(term)
}

// restored checks that top exited with status 0 and gave the terminal back as it found it.
func restored(term *tmuxterm.Terminal) {
	term.T().Helper()
	// The modes are checked once stty has printed all of them: "top exited" alone can be on screen before them.
	term.WaitForText("top exited ", "modes shown")
	screen := term.Screen()
	if !strings.Contains(screen, "top exited 0\n") {
		term.T().Errorf("top did not exit with status 0:\n%s", screen)
	}
	// What was on the screen is back (held-back log lines may follow it), and nothing of top's is left.
	if !strings.HasPrefix(screen, "before top\n") || strings.Contains(screen, "gpu-pod-exporter top ") || strings.Contains(screen, "q quit") {
		term.T().Errorf("the screen from before top is not back, or top's screen is left over:\n%s", screen)
	}
	if got := term.Format("#{alternate_on} #{cursor_flag} #{mouse_any_flag}"); got != "0 1 0" {
		term.T().Errorf("alternate screen, cursor shown, mouse = %q, want 0 1 0", got)
	}
	modes := strings.Fields(strings.ReplaceAll(screen, ";", " "))
	for _, mode := range []string{"icanon", "echo", "isig", "icrnl", "opost"} {
		if !contains(modes, mode) {
			term.T().Errorf("terminal mode %s is not restored (stty -a: %s)", mode, screen)
		}
	}
	term.Keys("Enter") // the shell reads a line, then ends
	testkit.WaitFor(term.T(), wait, "the shell to end", func() bool { return term.Format("#{pane_dead}") == "1" })
}

// cursorRow is the row the cursor is on: the process row drawn in reverse video (the headers are too), without
// its colours.
func cursorRow(term *tmuxterm.Terminal) string {
	sgr := regexp.MustCompile(`^(\x1b\[[0-9;]*m)+`)
	for _, l := range strings.Split(term.Tmux("capture-pane", "-p", "-e", "-t", "top"), "\n") {
		prefix := sgr.FindString(l)
		text := l[len(prefix):]
		if regexp.MustCompile(`[\[;]7m`).MatchString(prefix) && regexp.MustCompile(`^[0-9]`).MatchString(text) {
			return regexp.MustCompile(`\x1b\[[0-9;]*m`).ReplaceAllString(text, "")
		}
	}
	return ""
}

// hasRow reports whether a line of the screen has these words, whatever the blanks between them.
func hasRow(lines []string, row string) bool {
	want := strings.Join(strings.Fields(row), " ")
	for _, l := range lines {
		if strings.Join(strings.Fields(l), " ") == want {
			return true
		}
	}
	return false
}

// matchesLine reports whether a line of the screen matches a regular expression.
func matchesLine(lines []string, expr string) bool {
	re := regexp.MustCompile(expr)
	for _, l := range lines {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestTopOnTheDemoNode(t *testing.T) {
	term := tmuxterm.Start(t, 80, 24, topInShell("--demo")...)
	lines := term.WaitForText("gpu-pod-exporter top", "q quit")

	// 80 columns: nothing wrapped, so the title is still the first line and the key help the last.
	if !strings.HasPrefix(lines[0], "gpu-pod-exporter top ") || !strings.HasSuffix(lines[0], "8 GPUs  15 processes  (simulated)") {
		t.Errorf("title: %q", lines[0])
	}
	if len(lines) != 24 || lines[23] != "sort GPU: mem sm gpu · w group · / filter · ? help · q quit" {
		t.Errorf("last of %d lines: %q", len(lines), lines[len(lines)-1])
	}
	header := map[int]*regexp.Regexp{
		// index, name, utilization bar and value, memory bar and used/total, temperature, power, sharing, allocations
		0: regexp.MustCompile(`^  0 H100 80GB HBM3 [█░]{7}  71% [█░]{7} +39/80G 52°C  402W shared ×3  3 pods$`),
		1: regexp.MustCompile(`^  1 H100 80GB HBM3 .* 64% .* 21/80G 49°C  365W MPS ×3     3 pods$`),
		2: regexp.MustCompile(`^  2 H100 80GB HBM3 +- .* 29/80G 44°C  232W MIG ×3     3 pods$`),
		// GPUs 3, 4 and 6 have a health problem: marked.
		3: regexp.MustCompile(`^✗ 3 H100 80GB HBM3 .* 67% .* 31/80G 58°C  455W 1 workload none !$`),
		4: regexp.MustCompile(`^✗ 4 H100 80GB HBM3 `),
		5: regexp.MustCompile(`^  5 RTX 6000 Ada … .* 37% .* 14/48G 63°C  188W shared ×3  1 pod$`),
		6: regexp.MustCompile(`^✗ 6 H100 80GB HBM3 ░{7}   0% .* 1/80G 33°C   72W idle       1 pod ○$`),
		7: regexp.MustCompile(`^  7 H100 80GB HBM3 ░{7}   0% .* 1/80G 31°C   69W idle       1 pod ○$`),
	}
	for i, re := range header {
		if !re.MatchString(lines[2+i]) {
			t.Errorf("GPU %d line %q does not match %s", i, lines[2+i], re)
		}
	}
	// One line names the GPUs' problems, the one that needs a reset first, cut at the terminal's width; the
	// signals follow by severity.
	if !strings.HasPrefix(lines[10], "✗ GPU 6: needs GPU reset, row remap pending, XID 48, 63 · GPU 3: PCIe x8 of x16") {
		t.Errorf("health line: %q", lines[10])
	}
	if lines[11] != "! unrequested use: data-science/jupyter-bob-0/notebook on GPU 3" ||
		lines[12] != "○ idle allocation: ml-research/hparam-sweep-3/worker holds GPU 6" ||
		lines[13] != "○ idle allocation: search/rag-index-0/indexer holds GPU 7" {
		t.Errorf("allocation signals:\n%s", strings.Join(lines[11:14], "\n"))
	}
	// Rows: the demo's users, each process's age, and at 80 columns a long owner cut where it matters least: the
	// namespace, then the container, the pod's name last. The ages count on from the demo's start: those that
	// cannot change in the test's minute.
	if !matchesLine(lines, `^GPU +PID USER +PROCESS +MEMORY +SM +AGE OWNER$`) {
		t.Errorf("no process header with USER and AGE in\n%s", strings.Join(lines, "\n"))
	}
	for _, row := range []string{
		`0 +29876 alice +python +4\.0 GiB +3% +1d2h d…/notebook-alice-0/n…`,
		`0 +31412 marco +python3 +12\.0 GiB +22% +2h[34]m pod m…/llama-eval-0/eval`,
		`1 +2811 root +nvidia-… +512 MiB +- +13d g…/nvidia-device-plu…/m…`,
		`1 +40297 triton +triton_… +2\.0 GiB +4% +3d3h pod i…/triton-llm-0/tri…`,
	} {
		if !matchesLine(lines, `^`+row+` *$`) {
			t.Errorf("no row like %s in\n%s", row, strings.Join(lines, "\n"))
		}
	}
	if lines[22] != "… 8 more rows" {
		t.Errorf("the line under the rows: %q", lines[22])
	}

	// A cursor selects a row: shown in reverse video, it moves with ↓ and j, and the rows scroll to keep it on
	// the screen; End and Home go to the last row and back.
	if row := cursorRow(term); !strings.Contains(row, " 29876 ") {
		t.Errorf("the cursor is not on the first row: %q", row)
	}
	term.Keys("Down", "j")
	term.WaitFor("the cursor on the third row", func([]string) bool { return strings.Contains(cursorRow(term), " 31412 ") })
	term.Keys("j", "j", "j", "j", "j")
	lines = term.WaitForText("… 2 rows above")
	if row := cursorRow(term); !strings.Contains(row, " 45102 ") || !matchesLine(lines, `^2:1/0 +45102 li\.wei +python3 +18\.0 GiB +- +9h3[01]m`) {
		t.Errorf("seven rows down, the cursor on %q:\n%s", row, strings.Join(lines, "\n"))
	}
	term.Keys("End")
	lines = term.WaitForText("… 8 rows above")
	if pids := pidColumn(lines); len(pids) != 7 || pids[6] != "80412" || strings.Contains(strings.Join(lines, "\n"), "more rows") ||
		!strings.Contains(cursorRow(term), " 80412 ") {
		t.Errorf("at the end: %v\n%s", pids, strings.Join(lines, "\n"))
	}
	term.Keys("Home")
	term.WaitFor("the top of the rows", func(lines []string) bool { return lines[22] == "… 8 more rows" })

	// Enter looks at the process under the cursor: who owns it, its GPUs, what to type to look further; Esc goes
	// back.
	term.Keys("j", "Enter")
	lines = term.WaitForText("gpu-pod-exporter top: process 31337")
	for _, want := range []string{
		`^  process +python3 \(compute\), PID 31337$`, `^  user +priya$`, `^  GPU 0 +memory 22\.0 GiB, SM 41%  GPU-f5217cdd`,
		`^  pod +bert-finetune-7c9d8b6f4-x2kqp$`, `^  pod uid +7ddb3c42-a12c-313e-3625-f5c431a14770$`, `^  qos +`,
		`^  kubectl -n ml-training describe pod -- bert-finetune-7c9d8b6f4-x2kqp$`,
		`^  kubectl -n ml-training logs -c trainer -- bert-finetune-7c9d8b6f4-x2kqp$`,
		// The demo's processes are not this host's: their /proc is not read.
		`^Esc back · q quit$`,
	} {
		if !matchesLine(lines, want) {
			t.Errorf("the process's detail has no line like %s:\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if strings.Contains(strings.Join(lines, "\n"), "host ") {
		t.Errorf("a simulated process's /proc was read:\n%s", strings.Join(lines, "\n"))
	}
	term.Keys("Escape")
	term.WaitForText("… 8 more rows", "q quit")

	// ? shows the keys; any key goes back.
	term.Keys("?")
	term.WaitForText("gpu-pod-exporter top: keys", "PgUp PgDn  Home End", "AGE: how long the process has run.")
	term.Keys("x")
	term.WaitForText("… 8 more rows")
	// e lists every signal in full.
	term.Keys("e")
	term.WaitForText("gpu-pod-exporter top: signals and warnings", "✗ GPU 4: at power cap", "○ idle allocation: search/rag-index-0/indexer holds GPU 7")
	term.Keys("x")
	term.WaitForText("… 8 more rows")
	if colored := term.Tmux("capture-pane", "-p", "-e", "-t", "top"); !strings.Contains(colored, "\x1b[") {
		t.Error("the terminal shows no colours")
	}

	// Sort keys: memory, SM, back to GPU.
	for _, c := range []struct{ key, want string }{
		{"m", "[61001 51234 31337 45102]"},
		{"s", "[61001 51234 31337 40211]"},
		{"g", "[29876 31337 31412 2811]"},
	} {
		term.Keys(c.key)
		term.WaitFor("sorting by "+c.key, func(lines []string) bool {
			pids := pidColumn(lines)
			return len(pids) >= 4 && fmt.Sprint(pids[:4]) == c.want
		})
	}
	lines = term.WaitForText("sort GPU")

	// The filter finds any text of a row: a namespace, a user, a process name, an owner; a field with its prefix;
	// Escape clears it.
	term.Keys("/", "vision")
	term.WaitForText("/ filter (text, user: gpu: ns: node:): vision")
	term.Keys("Enter")
	lines = term.WaitForText("/ filter: vision")
	if pids := pidColumn(lines); fmt.Sprint(pids) != "[45102 45590 45377]" {
		t.Errorf("filtered by vision: %v", pids)
	}
	for _, c := range []struct{ filter, want string }{
		{"jdoe", "[61001]"},
		{"python", "[29876 31337 31412 40297 45102 45590]"}, // python, python3 and triton_python_b; the rest below
		{"user:triton gpu:1", "[40211 40297 40388]"},
		{"ns:data-science", "[29876 51234]"},
		{"88231", "[61001]"},
	} {
		// Escape, then a wait: a key that follows Escape at once is read as Alt and that key.
		term.Keys("/", "Escape")
		term.WaitForText("· / filter · ? help · q quit")
		term.Keys("/", c.filter, "Enter")
		lines = term.WaitForText("/ filter: " + c.filter)
		if pids := pidColumn(lines); len(pids) < len(strings.Fields(c.want)) || fmt.Sprint(pids[:len(strings.Fields(c.want))]) != c.want {
			t.Errorf("filtered by %s: %v, want %s\n%s", c.filter, pids, c.want, strings.Join(lines, "\n"))
		}
	}
	term.Keys("/", "Escape")
	term.WaitForText("· / filter · ? help · q quit")
	term.Keys("/", "slurm", "Enter")
	lines = term.WaitForText("/ filter: slurm")
	if pids := pidColumn(lines); fmt.Sprint(pids) != "[61001]" || !matchesLine(lines, `^4 +61001 jdoe +python +60\.0 GiB +93% +18h(0m)? slurm job 88231$`) {
		t.Errorf("filtered by owner: %v\n%s", pids, strings.Join(lines, "\n"))
	}
	term.Keys("/", "ollama", "Enter")
	lines = term.WaitForText("/ filter: slurmollama", "no process matches the filter")
	term.Keys("Escape")
	term.WaitFor("the filter to be cleared", func(lines []string) bool { return len(pidColumn(lines)) > 2 })
	term.WaitForText("· / filter · ? help · q quit")

	// A larger terminal gets every row and wider bars at once.
	term.Tmux("resize-window", "-t", "top", "-x", "120", "-y", "32")
	lines = term.WaitFor("the view to fill 120×32", func(lines []string) bool {
		return len(lines) == 32 && len(pidColumn(lines)) == 15 && strings.HasSuffix(lines[31], "q quit")
	})
	// A bar, or once there is history its sparkline of the last minutes.
	if !regexp.MustCompile(`^  0 H100 80GB HBM3 +[█░▁▂▃▄▅▆▇ ]{20,} +71% `).MatchString(lines[2]) {
		t.Errorf("GPU 0 at 120 columns: %q", lines[2])
	}

	// Group by workload, as gpu_workloads counts them: triton-llm-0's two processes of one container are one row,
	// with memory and SM summed (ΣSM).
	term.Keys("w")
	lines = term.WaitForText("w ungroup")
	if !matchesLine(lines, `^GPU +PROCS USER +PROCESS +MEMORY +ΣSM +AGE HISTORY +OWNER$`) ||
		!matchesLine(lines, `^0 +29876 alice +python +4\.0 GiB +3% +1d2h .* pod data-science/notebook-alice-0/notebook$`) ||
		!matchesLine(lines, `^1 +2 procs triton +tritonserver.* +11\.0 GiB +37% +3d3h .* pod inference/triton-llm-0/triton$`) {
		t.Errorf("grouped rows:\n%s", strings.Join(lines, "\n"))
	}

	quit(term)
}

// nodeFile is a simulated node: a pod with two containers and a Slurm job, allocated by a kubelet.
const nodeFile = `
gpus:
  - uuid: GPU-11111111-2222-3333-4444-555555555555
    name: NVIDIA A100-SXM4-80GB
    memory_total_bytes: 85899345920
    memory_used_bytes: 4294967296
    utilization_ratio: 0.42
    temperature_celsius: 41
    power_usage_watts: 310.5
    processes:
      - pid: 101
        name: trainer
        type: compute
        used_memory_bytes: 1073741824
        sm_utilization_ratio: 0.25
        identity: {namespace: team-a, pod: llm-0, container: trainer, pod_uid: 0b7e3d1c-0000-4000-8000-000000000001}
      - pid: 102
        name: loader
        type: compute
        used_memory_bytes: 3221225472
        sm_utilization_ratio: 0.05
        identity: {namespace: team-a, pod: llm-0, container: loader, pod_uid: 0b7e3d1c-0000-4000-8000-000000000001}
  - uuid: GPU-66666666-7777-8888-9999-000000000000
    name: NVIDIA A100-SXM4-80GB
    memory_total_bytes: 85899345920
    memory_used_bytes: 21474836480
    utilization_ratio: 0.9
    temperature_celsius: 60
    power_usage_watts: 390
    processes:
      - pid: 201
        name: sim
        type: compute
        used_memory_bytes: 21474836480
        sm_utilization_ratio: 0.88
        identity: {slurm_job_id: "4711"}
allocations:
  - {namespace: team-a, pod: llm-0, container: trainer, device_ids: ["GPU-11111111-2222-3333-4444-555555555555"]}
`

// A node file that changes between readings: top shows each new reading, its header values, its new pod and the
// allocation signal that pod raises, without a key being pressed.
func TestTopFollowsAChangingNode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	write(t, path, nodeFile)
	term := tmuxterm.Start(t, 80, 24, topInShell("--gpu.simulated-config="+path, "--interval=200ms")...)
	lines := term.WaitForText("2 GPUs  3 processes  (simulated)")
	// Two containers of one pod share GPU 0: two workloads, as gpu_workloads counts them, and one allocated pod.
	if !regexp.MustCompile(`^  0 A100-SXM4-80GB .* 42% .* 4/80G 41°C  310W shared ×2  1 pod$`).MatchString(lines[2]) {
		t.Errorf("GPU 0: %q", lines[2])
	}
	if !regexp.MustCompile(`^  1 A100-SXM4-80GB .* 90% .* 20/80G 60°C  390W 1 workload none$`).MatchString(lines[3]) {
		t.Errorf("GPU 1: %q", lines[3])
	}
	for _, row := range []string{
		"0       101 trainer   1.0 GiB  25% pod team-a/llm-0/trainer",
		"0       102 loader    3.0 GiB   5% pod team-a/llm-0/loader",
		"1       201 sim      20.0 GiB  88% slurm job 4711",
	} {
		if !hasRow(lines, row) {
			t.Errorf("no row %q in\n%s", row, strings.Join(lines, "\n"))
		}
	}

	// The node changes: GPU 0 gets busier and hotter, and a pod that requested no GPU starts on GPU 1.
	changed := strings.NewReplacer(
		"utilization_ratio: 0.42", "utilization_ratio: 0.97",
		"temperature_celsius: 41", "temperature_celsius: 77",
		"        identity: {slurm_job_id: \"4711\"}\n", `        identity: {slurm_job_id: "4711"}
      - pid: 202
        name: notebook
        type: compute
        used_memory_bytes: 2147483648
        sm_utilization_ratio: 0.5
        identity: {namespace: team-b, pod: sneaky-0, container: jupyter, pod_uid: 0b7e3d1c-0000-4000-8000-000000000002}
`).Replace(nodeFile)
	write(t, path, changed)
	lines = term.WaitForText("2 GPUs  4 processes", "! unrequested use: team-b/sneaky-0/jupyter on GPU 1")
	if !regexp.MustCompile(` 97% .* 77°C `).MatchString(lines[2]) || !strings.HasSuffix(lines[3], "shared ×2  none !") {
		t.Errorf("after the change:\n%s", strings.Join(lines, "\n"))
	}
	if !hasRow(lines, "1 202 notebook 2.0 GiB 50% pod team-b/sneaky-0/jupyter") {
		t.Errorf("no row for the new pod:\n%s", strings.Join(lines, "\n"))
	}

	// Grouped, a workload is a container of the pod, as gpu_workloads counts them: two rows for the pod's two.
	term.Keys("w", "m")
	lines = term.WaitForText("w ungroup", "sort memory")
	if !hasRow(lines, "0 102 loader 3.0 GiB 5% pod team-a/llm-0/loader") || !hasRow(lines, "0 101 trainer 1.0 GiB 25% pod team-a/llm-0/trainer") {
		t.Errorf("grouped by workload:\n%s", strings.Join(lines, "\n"))
	}
	quit(term)
}

// SIGTERM (a closed session, kill) ends top as q does: status 0, the terminal restored.
func TestTopStopsOnSIGTERM(t *testing.T) {
	term := tmuxterm.Start(t, 80, 24, topInShell("--demo")...)
	term.WaitForText("q quit")
	shell := term.Format("#{pane_pid}")
	children, err := os.ReadFile("/proc/" + shell + "/task/" + shell + "/children")
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(children), &pid); err != nil {
		t.Fatalf("the shell's child: %q: %v", children, err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	restored(term)
}

// A top that cannot start says why on the terminal, not into a view that never opens.
func TestTopThatCannotStartSaysWhy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	write(t, path, "gpus:\n  - colour: green\n")
	term := tmuxterm.Start(t, 80, 24, topInShell("--gpu.simulated-config="+path)...)
	term.WaitForText("gpu-pod-exporter: cannot read GPUs: simulated node file", `unknown key "colour"`, "top exited 1")
	term.Keys("Enter")
}

// Into a pipe, top prints plain tables every interval: no escapes, no bars, owners uncut.
func TestPipedTopPrintsPlainTables(t *testing.T) {
	out, err := exec.Command(binary, "top", "--demo", "--interval=100ms", "-n", "2").Output()
	if err != nil {
		t.Fatalf("top -n 2: %v\n%s", err, out)
	}
	tables := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n\n")
	if len(tables) != 2 || bytes.ContainsAny(out, "\x1b█") {
		t.Fatalf("want two plain tables:\n%q", out)
	}
	for _, table := range tables {
		lines := strings.Split(table, "\n")
		if !strings.HasPrefix(lines[0], "gpu-pod-exporter top ") || len(lines) != 1+1+8+1+3+1+15 { // title, header, GPUs, health, signals, header, processes
			t.Errorf("table of %d lines:\n%s", len(lines), table)
		}
		if !hasRow(lines, "1 2811 root nvidia-cuda-mps-server 512 MiB - 13d pod gpu-operator/nvidia-device-plugin-mps-control-daemon-x7k2p/mps-control-daemon") {
			t.Errorf("no uncut MPS daemon row in\n%s", table)
		}
	}

	// Without -n it goes on until stopped, and a stop is a normal exit.
	cmd := exec.Command(binary, "top", "--demo", "--interval=100ms", "--filter=inference")
	p := e2eutil.Start(t, cmd)
	testkit.WaitFor(t, wait, "three tables", func() bool { return strings.Count(p.Output(), "gpu-pod-exporter top ") >= 3 })
	cmd.Process.Signal(syscall.SIGTERM)
	testkit.WaitFor(t, wait, "top to stop", func() bool { done, _ := p.Exited(); return done })
	if _, err := p.Exited(); err != nil {
		t.Errorf("top stopped by SIGTERM: %v", err)
	}
	if strings.Contains(p.Output(), "ollama") || !strings.Contains(p.Output(), "pod inference/triton-llm-1/triton") {
		t.Errorf("--filter=inference:\n%s", p.Output())
	}
}

func TestPSFiltersAndWatch(t *testing.T) {
	out, err := exec.Command(binary, "ps", "--demo", "--namespace=vision", "--no-headers").Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "pod vision/resnet-train-5f6b9c-qw8zd/train") {
		t.Errorf("ps --namespace=vision --no-headers:\n%s", out)
	}
	out, err = exec.Command(binary, "ps", "--demo", "--owner=OLLAMA", "-o", "json").Output()
	if err != nil || !strings.Contains(string(out), `"systemd_unit": "ollama.service"`) || strings.Count(string(out), `"pid"`) != 1 {
		t.Errorf("ps --owner=OLLAMA -o json: %v\n%s", err, out)
	}

	cmd := exec.Command(binary, "ps", "--demo", "-w", "--interval=100ms", "--owner=slurm")
	p := e2eutil.Start(t, cmd)
	testkit.WaitFor(t, wait, "three tables", func() bool { return strings.Count(p.Output(), "slurm job 88231") >= 3 })
	cmd.Process.Signal(os.Interrupt)
	testkit.WaitFor(t, wait, "ps -w to stop", func() bool { done, _ := p.Exited(); return done })
	if _, err := p.Exited(); err != nil {
		t.Errorf("ps -w stopped by Ctrl-C: %v", err)
	}
	if tables := strings.Split(strings.TrimSpace(p.Output()), "\n\n"); len(tables) < 3 {
		t.Errorf("ps -w output:\n%s", p.Output())
	}

	// Into a pipe, stdout is the rows alone: the notes go to stderr, the health of GPU 6 among them.
	var stdout, stderr bytes.Buffer
	ps := exec.Command(binary, "ps", "--demo", "--gpu=6,4", "--sort=memory")
	ps.Stdout, ps.Stderr = &stdout, &stderr
	if err := ps.Run(); err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "GPU ") || !strings.HasPrefix(lines[1], "4 ") ||
		!strings.Contains(stderr.String(), "# GPU 6: needs GPU reset, row remap pending, XID 48, 63\n") {
		t.Errorf("ps --gpu=6,4: stdout\n%s\nstderr\n%s", stdout.String(), stderr.String())
	}
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
