package procfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// The process's own open files, read through the kernel's procfs: a character device of the asked major is
// found, with its minor; files of other kinds are passed over.
func TestCharDeviceFDsOnTheKernelsProcfs(t *testing.T) {
	null, err := os.Open("/dev/null") // character device 1:3
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r := NewReader("/proc")
	self := uint32(os.Getpid())
	fds, seen, cut, err := charDevices(r, self, 1, 1<<20)
	if err != nil || cut || seen < 3 {
		t.Fatalf("%v files, seen %d, cut %v: %v", fds, seen, cut, err)
	}
	if !slices.Contains(fds, [2]int{int(null.Fd()), 3}) {
		t.Errorf("/dev/null (1:3) at fd %d not found in %v", null.Fd(), fds)
	}
	if fds, _, _, _ := charDevices(r, self, 226, 1<<20); len(fds) != 0 {
		t.Errorf("DRM devices found among this test's files: %v", fds)
	}
	var listed []int
	if _, _, err := r.FDs(self, 1<<20, func(fd int, _ func() (FDTarget, error)) bool { listed = append(listed, fd); return true }); err != nil ||
		!slices.IsSorted(listed) {
		t.Errorf("fds %v not in increasing order (%v)", listed, err)
	}
	info, err := r.FDInfo(self, int(null.Fd()))
	if err != nil || !slices.Contains([]string{"pos:\t0\n"}, string(info[:7])) {
		t.Errorf("FDInfo = %q, %v", info, err)
	}
	pids, err := r.AppendPIDs(nil)
	if err != nil || !slices.Contains(pids, self) {
		t.Errorf("AppendPIDs: %d PIDs without this one's (%d): %v", len(pids), self, err)
	}
}

// The limit on files looked at, and what the directory listing does with names that are not fds.
func TestCharDeviceFDsLimit(t *testing.T) {
	root, dir := fakeProc(t)
	fd := filepath.Join(dir, "fd")
	if err := os.Mkdir(fd, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := os.Symlink("/dev/null", filepath.Join(fd, strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/dev/null", filepath.Join(fd, "not-an-fd")); err != nil {
		t.Fatal(err)
	}
	r := NewReader(root)
	fds, seen, cut, err := charDevices(r, 42, 1, 4)
	if err != nil || seen != 4 || !cut || len(fds) != 4 {
		t.Errorf("limit 4: %v, seen %d, cut %v, %v", fds, seen, cut, err)
	}
	fds, seen, cut, err = charDevices(r, 42, 1, 100)
	if err != nil || seen != 10 || cut || len(fds) != 10 {
		t.Errorf("limit 100: %v, seen %d, cut %v, %v", fds, seen, cut, err)
	}
	if _, _, _, err := charDevices(r, 43, 1, 100); !Exited(err) {
		t.Errorf("a missing process: %v, want an exit", err)
	}
}

// A process's fd directory that is a symlink (a tree that is not the kernel's) is not followed.
func TestCharDeviceFDsRefusesASymlinkedDirectory(t *testing.T) {
	root, dir := fakeProc(t)
	elsewhere := t.TempDir()
	if err := os.Symlink("/dev/null", filepath.Join(elsewhere, "0")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(dir, "fd")); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := charDevices(NewReader(root), 42, 1, 100)
	if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("a symlinked fd directory: %v", err)
	}
}

// Another user's process's open files cannot be read without CAP_DAC_READ_SEARCH: the error is a permission
// error, which the DRM source counts apart from processes that exited. As root, the test reads with another
// filesystem user ID on its thread, which drops root's file capabilities as an unprivileged exporter lacks them.
func TestCharDeviceFDsPermission(t *testing.T) {
	root, dir := fakeProc(t)
	for _, d := range []string{root, dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fd := filepath.Join(dir, "fd")
	if err := os.Mkdir(fd, 0o500); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", filepath.Join(fd, "0")); err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if os.Geteuid() == 0 {
		unix.Setfsuid(65534)
		defer unix.Setfsuid(0)
	} else if err := os.Chmod(fd, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := charDevices(NewReader(root), 42, 1, 100); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("unreadable fd directory: %v", err)
	}
}

// charDevices lists a process's fds that are character devices of major, as fd and minor pairs.
func charDevices(r *Reader, pid, major uint32, limit int) (fds [][2]int, seen int, cut bool, err error) {
	seen, cut, err = r.FDs(pid, limit, func(fd int, stat func() (FDTarget, error)) bool {
		if t, err := stat(); err == nil {
			if minor, ok := t.CharDevice(major); ok {
				fds = append(fds, [2]int{fd, int(minor)})
			}
		}
		return true
	})
	return fds, seen, cut, err
}
