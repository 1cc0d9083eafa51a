package procfs

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

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
	logs := &testkit.Logs{}
	WarnIfHidepid(dir, slog.New(logs))
	if n := logs.CountAtLeast(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings for a hidepid procfs, want 1", n)
	}
	logs = &testkit.Logs{}
	WarnIfHidepid(t.TempDir(), slog.New(logs))
	if n := logs.CountAtLeast(slog.LevelWarn); n != 0 {
		t.Errorf("%d warnings without a mountinfo, want 0", n)
	}
}
