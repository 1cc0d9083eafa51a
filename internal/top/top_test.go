package top

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/ansi"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal/terminaltest"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

type presetUsers struct{}

func (presetUsers) User(uint32) (string, error) { return "", errors.New("not on this host") }

// demo is the demo node's reading, as top --demo reads it.
func demo(t *testing.T) *view.Reading {
	t.Helper()
	src := simulated.Demo()
	snap, err := src.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	a := attribution.New(attribution.Config{Preset: src, Users: presetUsers{}})
	r := &reading.Reading{Snapshot: snap, Owners: a.Attribute(t.Context(), snap)}
	allocs, _ := src.Allocations()
	v := view.FromNode(r, allocation.Join(allocs, r))
	v.Time = snap.Time
	return v
}

func frame(r *view.Reading, o Options, w, h int) Frame {
	return Frame{Screen: Build(r, o), Options: o, Time: r.Time, Width: w, Height: h, Interactive: true, Cursor: 0}
}

// At every size, a frame is the terminal's height of lines no wider than it, with the title, the table's header,
// at least one row and the key help; the GPUs and signals that do not fit say how many were cut.
func TestRenderFitsEverySize(t *testing.T) {
	r := demo(t)
	for _, w := range []int{60, 80, 120, 200} {
		for _, h := range []int{15, 24, 50} {
			for _, o := range []Options{{}, {Group: true}} {
				lines := strings.Split(Render(frame(r, o, w, h), Colors()), "\n")
				plain := strings.Split(ansi.Strip(strings.Join(lines, "\n")), "\n")
				what := fmt.Sprintf("%dx%d group=%v", w, h, o.Group)
				if len(lines) != h {
					t.Errorf("%s: %d lines", what, len(lines))
				}
				for i, l := range lines {
					if ansi.StringWidth(l) > w {
						t.Errorf("%s: line %d is %d wide: %q", what, i, ansi.StringWidth(l), plain[i])
					}
				}
				header := -1
				for i, l := range plain {
					if regexp.MustCompile(`^GPU +(PID|PROCS) `).MatchString(l) {
						header = i
					}
				}
				if !strings.HasPrefix(plain[0], "gpu-pod-exporter top ") || header < 0 || header+1 >= h-1 ||
					!regexp.MustCompile(`^\d`).MatchString(plain[header+1]) || !strings.Contains(plain[h-1], "quit") {
					t.Errorf("%s: no title, table header, row or key help:\n%s", what, strings.Join(plain, "\n"))
				}
			}
		}
	}
	// 50 lines hold everything: all 8 GPUs, all 6 signals on their lines, all 15 rows.
	plain := ansi.Strip(Render(frame(r, Options{}, 120, 50), Colors()))
	if strings.Contains(plain, "more") || strings.Count(plain, "\n○ idle allocation") != 2 || !strings.Contains(plain, "\n  7 H100") {
		t.Errorf("120x50 cuts something:\n%s", plain)
	}
	// 15 lines: the GPUs are cut, with a line that says so.
	plain = ansi.Strip(Render(frame(r, Options{}, 80, 15), Colors()))
	if !regexp.MustCompile(`\n… \d more GPUs\n`).MatchString(plain) {
		t.Errorf("80x15 does not say the GPUs are cut:\n%s", plain)
	}
}

// A long owner is cut where it matters least: the namespace first, then the container, then the pod's name, so
// that the pod the person came for is the last to go; one name is cut at its end.
func TestOwnerFits(t *testing.T) {
	pod := view.Owner{Kind: view.KindPod, Names: []string{"ml-training", "bert-finetune-7c9d8b6f4-x2kqp", "trainer"}}
	for width, want := range map[int]string{
		60: "pod ml-training/bert-finetune-7c9d8b6f4-x2kqp/trainer",
		46: "pod ml-…/bert-finetune-7c9d8b6f4-x2kqp/trainer",
		42: "pod m…/bert-finetune-7c9d8b6f4-x2kqp/trai…",
		38: "m…/bert-finetune-7c9d8b6f4-x2kqp/t…",
		30: "m…/bert-finetune-7c9d8b6f4…/t…",
		8:  "m…/b…/t…",
	} {
		got := fitOwner(pod, width)
		if got != want || ansi.StringWidth(got) > width {
			t.Errorf("%d columns: %q, want %q", width, got, want)
		}
	}
	// Every kind of owner keeps its name before its kind's word.
	for _, o := range []view.Owner{{Kind: view.KindSlurmJob, Names: []string{"88231"}}, {Kind: view.KindService, Names: []string{"ollama.service"}},
		{Kind: view.KindContainer, Names: []string{"stable-diffusion-webui"}}} {
		name := o.Names[0]
		if got := fitOwner(o, len(name)); got != name {
			t.Errorf("%s in %d columns: %q", o, len(name), got)
		}
	}
	// At 80 columns, the demo's long pods keep their names' start.
	plain := ansi.Strip(Render(frame(demo(t), Options{}, 80, 50), Colors()))
	for _, want := range []string{" m…/bert-finetune-7c9…/t…", " pod i…/triton-llm-0/tri…", " pod d…/jupyter-bob-0/no…",
		" service ollama.service\n", " stable-diffusion-webui\n"} {
		if !strings.Contains(plain, want) {
			t.Errorf("80 columns: no %q in\n%s", want, plain)
		}
	}
}

// The grouped view sums a workload's memory and SM over its processes and GPUs: memory of an 8-GPU pod fits its
// column, and the summed SM is headed ΣSM, which the help explains.
func TestGroupedSums(t *testing.T) {
	r := &view.Reading{Time: time.Unix(1_800_000_000, 0)}
	for g := range 8 {
		r.GPUs = append(r.GPUs, view.GPU{Index: g, UUID: fmt.Sprint("GPU-", g), ProcessesListed: true, Workloads: 1})
		r.Processes = append(r.Processes, view.Process{GPU: g, UUID: fmt.Sprint("GPU-", g), PID: uint32(100 + g), Name: "python3",
			Memory: gpu.Known(72.6 * (1 << 30)), SM: gpu.Known(0.95),
			Identity: attribution.Identity{Namespace: "ml-training", Pod: "llama-70b-0", Container: "trainer", PodUID: "u"}})
	}
	plain := ansi.Strip(Render(frame(r, Options{Group: true}, 80, 24), Colors()))
	if !regexp.MustCompile(`\nGPU +PROCS PROCESS +MEMORY +ΣSM OWNER`).MatchString(plain) ||
		!regexp.MustCompile(`\n8 GPUs +8 procs python3 +581 GiB +760% pod ml-training/llama-70b-0/trainer`).MatchString(plain) {
		t.Errorf("grouped:\n%s", plain)
	}
	help := ansi.Strip(Render(Frame{Screen: Build(r, Options{}), Width: 100, Height: 40, Interactive: true, Help: true}, Colors()))
	if !strings.Contains(help, "ΣSM (w): SM utilization summed over the workload's processes and GPUs") ||
		!strings.Contains(help, "760% is 7.6 GPUs' worth") {
		t.Errorf("help:\n%s", help)
	}
}

// Many warnings are one line that counts them, so that the table keeps its room; e shows them all.
func TestWarningsAreOneLine(t *testing.T) {
	r := demo(t)
	for i := range 30 {
		r.Warnings = append(r.Warnings, fmt.Sprintf("Prometheus warning: partial response: store 10.0.0.%d:10901 unavailable", i))
	}
	f := frame(r, Options{}, 100, 40)
	plain := ansi.Strip(Render(f, Colors()))
	if strings.Count(plain, "10901") != 1 || !strings.Contains(plain, "\n30 warnings (e shows them): Prometheus warning: partial response: store 10.0.0.0:10901") {
		t.Errorf("warnings:\n%s", plain)
	}
	if !strings.HasPrefix(plain, "gpu-pod-exporter top ") || !strings.Contains(plain, "\nGPU        PID ") {
		t.Errorf("the title or the table is gone:\n%s", plain)
	}
	f.Notes, f.Height = true, 50
	plain = ansi.Strip(Render(f, Colors()))
	if strings.Count(plain, "10901 unavailable") != 30 || !strings.Contains(plain, "✗ GPU 6: needs GPU reset") {
		t.Errorf("e does not show the signals and warnings:\n%s", plain)
	}
}

// keys sends keys to a program model as a terminal does.
func keys(m *model, ks ...string) {
	for _, k := range ks {
		var msg tea.KeyMsg
		switch k {
		case "down", "up", "enter", "esc", "end", "home", "pgdown", "pgup":
			msg = tea.KeyMsg{Type: map[string]tea.KeyType{"down": tea.KeyDown, "up": tea.KeyUp, "enter": tea.KeyEnter,
				"esc": tea.KeyEsc, "end": tea.KeyEnd, "home": tea.KeyHome, "pgdown": tea.KeyPgDown, "pgup": tea.KeyPgUp}[k]}
		default:
			msg = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
		}
		m.Update(msg)
	}
}

func program(t *testing.T, r *view.Reading, host func(uint32, time.Time) view.Host, w, h int) *model {
	m := newModel(context.Background(), Config{Host: host, Read: func(context.Context, Options) (*view.Reading, error) { return r, nil }})
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	m.Update(readingMsg{rd: r, at: r.Time})
	return m
}

// The cursor selects a row and stays on it while the rows move; Enter shows the process: its identity, age, GPUs,
// host CPU and memory from /proc, and the lines that look further; Esc goes back.
func TestCursorAndDetail(t *testing.T) {
	r := demo(t)
	var asked uint32
	var askedStarted time.Time
	host := func(pid uint32, started time.Time) view.Host {
		asked, askedStarted = pid, started
		return view.Host{CPU: 90 * time.Minute, RSS: gpu.Known(3.2 * (1 << 30)), Cgroup: "/kubepods/burstable/pod7ddb/249e"}
	}
	m := program(t, r, host, 100, 30)
	keys(m, "j", "down")
	if m.cursor != 2 || m.screen.Rows[2].PID != "31412" {
		t.Fatalf("cursor at %d", m.cursor)
	}
	keys(m, "m") // by memory: the row moves, the cursor stays on it
	if m.screen.Rows[m.cursor].PID != "31412" {
		t.Errorf("after sorting the cursor is on %s", m.screen.Rows[m.cursor].PID)
	}
	keys(m, "enter")
	plain := ansi.Strip(Render(m.frame(), Colors()))
	for _, want := range []string{
		"gpu-pod-exporter top: process 31412", "process      python3 (compute), PID 31412", "running      2h", "user         marco",
		"GPU 0        memory 12.0 GiB, SM 22%", "host         CPU 1h30m, resident memory 3.2 GiB", "namespace    ml-research",
		"pod          llama-eval-0", "container    eval", "cgroup       /kubepods/burstable/pod7ddb/249e",
		"kubectl -n ml-research describe pod -- llama-eval-0", "kubectl -n ml-research logs -c eval -- llama-eval-0", "Esc back",
	} {
		if !strings.Contains(plain, want) {
			t.Errorf("detail lacks %q:\n%s", want, plain)
		}
	}
	if p := m.detail.GPUs[0]; asked != 31412 || askedStarted.IsZero() || !askedStarted.Equal(p.Started) {
		t.Errorf("/proc read for PID %d started %v; want 31412 started %v", asked, askedStarted, p.Started)
	}
	keys(m, "esc")
	if m.detail != nil || !strings.Contains(ansi.Strip(Render(m.frame(), Colors())), "q quit") {
		t.Error("Esc does not go back")
	}
	// A cluster's process is on another machine: no /proc of this one.
	c := &view.Reading{Time: r.Time, Cluster: true, Processes: []view.Process{{Node: "gpu-a", PID: 7, Name: "vllm"}}, Nodes: []view.Node{{Name: "gpu-a"}}}
	asked = 0
	m = program(t, c, host, 100, 30)
	keys(m, "enter")
	plain = ansi.Strip(Render(m.frame(), Colors()))
	if asked != 0 || !strings.Contains(plain, "host         not read here: /proc is gpu-a's") {
		t.Errorf("a cluster's process (asked %d):\n%s", asked, plain)
	}
}

// A process that has exited since the reading, its PID gone or now another's, shows as exited: no numbers of a
// stranger's, no cgroup.
func TestDetailOfAnExitedProcess(t *testing.T) {
	r := demo(t)
	m := program(t, r, func(uint32, time.Time) view.Host { return view.Host{Exited: true} }, 100, 30)
	keys(m, "enter")
	plain := ansi.Strip(Render(m.frame(), Colors()))
	if !strings.Contains(plain, "host         process exited\n") || strings.Contains(plain, "cgroup ") || strings.Contains(plain, "CPU ") {
		t.Errorf("detail of an exited process:\n%s", plain)
	}
}

// A GPU's history draws its bar as a sparkline of the last minutes; a workload's, a column on a wide terminal.
func TestSparklines(t *testing.T) {
	if s, ok := sparkline([]float64{math.NaN(), 0, 0.5, 1}, 4, 1); !ok || s != " ▁▅█" {
		t.Errorf("sparkline %q %v", s, ok)
	}
	if _, ok := sparkline([]float64{math.NaN(), math.NaN(), math.NaN(), 0, 1}, 5, 1); ok {
		t.Error("two of five cells are not history enough")
	}
	if s, _ := sparkline([]float64{0, 0, 1, 1, 8, 8}, 3, 8); s != "▁▂█" {
		t.Errorf("scaled and bucketed: %q", s)
	}
	r := demo(t)
	rec := view.NewRecorder()
	for i := range 30 {
		r.Time = r.Time.Add(10 * time.Second)
		r.GPUs[0].Utilization = gpu.Known(float64(i) / 29)
		rec.Record(r)
	}
	plain := ansi.Strip(Render(frame(r, Options{}, 120, 40), Colors()))
	if !regexp.MustCompile(`\n  0 H100 80GB HBM3 +[ ▁▂▃▄▅▆▇█]*▁[▁▂▃▄▅▆▇█]*█ 100%`).MatchString(plain) {
		t.Errorf("GPU 0's bar is not its history:\n%s", plain)
	}
	plain = ansi.Strip(Render(frame(r, Options{Group: true}, 140, 40), Colors()))
	if !strings.Contains(plain, " HISTORY ") {
		t.Errorf("no workload history:\n%s", plain)
	}
}

// Every text from the node, or typed, is escaped before it is measured and cut: a row stays one line of the
// terminal's width.
func TestRenderEscapesEveryText(t *testing.T) {
	for _, a := range terminaltest.Attacks {
		r := &view.Reading{Time: time.Unix(1_800_000_000, 0), Cluster: true,
			Nodes: []view.Node{{Name: "gpu-" + a.Text}}, Warnings: []string{"driver said " + a.Text},
			GPUs: []view.GPU{{Node: "gpu-" + a.Text, Name: a.Text, Health: []string{"XID " + a.Text}, Severity: view.Fault}},
			Processes: []view.Process{{Node: "gpu-" + a.Text, PID: 1, Name: a.Text,
				Identity: attribution.Identity{Namespace: a.Text, Pod: a.Text, Container: a.Text, User: a.Text}}}}
		view.Summarize(r)
		for _, o := range []Options{{}, {Group: true}, {ByNode: true}, {Filter: a.Text}} {
			f := frame(r, o, 100, 30)
			f.Err = "reading failed " + a.Text
			out := Render(f, Colors())
			terminaltest.Shown(t, out, true)
			if got := len(strings.Split(out, "\n")); got != 30 {
				t.Errorf("%s: %d lines", a.Name, got)
			}
			f.Detail = &Detail{GPUs: r.Processes}
			terminaltest.Shown(t, Render(f, Colors()), true)
		}
	}
}

// A cluster's node with an unhealthy GPU is marked as the GPU is, and the health line names it with its node.
func TestClusterHealth(t *testing.T) {
	r := &view.Reading{Time: time.Unix(1_800_000_000, 0),
		Nodes: []view.Node{{Name: "gpu-a", AllocationsKnown: true}, {Name: "gpu-b"}, {Name: "gpu-c", State: view.NodeDown, LastSeen: true, Age: 40 * time.Second}},
		GPUs: []view.GPU{
			{Node: "gpu-a", Index: 0, Name: "H100", ProcessesListed: true},
			{Node: "gpu-b", Index: 6, Name: "H100", ProcessesListed: true, Health: []string{"needs GPU reset", "XID 48"}, Severity: view.Fault},
		}}
	r.Signals = append(r.Signals, view.AllocationSignal(view.IdleAllocation, "gpu-a", 0, false, 0, 0, "ml", "idle-0", "nb"))
	view.Summarize(r)
	plain := ansi.Strip(Render(frame(r, Options{}, 100, 30), Colors()))
	for _, want := range []string{
		`\n  gpu-a +1 +0 +- +- +1 +0 up\n`,
		`\n✗ gpu-b +1 +0 +- +- +- +- up · 1 GPU ✗\n`,
		`\n  gpu-c +- +- +- +- +- +- stale 40s \(down\)\n`,
		// By severity: the GPU that needs a reset, the stale node, the idle allocation.
		`\n✗ GPU 6 of gpu-b: needs GPU reset, XID 48\n× node gpu-c: stale: exporter down, last reading 40s ago\n○ idle allocation: ml/idle-0/nb holds GPU 0 of gpu-a\n`,
	} {
		if !regexp.MustCompile(want).MatchString(plain) {
			t.Errorf("no %s in\n%s", want, plain)
		}
	}
	plain = ansi.Strip(Render(frame(r, Options{ByNode: true}, 100, 30), Colors()))
	if !strings.Contains(plain, "\ngpu-b  1 GPU · 0 busy · 1 ✗ · up\n✗ 6 H100") {
		t.Errorf("by node:\n%s", plain)
	}
}

// A reading runs off the program's loop while keys change the options: it reads the options the loop gave it when
// it was asked for, never the model's (go test -race finds a reading of them while a key writes them).
func TestReadingTakesTheOptionsOfItsTime(t *testing.T) {
	r := demo(t)
	asked := make(chan Options, 2)
	m := newModel(context.Background(), Config{Read: func(_ context.Context, o Options) (*view.Reading, error) {
		asked <- o
		return r, nil
	}})
	m.Update(tea.WindowSizeMsg{Width: 100, Height: 30})
	keys(m, "/", "j", "d", "o", "e", "enter")
	done := make(chan tea.Msg)
	cmd := m.Init() // on the loop, as bubbletea calls it; the command runs on a goroutine of its own
	go func() { done <- cmd() }()
	keys(m, "/", "x", "y", "z", "enter", "w", "s") // while the reading runs
	m.Update(<-done)
	if o := <-asked; o.Filter != "jdoe" || o.Group {
		t.Errorf("the first reading read %+v, not the options when it was asked for", o)
	}
	// The next reading, after the tick, reads the options then.
	_, cmd = m.Update(tickMsg{})
	go func() { done <- cmd() }()
	m.Update(<-done)
	if o := <-asked; o.Filter != "jdoexyz" || !o.Group || o.Sort != view.BySM {
		t.Errorf("the reading after the keys read %+v", o)
	}
}
