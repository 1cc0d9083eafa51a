package procfs

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
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

func TestIsProcFS(t *testing.T) {
	if ok, err := IsProcFS("/proc"); err != nil || !ok {
		t.Errorf("IsProcFS(/proc) = %v, %v; want true", ok, err)
	}
	if ok, err := IsProcFS(t.TempDir()); err != nil || ok {
		t.Errorf("IsProcFS(tempdir) = %v, %v; want false", ok, err)
	}
	if _, err := IsProcFS(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("IsProcFS(missing) gave no error")
	}
}

// fakeProc makes a procfs tree in a temporary directory with one process, 42, and returns its root and the
// process's directory.
func fakeProc(t *testing.T) (root, dir string) {
	t.Helper()
	root = t.TempDir()
	dir = filepath.Join(root, "42")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return root, dir
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReaderReadsProcFiles(t *testing.T) {
	root, dir := fakeProc(t)
	writeFile(t, filepath.Join(dir, "comm"), "python3\n")
	cg := "0::/kubepods.slice/" + strings.Repeat("x", 5000) + "\n" // beyond the Reader's first buffer
	writeFile(t, filepath.Join(dir, "cgroup"), cg)
	r := NewReader(root)
	if comm, err := r.Comm(42); err != nil || comm != "python3" {
		t.Errorf("Comm = %q, %v", comm, err)
	}
	if got, err := r.Cgroup(42); err != nil || got != cg {
		t.Errorf("Cgroup = %d bytes, %v; want %d bytes", len(got), err, len(cg))
	}
	if _, err := r.Comm(43); !Exited(err) {
		t.Errorf("Comm of a missing PID: %v, want an exit", err)
	}
}

// TestReaderRefusesWhatTheKernelNeverWrites: in a tree that is not the kernel's procfs, a comm, stat or cgroup file
// (read by path, or opened to be kept) that is a symlink (to a secret), a FIFO (that would block) or longer than the kernel writes is an error, and
// nothing of it is returned.
func TestReaderRefusesWhatTheKernelNeverWrites(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "shadow")
	writeFile(t, secret, "root:$y$j9T$secret:19000:0:99999:7:::\n")
	for _, tc := range []struct {
		name string
		make func(t *testing.T, path string)
		want string
	}{
		{"symlink", func(t *testing.T, path string) {
			if err := os.Symlink(secret, path); err != nil {
				t.Fatal(err)
			}
		}, "a symlink, not followed"},
		{"fifo", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"too long", func(t *testing.T, path string) {
			writeFile(t, path, strings.Repeat("a", maxProcFile+1))
		}, "larger than"},
	} {
		for _, file := range []string{"comm", "cgroup", "stat", "status", "stat kept open", "comm kept open"} {
			t.Run(tc.name+"/"+file, func(t *testing.T) {
				root, dir := fakeProc(t)
				tc.make(t, filepath.Join(dir, strings.TrimSuffix(file, " kept open")))
				r := NewReader(root)
				done := make(chan struct{})
				var got string
				var err error
				go func() {
					defer close(done)
					switch file {
					case "comm":
						got, err = r.Comm(42)
					case "stat":
						got, _, err = r.Stat(42)
					case "status":
						var b []byte
						b, err = r.Status(42)
						got = string(b)
					case "stat kept open":
						var f *KeptFile
						if f, err = r.OpenStat(42); err == nil {
							got, _, err = r.ReadStat(f)
							f.Close()
						}
					case "comm kept open":
						var f *KeptFile
						if f, err = r.OpenComm(42); err == nil {
							got, err = r.ReadComm(f)
							f.Close()
						}
					default:
						got, err = r.Cgroup(42)
					}
				}()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("read blocked")
				}
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("err = %v, want one saying %q", err, tc.want)
				}
				if got != "" || Exited(err) {
					t.Errorf("got %q, exited %v: want nothing, and not an exit", got, Exited(err))
				}
			})
		}
	}
}

// TestReaderCommBound: comm is read up to what the kernel writes (a workqueue worker's name formatted into 64
// bytes), and no further.
func TestReaderCommBound(t *testing.T) {
	root, dir := fakeProc(t)
	r := NewReader(root)
	atLimit := strings.Repeat("k", maxCommFile-1) + "\n"
	writeFile(t, filepath.Join(dir, "comm"), atLimit)
	if got, err := r.Comm(42); err != nil || got != atLimit[:maxCommFile-1] {
		t.Errorf("Comm of %d bytes = %q, %v", len(atLimit), got, err)
	}
	writeFile(t, filepath.Join(dir, "comm"), atLimit+"x")
	if got, err := r.Comm(42); err == nil || !strings.Contains(err.Error(), "larger than the 64 bytes") {
		t.Errorf("Comm of %d bytes = %q, %v; want an error", len(atLimit)+1, got, err)
	}
}

// TestReaderReadsTheRealProcFS: the kernel's own files pass the checks (regular files, within the bounds).
func TestReaderReadsTheRealProcFS(t *testing.T) {
	r := NewReader("/proc")
	pid := uint32(os.Getpid())
	if comm, err := r.Comm(pid); err != nil || comm == "" {
		t.Errorf("Comm(self) = %q, %v", comm, err)
	}
	if cg, err := r.Cgroup(pid); err != nil || !strings.Contains(cg, ":/") {
		t.Errorf("Cgroup(self) = %q, %v", cg, err)
	}
}

func TestParseStat(t *testing.T) {
	for line, want := range map[string]struct {
		comm  string
		start uint64
		ok    bool
	}{
		"42 (python3) S 1 42 42 0 -1 4194560 1 0 0 0 5 1 0 0 20 0 1 0 123456 1000 10 18446744073709551615 0 0\n": {"python3", 123456, true},
		// comm may hold spaces and parentheses: the fields count from the last ')'.
		"7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0\n": {"a) b (c)", 99, true},
		"7 () R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5":                {"", 5, true},
		"7 (short) R 1 7": {ok: false},
		"garbage":         {ok: false},
		"7 (x) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 notanumber 0 0": {ok: false},
	} {
		comm, start, ok := parseStat([]byte(line))
		if ok != want.ok || ok && (comm != want.comm || start != want.start) {
			t.Errorf("parseStat(%q) = %q, %d, %v; want %q, %d, %v", line, comm, start, ok, want.comm, want.start, want.ok)
		}
	}
}

// The real kernel's stat file of this process parses, and names it as comm does.
func TestStatOfSelf(t *testing.T) {
	pid := uint32(os.Getpid())
	r := NewReader("/proc")
	comm, err := r.Comm(pid)
	if err != nil {
		t.Skip("no /proc:", err)
	}
	name, start, err := r.Stat(pid)
	if err != nil {
		t.Fatal(err)
	}
	if name != comm || start == 0 {
		t.Errorf("Stat = %q, %d; comm %q", name, start, comm)
	}
}

// An open stat or comm file reads its process again and again, and fails once that process has exited and been
// reaped: a PID that the kernel gives to another process cannot be read through it.
func TestKeptFilesAreTiedToTheirProcess(t *testing.T) {
	if ok, err := IsProcFS("/proc"); err != nil || !ok {
		t.Skip("no procfs at /proc")
	}
	r := NewReader("/proc")
	for _, tc := range []struct {
		file string
		open func(uint32) (*KeptFile, error)
		read func(*KeptFile) (string, error)
	}{
		{"stat", r.OpenStat, func(f *KeptFile) (string, error) {
			comm, start, err := r.ReadStat(f)
			return fmt.Sprint(comm, " ", start), err
		}},
		{"comm", r.OpenComm, r.ReadComm},
	} {
		t.Run(tc.file, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Skip("cannot start sleep:", err)
			}
			f, err := tc.open(uint32(cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var first string
			for range 3 {
				got, err := tc.read(f)
				if err != nil || strings.Fields(got)[0] != "sleep" || first != "" && got != first {
					t.Fatalf("read %q, %v; first %q", got, err, first)
				}
				first = got
			}
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if _, err := tc.read(f); !Exited(err) {
				t.Errorf("after the process was reaped: %v, want an exited error", err)
			}
		})
	}
}
