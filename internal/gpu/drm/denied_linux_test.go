package drm

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
)

// The environment of the helper run of TestOpenFilesDenied: the fake node's sysfs, a procfs that shows the test's
// process alone, and the fake node's procfs with one process's fdinfo unreadable.
const (
	deniedSysFS    = "GPE_DRM_DENIED_SYSFS"
	deniedProcFS   = "GPE_DRM_DENIED_PROCFS"
	deniedFakeProc = "GPE_DRM_DENIED_FAKEPROC"
)

// deniedPID is the fake node's process whose fdinfo files TestOpenFilesDenied makes unreadable: one with no KFD
// directory, known by its DRM file alone.
const deniedPID = 4401

// Reading another process's open files as the kernel checks it. Listing /proc/<pid>/fd needs only the directory's
// permissions, which root has with no capability for root's processes; following an fd's link (the scanner's stat)
// and reading its fdinfo need ptrace read access (ptrace_may_access, PTRACE_MODE_READ_FSCREDS), which a reader
// without CAP_SYS_PTRACE lacks for a process holding capabilities it has not: EACCES, as AppArmor's denial is. This
// process holds a DRM render node open (by path, which needs no driver), and the test binary runs itself again under
// setpriv with every capability dropped to read it: that process must count as unreadable and every GPU's process
// list as incomplete, never as a process without a GPU file.
func TestOpenFilesDenied(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the process read must hold capabilities its reader has dropped, and the fake node device nodes")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux) to run a reader without capabilities: ", err)
	}
	node := drmfake.NewMI300X().Node(false)
	dir, sysfs, fakeProc := writeNode(t, node)

	// A DRM file of this process: GPU 0's render node, opened by path (O_PATH), so that no driver is needed and
	// its fd link still stats as the character device.
	render := node.GPUs[0].Render
	fd, err := unix.Open(filepath.Join(dir, "dev", "dri", "renderD"+strconv.Itoa(render)), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })

	// A procfs of one process, this one: the real /proc/<pid> through a link, so that every check is the
	// kernel's, and the reading is not of the whole machine's processes.
	realProc := t.TempDir()
	pid := os.Getpid()
	if err := os.Symlink(filepath.Join("/proc", strconv.Itoa(pid)), filepath.Join(realProc, strconv.Itoa(pid))); err != nil {
		t.Fatal(err)
	}
	// With its capabilities this process reads its own DRM file.
	var drmFDs []int
	if _, _, err := procfs.NewReader(realProc).FDs(uint32(pid), 1<<16, func(n int, stat func() (procfs.FDTarget, error)) bool {
		if st, err := stat(); err == nil {
			if minor, ok := st.CharDevice(DRMMajor); ok && int(minor) == render {
				drmFDs = append(drmFDs, n)
			}
		}
		return true
	}); err != nil || len(drmFDs) != 1 || drmFDs[0] != fd {
		t.Fatalf("this process's DRM files, read by itself: %v (%v), want fd %d", drmFDs, err, fd)
	}
	src, err := New(Config{SysFS: sysfs, ProcFS: realProc})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	snap, err := src.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range snap.Devices {
		if !d.ProcessesListed {
			t.Fatalf("read with capabilities, GPU %d's process list is incomplete: %v", d.Index, snap.Errors)
		}
	}

	// A process of the fake node whose fdinfo files the reader without CAP_DAC_OVERRIDE may not read, as the
	// kernel answers when ptrace access is lost between the stat and the read.
	infos := filepath.Join(fakeProc, strconv.Itoa(deniedPID), "fdinfo")
	entries, err := os.ReadDir(infos)
	if err != nil || len(entries) == 0 {
		t.Fatalf("%s: %d files, %v", infos, len(entries), err)
	}
	for _, e := range entries {
		if err := os.Chmod(filepath.Join(infos, e.Name()), 0); err != nil {
			t.Fatal(err)
		}
	}

	cmd := exec.CommandContext(t.Context(), setpriv, "--inh-caps=-all", "--bounding-set=-all", "--",
		os.Args[0], "-test.run=^TestOpenFilesDeniedHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), deniedSysFS+"="+sysfs, deniedProcFS+"="+realProc, deniedFakeProc+"="+fakeProc)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestOpenFilesDeniedHelper")) {
		t.Fatalf("the reader without capabilities: %v\n%s", err, out)
	}
	t.Logf("the reader without capabilities:\n%s", out)
}

// TestOpenFilesDeniedHelper is TestOpenFilesDenied's reader, run by it without capabilities.
func TestOpenFilesDeniedHelper(t *testing.T) {
	sysfs, realProc, fakeProc := os.Getenv(deniedSysFS), os.Getenv(deniedProcFS), os.Getenv(deniedFakeProc)
	if sysfs == "" {
		t.Skip("TestOpenFilesDenied's reader, run by it without capabilities")
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil || !bytes.Contains(status, []byte("\nCapEff:\t0000000000000000\n")) {
		t.Fatalf("the reader kept capabilities (%v):\n%s", err, status)
	}

	t.Run("links", func(t *testing.T) {
		// The case at hand: the fd directory is listed, its links are not followed.
		entries, err := os.ReadDir(realProc)
		if err != nil || len(entries) != 1 {
			t.Fatalf("%s: %v, %v", realProc, entries, err)
		}
		fdDir := filepath.Join(realProc, entries[0].Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil || len(fds) == 0 {
			t.Fatalf("listing %s: %d fds, %v; the kernel should let root list it", fdDir, len(fds), err)
		}
		if _, err := os.Stat(filepath.Join(fdDir, fds[0].Name())); !errors.Is(err, fs.ErrPermission) {
			t.Fatalf("following %s/%s: %v, want permission denied", fdDir, fds[0].Name(), err)
		}
		deniedReadings(t, sysfs, realProc, nil)
	})
	t.Run("fdinfo", func(t *testing.T) {
		deniedReadings(t, sysfs, fakeProc, func(t *testing.T, snap *gpu.Snapshot) {
			// The readable processes are read all the same.
			for _, d := range snap.Devices {
				for _, p := range d.Processes {
					if p.PID == deniedPID {
						t.Errorf("GPU %d lists process %d, whose fdinfo could not be read", d.Index, p.PID)
					}
				}
			}
			process(t, snap.Devices[4], 4201)
		})
	})
}

// deniedReadings reads a node whose processes include one the reader may not read, twice: no GPU's process list
// may be complete, each reading must say why, and the log must say it once.
func deniedReadings(t *testing.T, sysfs, procFS string, check func(*testing.T, *gpu.Snapshot)) {
	t.Helper()
	var log bytes.Buffer
	src, err := New(Config{SysFS: sysfs, ProcFS: procFS,
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for reading := range 2 {
		snap, err := src.Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range snap.Devices {
			if d.ProcessesListed {
				t.Errorf("reading %d: GPU %d's process list complete, with a process whose files could not be read",
					reading, d.Index)
			}
		}
		var found bool
		for _, e := range snap.Errors {
			found = found || e.Operation == gpu.OpProcesses && errors.Is(e.Err, fs.ErrPermission) &&
				strings.Contains(e.Error(), "CAP_SYS_PTRACE")
		}
		if !found {
			t.Errorf("reading %d: no processes error naming the permission denied: %v", reading, snap.Errors)
		}
		if check != nil {
			check(t, snap)
		}
	}
	if n := strings.Count(log.String(), "level=WARN"); n != 1 ||
		!strings.Contains(log.String(), "drm.enabled") || !strings.Contains(log.String(), "AppArmor") {
		t.Errorf("want one warning naming drm.enabled and AppArmor over two readings, got %d:\n%s", n, log.String())
	}
}
