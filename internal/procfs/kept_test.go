package procfs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// An open stat or comm file reads its process again and again, and fails once that process has exited and been
// reaped: a PID that the kernel gives to another process cannot be read through it.
func TestKeptFilesAreTiedToTheirProcess(t *testing.T) {
	if ok, err := IsProcFS("/proc"); err != nil || !ok {
		t.Skip("no procfs at /proc")
	}
	r := NewReader("/proc")
	kept := NewKeptFiles(2)
	for _, tc := range []struct {
		file string
		open func(*Reader, uint32) (*KeptFile, error)
		read func(*KeptFile) (string, error)
	}{
		{"stat", kept.OpenStat, func(f *KeptFile) (string, error) {
			comm, start, err := r.ReadStat(f)
			return fmt.Sprint(comm, " ", start), err
		}},
		{"comm", kept.OpenComm, r.ReadComm},
	} {
		t.Run(tc.file, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Skip("cannot start sleep:", err)
			}
			f, err := tc.open(r, uint32(cmd.Process.Pid))
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

// Files are kept within the budget: past it an open says so without opening anything, and a file closed gives its
// place back; the self-metrics say how many are kept against how many may be.
func TestKeptFilesStayWithinTheirBudget(t *testing.T) {
	r := NewReader(t.TempDir())
	for pid := range uint32(3) {
		if err := os.MkdirAll(filepath.Join(r.root, fmt.Sprint(pid)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.root, fmt.Sprint(pid), "stat"), []byte("1 (x) S"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	kept := NewKeptFiles(2)
	a, errA := kept.OpenStat(r, 0)
	b, errB := kept.OpenStat(r, 1)
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if _, err := kept.OpenStat(r, 2); !errors.Is(err, ErrNoKeptRoom) {
		t.Errorf("a third open within a budget of 2: %v, want ErrNoKeptRoom", err)
	}
	want := func(open int) {
		t.Helper()
		w := fmt.Sprintf(`# HELP gpu_pod_exporter_attribution_kept_files %s
# TYPE gpu_pod_exporter_attribution_kept_files gauge
gpu_pod_exporter_attribution_kept_files %d
`, keptFilesHelp, open)
		if err := testutil.CollectAndCompare(kept, strings.NewReader(w), "gpu_pod_exporter_attribution_kept_files"); err != nil {
			t.Error(err)
		}
	}
	want(2)
	a.Close()
	if _, err := kept.OpenStat(r, 7); err == nil || errors.Is(err, ErrNoKeptRoom) {
		t.Errorf("a file that does not exist: %v, want its own error", err)
	}
	want(1) // the failed open took no place
	c, err := kept.OpenStat(r, 2)
	if err != nil {
		t.Errorf("an open after a close: %v", err)
	}
	b.Close()
	c.Close()
	want(0)
}

// The budget is the soft limit, raised to the hard one, less the connections and the reserve.
func TestKeptFileBudget(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	budget, soft := KeptFileBudget(512)
	if soft != lim.Max {
		t.Errorf("soft limit %d after KeptFileBudget, want the hard one, %d", soft, lim.Max)
	}
	if want := max(0, min(int(lim.Max)-512-reserveFiles, maxKeptFiles)); budget != want {
		t.Errorf("budget %d, want %d", budget, want)
	}
}
