package procfs

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// warnings counts the warnings logged.
type warnings struct{ n atomic.Int32 }

func (w *warnings) Enabled(_ context.Context, lvl slog.Level) bool { return lvl >= slog.LevelWarn }
func (w *warnings) Handle(context.Context, slog.Record) error      { w.n.Add(1); return nil }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler             { return w }
func (w *warnings) WithGroup(string) slog.Handler                  { return w }

func TestHidepid(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, mountinfo, want string
	}{
		{"plain", "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n", ""},
		{"hidepid=2 in super options", "22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw,hidepid=2\n", "hidepid=2"},
		{"hidepid=invisible per mount", "22 1 0:21 / /proc rw,nosuid,hidepid=invisible - proc proc rw\n", "hidepid=invisible"},
		{"hidepid=0", "22 1 0:21 / /proc rw - proc proc rw,hidepid=0\n", ""},
		{"another mount point", "22 1 0:21 / /host/proc rw - proc proc rw,hidepid=2\n", ""},
		{"not proc", "22 1 0:21 / /proc rw - tmpfs tmpfs rw,hidepid=2\n", ""},
		{"the last mount wins", "22 1 0:21 / /proc rw - proc proc rw,hidepid=2\n40 22 0:30 / /proc rw - proc proc rw\n", ""},
		{"escaped path", "22 1 0:21 / /my\\040proc rw - proc proc rw,hidepid=1\n", "hidepid=1"},
	} {
		mp := "/proc"
		if tc.name == "escaped path" {
			mp = "/my proc"
		}
		if got := hidepid(tc.mountinfo, mp); got != tc.want {
			t.Errorf("%s: hidepid = %q, want %q", tc.name, got, tc.want)
		}
	}

	// WarnIfHidepid reads <procfs>/self/mountinfo and warns once when the mount at procfs hides processes.
	if err := os.MkdirAll(filepath.Join(dir, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	line := "22 1 0:21 / " + dir + " rw,nosuid - proc proc rw,hidepid=2\n"
	if err := os.WriteFile(filepath.Join(dir, "self", "mountinfo"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &warnings{}
	WarnIfHidepid(dir, slog.New(logs))
	if n := logs.n.Load(); n != 1 {
		t.Errorf("%d warnings for a hidepid procfs, want 1", n)
	}
	logs = &warnings{}
	WarnIfHidepid(t.TempDir(), slog.New(logs))
	if n := logs.n.Load(); n != 0 {
		t.Errorf("%d warnings without a mountinfo, want 0", n)
	}
}
