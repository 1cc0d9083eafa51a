package procfs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

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
						if f, err = NewKeptFiles(1).OpenStat(r, 42); err == nil {
							got, _, err = r.ReadStat(f)
							f.Close()
						}
					case "comm kept open":
						var f *KeptFile
						if f, err = NewKeptFiles(1).OpenComm(r, 42); err == nil {
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
