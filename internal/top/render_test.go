package top

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"
	"github.com/muesli/termenv"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal/terminaltest"
)

// crowded is the reading with 40 more processes than fit on a small terminal.
func crowded() Reading {
	rd := node()
	d := &rd.Result.Snapshot.Devices[1]
	for i := range 40 {
		d.Processes = append(d.Processes, proc(uint32(1000+i), float64(i)*gib, gpu.Known(0.01)))
	}
	return rd
}

// colored renders with a true-colour profile, as a terminal would get, restoring the default afterwards.
func colored(t *testing.T) Styles {
	t.Helper()
	before := lipgloss.ColorProfile()
	lipgloss.SetColorProfile(termenv.TrueColor)
	t.Cleanup(func() { lipgloss.SetColorProfile(before) })
	return Colors()
}

func TestRenderFitsTheTerminal(t *testing.T) {
	st := colored(t)
	at := time.Date(2026, 11, 30, 23, 40, 1, 0, time.UTC)
	for _, size := range [][2]int{{80, 24}, {80, 50}, {60, 20}, {132, 43}, {200, 60}} {
		for _, v := range []View{{}, {Group: true}, {Filter: "ml", Sort: ByMemory}} {
			w, h := size[0], size[1]
			out := Render(Frame{Screen: Build(crowded(), v), View: v, Time: at, Width: w, Height: h, Interactive: true}, st)
			if !strings.Contains(out, "\x1b[") {
				t.Fatal("a true-colour frame has no colours")
			}
			lines := strings.Split(out, "\n")
			if len(lines) != h {
				t.Errorf("%dx%d %+v: %d lines", w, h, v, len(lines))
			}
			for i, l := range lines {
				if got := ansi.StringWidth(l); got > w {
					t.Errorf("%dx%d %+v: line %d is %d columns: %q", w, h, v, i, got, ansi.Strip(l))
				}
			}
			if !strings.HasSuffix(ansi.Strip(lines[h-1]), "q quit") {
				t.Errorf("%dx%d: the last line is not the key help: %q", w, h, ansi.Strip(lines[h-1]))
			}
		}
	}
}

func TestRenderAt80Columns(t *testing.T) {
	at := time.Date(2026, 11, 30, 23, 40, 1, 0, time.UTC)
	out := Render(Frame{Screen: Build(crowded(), View{}), Time: at, Width: 80, Height: 24, Interactive: true}, Styles{})
	lines := strings.Split(out, "\n")
	for _, want := range []string{
		"gpu-pod-exporter top  23:40:01  5 GPUs  48 processes  (simulated)",
		"GPU NAME           UTIL         MEMORY            TEMP POWER MODE       ALLOC",
	} {
		if !strings.Contains(out, want+"\n") && !strings.Contains(out, want+" ") {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	gpu0 := lines[2]
	for _, want := range []string{"  0 H100 80GB HBM3 ", "█████░░  71%", "40/80G", "52°C", " 402W", "shared ×43", "1 pod"} {
		if !strings.Contains(gpu0, want) {
			t.Errorf("GPU 0 line lacks %q: %q", want, gpu0)
		}
	}
	if !strings.Contains(lines[4], "1 pod !") || !strings.Contains(lines[6], "1 pod ○") {
		t.Errorf("GPU 2 and 4 lines do not mark their signals:\n%s\n%s", lines[4], lines[6])
	}
	if lines[7] != "! unrequested use: inference/triton-1/triton on GPU 2" ||
		lines[8] != "○ idle allocation: ml/sweep-3/worker holds GPU 4" ||
		lines[9] != "warning: GPU 3: processes: not supported" {
		t.Errorf("signal and warning lines:\n%s", strings.Join(lines[7:10], "\n"))
	}
	if !strings.HasPrefix(lines[10], "GPU   ") || !strings.Contains(lines[10], "MEMORY   SM OWNER") {
		t.Errorf("process header: %q", lines[10])
	}
	if !strings.HasPrefix(lines[11], "0          10 ollama") || !strings.HasSuffix(lines[11], "40% service ollama.service") {
		t.Errorf("first row: %q", lines[11])
	}
	if lines[22] != "… 37 more rows" {
		t.Errorf("the last row line says %q", lines[22])
	}
	if lines[23] != "sort GPU: mem sm gpu · w group · / filter · ? help · q quit" {
		t.Errorf("key help: %q", lines[23])
	}
}

func TestRenderWhileEditingTheFilter(t *testing.T) {
	v := View{Filter: "trit"}
	out := Render(Frame{Screen: Build(node(), v), View: v, Width: 80, Height: 24, Interactive: true, Editing: true}, Styles{})
	if !strings.HasSuffix(out, "/ filter by namespace or owner: trit█  enter apply · esc clear") {
		t.Errorf("prompt:\n%s", out)
	}
	v.Filter = "nothing-matches"
	out = Render(Frame{Screen: Build(node(), v), View: v, Width: 80, Height: 24, Interactive: true}, Styles{})
	if !strings.Contains(out, "\nno process matches the filter\n") || !strings.Contains(out, "/ filter: nothing-matches") {
		t.Errorf("empty filtered view:\n%s", out)
	}
}

// Plain output is for pipes and logs: no escapes, no bars, nothing cut, no trailing blanks.
func TestRenderPlain(t *testing.T) {
	rd := node()
	rd.Result.Owners[12] = pod("ml", "a-pod-name-much-longer-than-any-terminal-is-wide-"+strings.Repeat("x", 80), "trainer", "python3")
	out := Render(Frame{Screen: Build(rd, View{}), Time: time.Now()}, Styles{})
	if strings.ContainsAny(out, "\x1b█░") {
		t.Errorf("plain output has escapes or bars:\n%s", out)
	}
	if !strings.Contains(out, strings.Repeat("x", 80)+"/trainer\n") {
		t.Errorf("plain output cut an owner:\n%s", out)
	}
	for i, l := range strings.Split(out, "\n") {
		if strings.TrimRight(l, " ") != l {
			t.Errorf("line %d ends in blanks: %q", i, l)
		}
	}
	if strings.Contains(out, "q quit") {
		t.Error("plain output has key help")
	}
	if n := strings.Count(out, "\n") + 1; n != 1+1+5+2+1+1+8 {
		t.Errorf("%d lines, want title, GPU header, 5 GPUs, 2 signals, 1 warning, process header and 8 rows:\n%s", n, out)
	}
}

func TestShortenKeepsTheContainer(t *testing.T) {
	for _, c := range []struct {
		owner string
		width int
		want  string
	}{
		{"pod ml-training/bert-finetune-7c9d8b6f4-x2kqp/trainer", 37, "pod ml-training/bert-finetun…/trainer"},
		{"pod ml/a/b", 37, "pod ml/a/b"},
		{"pod ml/a-very-long-pod-name/a-very-long-container-name", 30, "pod ml/a-very-long-pod-name/a…"},
		{"service a-very-long-unit-name.service", 20, "service a-very-long…"},
	} {
		if got := shorten(c.owner, c.width); got != c.want || ansi.StringWidth(got) > c.width {
			t.Errorf("shorten(%q, %d) = %q, want %q", c.owner, c.width, got, c.want)
		}
	}
}

// One refresh of a busy node: lay out and draw 48 processes on an 80×24 terminal, in colour.
func BenchmarkBuildAndRender(b *testing.B) {
	rd := crowded()
	st := Colors()
	b.ReportAllocs()
	for b.Loop() {
		Render(Frame{Screen: Build(rd, View{Sort: ByMemory}), Width: 80, Height: 24, Interactive: true}, st)
	}
}

// setStrings sets every string in v, however deep in structs and slices, to text.
func setStrings(v reflect.Value, text string) {
	switch v.Kind() {
	case reflect.String:
		if v.CanSet() {
			v.SetString(text)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			setStrings(v.Field(i), text)
		}
	case reflect.Slice:
		for i := range v.Len() {
			setStrings(v.Index(i), text)
		}
	}
}

// Every text of a frame, from the node or typed, reaches the terminal escaped, however the frame is drawn; a field
// added to the screen later is covered without a change here. An escaped name is measured as the terminal shows it.
func TestRenderEscapesEveryText(t *testing.T) {
	st := colored(t)
	for _, a := range terminaltest.Attacks {
		t.Run(a.Name, func(t *testing.T) {
			for _, size := range []Frame{
				{Width: 0},
				{Width: 80, Height: 24, Interactive: true},
				{Width: 80, Height: 24, Interactive: true, Editing: true},
				{Width: 200, Height: 60, Interactive: true},
			} {
				// Every text set, even those the reading leaves empty: a signal of each kind, a warning.
				frame := func(text string) Frame {
					f := size
					f.Screen = Build(crowded(), View{})
					f.Screen.Signals = append(f.Screen.Signals, Signal{Kind: IdleAllocation}, Signal{Kind: Unrequested})
					f.Screen.Warnings = append(f.Screen.Warnings, "")
					setStrings(reflect.ValueOf(&f).Elem(), text)
					return f
				}
				f, benign := frame("x"+a.Text), frame("x")

				styles := Styles{}
				if f.Interactive {
					styles = st
				}
				out := Render(f, styles)
				terminaltest.Shown(t, out, f.Interactive)
				if !strings.Contains(ansi.Strip(out), "x"+a.Escaped) {
					t.Errorf("%dx%d: no %q in\n%s", f.Width, f.Height, "x"+a.Escaped, out)
				}
				if got, want := strings.Count(out, "\n"), strings.Count(Render(benign, styles), "\n"); got != want {
					t.Errorf("%dx%d: %d lines, %d with plain names:\n%s", f.Width, f.Height, got+1, want+1, out)
				}
				for i, l := range strings.Split(out, "\n") {
					if f.Width > 0 && ansi.StringWidth(l) > f.Width {
						t.Errorf("%dx%d: line %d is %d columns: %q", f.Width, f.Height, i, ansi.StringWidth(l), l)
					}
				}
			}
		})
	}
}

// A failed reading's error is shown in full, wrapped to the terminal's width: its end is often what to do.
func TestRenderShowsTheWholeError(t *testing.T) {
	err := "reading GPUs from nvidia-smi: nvidia-smi exited with status 18: Failed to initialize NVML: " +
		"Driver/library version mismatch (" + gpu.FixVersionMismatch + ")"
	out := Render(Frame{Screen: Build(node(), View{}), Err: err, Width: 60, Height: 40, Interactive: true}, Styles{})
	var shown []string
	for _, l := range strings.Split(out, "\n") {
		if ansi.StringWidth(l) > 60 {
			t.Errorf("line wider than the terminal: %q", l)
		}
		shown = append(shown, strings.TrimSpace(l))
	}
	if !strings.Contains(strings.Join(shown, " "), "reading failed: "+err) {
		t.Errorf("the error is not shown in full:\n%s", out)
	}
}

// USER shows when the processes' users are known, AGE when their start times are; a workload's row has its first
// user (+N others) and its oldest process's age.
func TestUserAndAgeColumns(t *testing.T) {
	at := time.Date(2026, 11, 30, 23, 40, 1, 0, time.UTC)
	render := func(rd Reading, v View) []string {
		out := Render(Frame{Screen: Build(rd, v), View: v, Time: at, Width: 100, Height: 40, Interactive: true}, Styles{})
		return strings.Split(out, "\n")
	}
	row := func(lines []string, prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return strings.Join(strings.Fields(l), " ")
			}
		}
		return ""
	}
	plain := render(node(), View{})
	if h := row(plain, "GPU   "); strings.Contains(h, "USER") || strings.Contains(h, "AGE") {
		t.Errorf("USER or AGE without users or start times: %q", h)
	}

	rd := node()
	for pid, o := range map[uint32]struct {
		user    string
		started time.Duration
	}{10: {"ollama", 50 * time.Hour}, 11: {"priya", 3*time.Hour + 20*time.Minute}, 12: {"marco", 45 * time.Second}, 20: {"", 12 * time.Minute}} {
		owner := rd.Result.Owners[pid]
		owner.Identity.User, owner.Started = o.user, at.Add(-o.started)
		rd.Result.Owners[pid] = owner
	}
	lines := render(rd, View{})
	if h := row(lines, "GPU   "); h != "GPU PID USER PROCESS MEMORY SM AGE OWNER" {
		t.Errorf("header: %q", h)
	}
	for prefix, want := range map[string]string{
		"0          10": "0 10 ollama ollama 1.0 GiB 40% 2d2h service ollama.service",
		"0          11": "0 11 priya python3 2.0 GiB 5% 3h20m pod ml/train-0/sidecar",
		"0          12": "0 12 marco python3 8.0 GiB 30% 45s pod ml/train-0/trainer",
		"1:1/0      20": "1:1/0 20 - python3 10.0 GiB - 12m pod vision/resnet/train",
		"2          32": "2 32 - - 1.0 GiB - - -",
	} {
		if got := row(lines, prefix); got != want {
			t.Errorf("row %q: %q, want %q", prefix, got, want)
		}
	}
	grouped := render(rd, View{Group: true})
	if got := row(grouped, "0    2 procs"); got != "0 2 procs priya +1 python3 10.0 GiB 35% 3h20m pod ml/train-0" {
		t.Errorf("grouped pod row: %q\n%s", got, strings.Join(grouped, "\n"))
	}
	for d, want := range map[time.Duration]string{
		59 * time.Second: "59s", 12*time.Minute + 5*time.Second: "12m", 3*time.Hour + 20*time.Minute: "3h20m",
		18 * time.Hour: "18h", 52*time.Hour + 30*time.Minute: "2d4h", 13 * 24 * time.Hour: "13d", -time.Second: "0s",
	} {
		if got := age(at.Add(-d), at); got != want {
			t.Errorf("age of %v: %q, want %q", d, got, want)
		}
	}
}

// The title counts as people do: "1 GPU", "1 process".
func TestTitleCounts(t *testing.T) {
	rd := node()
	rd.Result.Snapshot.Devices = rd.Result.Snapshot.Devices[2:3]
	rd.Result.Snapshot.Devices[0].Processes = rd.Result.Snapshot.Devices[0].Processes[:1]
	at := time.Date(2026, 11, 30, 23, 40, 1, 0, time.UTC)
	out := Render(Frame{Screen: Build(rd, View{}), Time: at}, Styles{})
	if first := strings.Split(out, "\n")[0]; first != "gpu-pod-exporter top  23:40:01  1 GPU  1 process  (simulated)" {
		t.Errorf("title: %q", first)
	}
}
