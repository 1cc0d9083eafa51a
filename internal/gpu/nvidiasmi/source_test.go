package nvidiasmi

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/golden"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// fakeSMI is the fake nvidia-smi that TestMain builds from ./internal/fakesmi; empty when the build failed.
var fakeSMI string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	// Fuzzing and the parser tests do not need the fake; build it only when a Source test can run.
	if run := flag.Lookup("test.run").Value.String(); run == "" || strings.Contains(run, "Source") || strings.Contains(run, "New") {
		dir, err := os.MkdirTemp("", "fakesmi")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, "nvidia-smi")
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		}
		out, err := exec.Command(goTool, "build", "-o", bin, "./internal/fakesmi").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building the fake nvidia-smi: %v\n%s", err, out)
			return 1
		}
		fakeSMI = bin
	}
	return m.Run()
}

// fake configures the fake nvidia-smi through its environment and returns the files it records runs and PIDs in.
func fake(t *testing.T, mode string, env ...string) (runlog, pidfile string) {
	t.Helper()
	if fakeSMI == "" {
		t.Fatal("the fake nvidia-smi was not built")
	}
	dir := t.TempDir()
	runlog, pidfile = filepath.Join(dir, "runs"), filepath.Join(dir, "pids")
	t.Setenv("FAKESMI_MODE", mode)
	t.Setenv("FAKESMI_RUNLOG", runlog)
	t.Setenv("FAKESMI_PIDFILE", pidfile)
	for _, key := range []string{"FAKESMI_FILE", "FAKESMI_EXIT", "FAKESMI_STDERR", "FAKESMI_SLEEP", "FAKESMI_WAITFILE"} {
		t.Setenv(key, "")
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return runlog, pidfile
}

func newSource(t *testing.T, cfg Config) *Source {
	t.Helper()
	cfg.Path = fakeSMI
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// waitGone fails the test unless every PID the fake recorded exits.
func waitGone(t *testing.T, pidfile string) {
	t.Helper()
	pids := lines(t, pidfile)
	if len(pids) == 0 {
		t.Fatal("the fake recorded no PIDs")
	}
	testkit.WaitFor(t, 5*time.Second, "the fake's processes "+strings.Join(pids, ", ")+" to exit", func() bool {
		return !slices.ContainsFunc(pids, func(pid string) bool { return !testkit.Exited(pid) })
	})
}

func TestNewNotFound(t *testing.T) {
	_, err := New(Config{Path: "no-such-nvidia-smi-for-tests"})
	if !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("New with a name not in $PATH: %v, want exec.ErrNotFound", err)
	}
	_, err = New(Config{Path: filepath.Join(t.TempDir(), "nvidia-smi")})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("New with a missing path: %v, want fs.ErrNotExist", err)
	}
	if err == nil || !strings.Contains(err.Error(), "--nvidia-smi.path") {
		t.Errorf("error %q should say how to fix it", err)
	}
}

func TestSourceFile(t *testing.T) {
	fixture, err := filepath.Abs("testdata/telegraf__a100-sxm4-v12.xml")
	if err != nil {
		t.Fatal(err)
	}
	runlog, _ := fake(t, "file", "FAKESMI_FILE="+fixture)
	s := newSource(t, Config{Timeout: 10 * time.Second})
	if s.Name() != "nvidia-smi" {
		t.Errorf("Name() = %q", s.Name())
	}
	before := time.Now()
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Time.Before(before) || snap.Time.After(time.Now()) {
		t.Errorf("snapshot time %v not within the call", snap.Time)
	}
	golden.Check(t, "testdata/telegraf__a100-sxm4-v12.golden", render(snap))
	if n := len(lines(t, runlog)); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
}

// A run reuses the last run's output buffer: the snapshot it returned must hold none of it. The second output is
// the shorter, so that it is written over the first.
func TestSourceSnapshotOutlivesTheNextRun(t *testing.T) {
	first, err := filepath.Abs("testdata/500farm__4-geforce-rtx-3090.xml")
	if err != nil {
		t.Fatal(err)
	}
	second, err := filepath.Abs("testdata/telegraf__a100-sxm4-v12.xml")
	if err != nil {
		t.Fatal(err)
	}
	fake(t, "file", "FAKESMI_FILE="+first)
	s := newSource(t, Config{Timeout: 10 * time.Second})
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := render(snap)
	t.Setenv("FAKESMI_FILE", second)
	if _, err := s.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := render(snap); got != want {
		t.Errorf("the first snapshot changed with the second run:\n%s", got)
	}
}

func TestSourceFailures(t *testing.T) {
	// Only the cases that must time out get a short timeout: on a loaded machine, starting the fake alone can take
	// longer than that, and the others would then time out before failing the way they test.
	const stallTimeout = 500 * time.Millisecond
	for _, tc := range []struct {
		name, mode string
		env        []string
		maxOutput  int
		kind       string
		want       string
	}{
		{name: "exit", mode: "exit", env: []string{"FAKESMI_EXIT=9",
			"FAKESMI_STDERR=Failed to initialize NVML: Driver/library version mismatch\nsecond line"},
			kind: "exit", want: "nvidia-smi exited with status 9: Failed to initialize NVML: Driver/library version mismatch (" +
				gpu.FixVersionMismatch + ")"},
		{name: "garbage", mode: "garbage", kind: "parse", want: "parsing nvidia-smi output: "},
		{name: "stall", mode: "stall", env: []string{"FAKESMI_SLEEP=1h"}, kind: "timeout",
			want: "nvidia-smi timed out after 500ms"},
		{name: "child holds stdout and parent hangs", mode: "hang-child", kind: "timeout",
			want: "nvidia-smi timed out after 500ms"},
		{name: "endless output", mode: "flood", maxOutput: 1 << 20, kind: "output",
			want: "nvidia-smi printed more than 1048576 bytes"},
		// The default cap, not 64 MiB: a flooding nvidia-smi must not cost hundreds of MiB of memory.
		{name: "endless output, default cap", mode: "flood", kind: "output",
			want: "nvidia-smi printed more than 4194304 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			timeout := 30 * time.Second
			if tc.kind == "timeout" {
				timeout = stallTimeout
			}
			_, pidfile := fake(t, tc.mode, tc.env...)
			s := newSource(t, Config{Timeout: timeout, MaxOutputBytes: tc.maxOutput})
			start := time.Now()
			snap, err := s.Snapshot(context.Background())
			elapsed := time.Since(start)
			if err == nil {
				t.Fatalf("Snapshot returned %d devices, want an error", len(snap.Devices))
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error %q, want it to start with %q", err, tc.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.Kind != tc.kind {
				t.Errorf("error %#v, want an *Error of kind %q", err, tc.kind)
			}
			// Slack for a loaded CI machine; what matters is that nothing waits for the fake's hour-long sleep.
			if limit := timeout + waitDelay + 3*time.Second; elapsed > limit {
				t.Errorf("Snapshot took %v, want under %v", elapsed, limit)
			}
			waitGone(t, pidfile)
		})
	}
}

// TestSourceOrphanHoldsStdout: nvidia-smi exits after printing, but something it started keeps stdout open. The
// output is complete and is used; the straggler is killed and the call returns after WaitDelay, not when it ends.
func TestSourceOrphanHoldsStdout(t *testing.T) {
	fixture, err := filepath.Abs("testdata/telegraf__tesla-t4.xml")
	if err != nil {
		t.Fatal(err)
	}
	_, pidfile := fake(t, "orphan", "FAKESMI_FILE="+fixture)
	s := newSource(t, Config{Timeout: 20 * time.Second})
	start := time.Now()
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed > waitDelay+5*time.Second {
		t.Errorf("Snapshot took %v", elapsed)
	}
	if len(snap.Devices) != 1 || snap.Devices[0].UUID != "GPU-d37e67a5-91dd-3774-a5cb-99096249601a" {
		t.Errorf("unexpected snapshot:\n%s", render(snap))
	}
	if n := len(lines(t, pidfile)); n != 2 {
		t.Fatalf("fake recorded %d PIDs, want itself and its child", n)
	}
	waitGone(t, pidfile)
}

// waitForRun blocks until the fake has started n runs.
func waitForRun(t *testing.T, runlog string, runs int) {
	t.Helper()
	testkit.WaitFor(t, 20*time.Second, fmt.Sprintf("%d runs of the fake", runs), func() bool { return len(lines(t, runlog)) == runs })
}

// TestSourceCallerGivesUp: a caller whose context ends gets its answer at once, and the run it started is killed
// with its process group rather than left to the run's timeout.
func TestSourceCallerGivesUp(t *testing.T) {
	fixture, err := filepath.Abs("testdata/telegraf__tesla-t4.xml")
	if err != nil {
		t.Fatal(err)
	}
	release := filepath.Join(t.TempDir(), "release")
	runlog, pidfile := fake(t, "stall", "FAKESMI_FILE="+fixture, "FAKESMI_WAITFILE="+release)
	s := newSource(t, Config{Timeout: time.Minute})

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Snapshot(ctx)
		errc <- err
	}()
	waitForRun(t, runlog, 1)
	start := time.Now()
	cancel()
	err = <-errc
	var smiErr *Error
	if !errors.Is(err, context.Canceled) || !errors.As(err, &smiErr) || smiErr.Kind != "timeout" {
		t.Errorf("Snapshot with a cancelled context: %v, want a timeout wrapping context.Canceled", err)
	}
	if elapsed := time.Since(start); elapsed > waitDelay+3*time.Second {
		t.Errorf("Snapshot returned %v after its context ended", elapsed)
	}
	waitGone(t, pidfile)
}

func TestSourceCloseStopsRun(t *testing.T) {
	runlog, pidfile := fake(t, "hang-child")
	s := newSource(t, Config{Timeout: time.Minute})
	errc := make(chan error, 1)
	go func() {
		_, err := s.Snapshot(context.Background())
		errc <- err
	}()
	waitForRun(t, runlog, 1)
	// The fake records its child after starting it; wait for both so that both are checked below.
	testkit.WaitFor(t, 10*time.Second, "the fake to start its child", func() bool { return len(lines(t, pidfile)) >= 2 })
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed > waitDelay+3*time.Second {
		t.Errorf("Close took %v", elapsed)
	}
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "source closed") {
		t.Errorf("Snapshot during Close: %v", err)
	}
	waitGone(t, pidfile)
	if _, err := s.Snapshot(context.Background()); err == nil {
		t.Error("Snapshot after Close succeeded")
	}
}

func TestLimitedBuffer(t *testing.T) {
	calls := 0
	b := &limitedBuffer{limit: 4, onOverflow: func() { calls++ }}
	for _, s := range []string{"ab", "cde", "fgh"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got := string(b.Bytes()); got != "abcd" || !b.overflow || calls != 1 {
		t.Errorf("buffer %q overflow %t calls %d", got, b.overflow, calls)
	}
	if got := firstLine([]byte("\n  \nfirst\nsecond")); got != "first" {
		t.Errorf("firstLine = %q", got)
	}
}

// TestSourceDefaultCapHoldsRealOutput: the default output cap is sized to real outputs (one GPU prints about 45 KB),
// so a node with twice 16 GPUs of a real card's output, 32 GPUs, is read in full under it.
func TestSourceDefaultCapHoldsRealOutput(t *testing.T) {
	b, err := os.ReadFile("testdata/500farm__4-geforce-rtx-3090.xml")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	first, last := strings.Index(doc, "<gpu id="), strings.LastIndex(doc, "</gpu>")+len("</gpu>")
	if first < 0 || last < first {
		t.Fatal("fixture has no <gpu> elements")
	}
	const copies = 8 // 4 GPUs each
	gpus := strings.Repeat(doc[first:last]+"\n", copies)
	doc = strings.Replace(doc[:first], "<attached_gpus>4</attached_gpus>", "<attached_gpus>32</attached_gpus>", 1) +
		gpus + doc[last:]
	if len(doc) > DefaultMaxOutputBytes/2 {
		t.Fatalf("32 GPUs print %d bytes: want the default cap (%d) to hold them twice", len(doc), DefaultMaxOutputBytes)
	}
	path := filepath.Join(t.TempDir(), "32gpus.xml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	fake(t, "file", "FAKESMI_FILE="+path)
	snap, err := newSource(t, Config{Timeout: 20 * time.Second}).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Devices) != 32 {
		t.Errorf("read %d devices, want 32", len(snap.Devices))
	}
}
