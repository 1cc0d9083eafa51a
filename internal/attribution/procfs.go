package attribution

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Only comm and cgroup are read: cmdline and environ may hold secrets, and the owner is told by the cgroup alone.

// readComm reads <procfs>/<pid>/comm, the kernel's 15-byte process name.
func readComm(procfs string, pid uint32) (string, error) {
	b, err := os.ReadFile(procPath(procfs, pid, "comm"))
	if err != nil {
		return "", fmt.Errorf("reading process name: %w", err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// readCgroup reads the whole of <procfs>/<pid>/cgroup.
func readCgroup(procfs string, pid uint32) (string, error) {
	b, err := os.ReadFile(procPath(procfs, pid, "cgroup"))
	if err != nil {
		return "", fmt.Errorf("reading cgroup: %w", err)
	}
	return string(b), nil
}

func procPath(procfs string, pid uint32, file string) string {
	return filepath.Join(procfs, strconv.FormatUint(uint64(pid), 10), file)
}

// exited reports whether a procfs read failed because the process is gone: the GPU listing and the read race,
// and a process that exits in between is normal, not an error. The kernel answers ENOENT for a PID that no longer
// exists and ESRCH for one that exited after the file was opened.
func exited(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// procfsHealth logs procfs failures other than exited processes once per change of state, not on every scrape:
// a procfs that is not readable (hidepid, a missing --path.procfs mount) fails for every PID of every scrape.
type procfsHealth struct {
	mu      sync.Mutex
	failing bool
}

func (a *Attributor) procfsFailed(pid uint32, err error) {
	if exited(err) {
		a.metrics.procfsErrors.WithLabelValues("exited").Inc()
		a.logger.Debug("GPU process exited before it could be attributed", "pid", pid, "err", err)
		return
	}
	a.metrics.procfsErrors.WithLabelValues("other").Inc()
	a.procfsHealth.mu.Lock()
	changed := !a.procfsHealth.failing
	a.procfsHealth.failing = true
	a.procfsHealth.mu.Unlock()
	if changed {
		a.logger.Warn("cannot read procfs: processes are left without identity (is --path.procfs the host's /proc?)",
			"procfs", a.procfs, "pid", pid, "err", err)
		return
	}
	a.logger.Debug("cannot read procfs", "pid", pid, "err", err)
}

func (a *Attributor) procfsOK() {
	a.procfsHealth.mu.Lock()
	changed := a.procfsHealth.failing
	a.procfsHealth.failing = false
	a.procfsHealth.mu.Unlock()
	if changed {
		a.logger.Info("procfs readable again", "procfs", a.procfs)
	}
}
