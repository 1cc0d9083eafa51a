package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// Log lines pass through, except while top's view owns the terminal: then they wait, bounded, until it is restored.
func TestHeldLog(t *testing.T) {
	var out bytes.Buffer
	h := &heldLog{out: &out, limit: 10}
	fmt.Fprint(h, "before\n")
	h.hold()
	fmt.Fprint(h, "during 1\n")
	fmt.Fprint(h, "during 2\n")
	if out.String() != "before\n" {
		t.Errorf("held lines reached the terminal: %q", out.String())
	}
	h.release()
	fmt.Fprint(h, "after\n")
	if want := "before\nduring 1\nd(8 more bytes of log left out)\nafter\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
	if strings.Count(out.String(), "during") != 1 {
		t.Error("the limit was not kept")
	}
}

// A one-shot command's warnings carry the node's text (a runtime's error, a cgroup path): escaped, each stays one
// line that acts on nothing.
func TestHumanLogIsEscaped(t *testing.T) {
	var out bytes.Buffer
	logger := slog.New(&humanHandler{w: &out}).With("runtime", "containerd\x1b[8m")
	logger.Warn("cannot ask the runtime\u2028forged", "err", errors.New("rpc error: \x1b]0;pwned\x07\nforged"))
	want := `gpu-pod-exporter: warning: cannot ask the runtime\u2028forged (runtime containerd\x1b[8m, err rpc error: \x1b]0;pwned\a\nforged)` + "\n"
	if out.String() != want {
		t.Errorf("got  %q\nwant %q", out.String(), want)
	}
}

// The detail's /proc is read only for the process the reading saw: the same PID with the same start time. A PID
// gone, or given to another process since, is the process exited, never the other's numbers or cgroup.
func TestHostReaderTellsAReusedPID(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stat := "42 (python3) S 1 42 42 0 -1 4194560 1 0 0 0 500 120 0 0 20 0 1 0 123456 1000 2048 18446744073709551615 0 0\n"
	for name, text := range map[string]string{"stat": stat, "cgroup": "0::/kubepods/pod1/abc\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	boot := time.Unix(1_700_000_000, 0)
	host := hostReader(root, boot)
	h := host(42, procfs.Started(boot, 123456))
	if want := (view.Host{CPU: 6200 * time.Millisecond, RSS: gpu.Known(2048 * float64(os.Getpagesize())), Cgroup: "/kubepods/pod1/abc"}); h != want {
		t.Errorf("the process: %+v, want %+v", h, want)
	}
	for _, c := range []struct {
		what    string
		pid     uint32
		started time.Time
	}{
		{"a PID now another process's", 42, procfs.Started(boot, 123400)},
		{"a PID gone", 43, procfs.Started(boot, 123456)},
	} {
		if h := host(c.pid, c.started); h != (view.Host{Exited: true}) {
			t.Errorf("%s: %+v, want exited", c.what, h)
		}
	}
	if h := host(42, time.Time{}); h.Err == "" || h.RSS.Valid || h.Cgroup != "" || h.Exited {
		t.Errorf("a process whose start time is unknown: %+v, want nothing read and why", h)
	}
}

// On the kernel's procfs, this process is itself, by the boot time the attributor reads.
func TestHostReaderOfSelf(t *testing.T) {
	boot, err := procfs.BootTime("/proc")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	pid := uint32(os.Getpid())
	_, start, err := procfs.NewReader("/proc").Stat(pid)
	if err != nil {
		t.Fatal(err)
	}
	if h := hostReader("/proc", boot)(pid, procfs.Started(boot, start)); h.Exited || h.Err != "" || !h.RSS.Valid || h.RSS.V == 0 {
		t.Errorf("this process: %+v", h)
	}
}
