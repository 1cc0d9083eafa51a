package attribution

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Only comm and cgroup are read: cmdline and environ may hold secrets, and the owner is told by the cgroup alone.

// procReader reads the small procfs files of many processes through one buffer. procfs reports a size of 0, so
// os.ReadFile's Stat and size guess are wasted work; at two files per GPU process per scrape the allocations show.
// A procReader is used by one goroutine.
type procReader struct {
	root string
	path []byte
	buf  []byte
}

// maxProcFile bounds what is read of one file: comm is 16 bytes, a cgroup file a few KiB even with every v1
// controller listed.
const maxProcFile = 64 << 10

func newProcReader(root string) *procReader {
	return &procReader{root: root, buf: make([]byte, 0, 4096)}
}

// comm reads <procfs>/<pid>/comm, the kernel's process name.
func (r *procReader) comm(pid uint32) (string, error) {
	b, err := r.read(pid, "comm")
	if err != nil {
		return "", fmt.Errorf("reading process name: %w", err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// cgroup reads the whole of <procfs>/<pid>/cgroup.
func (r *procReader) cgroup(pid uint32) (string, error) {
	b, err := r.read(pid, "cgroup")
	if err != nil {
		return "", fmt.Errorf("reading cgroup: %w", err)
	}
	return string(b), nil
}

// read returns the contents of <procfs>/<pid>/<file>, valid until the next read.
func (r *procReader) read(pid uint32, file string) ([]byte, error) {
	r.path = append(r.path[:0], r.root...)
	r.path = append(r.path, '/')
	r.path = strconv.AppendUint(r.path, uint64(pid), 10)
	r.path = append(r.path, '/')
	r.path = append(r.path, file...)
	f, err := os.Open(string(r.path))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r.buf = r.buf[:0]
	for {
		if len(r.buf) == cap(r.buf) {
			if len(r.buf) >= maxProcFile {
				return nil, fmt.Errorf("%s: larger than %d bytes", f.Name(), maxProcFile)
			}
			r.buf = append(r.buf, 0)[:len(r.buf)]
		}
		n, err := f.Read(r.buf[len(r.buf):cap(r.buf)])
		r.buf = r.buf[:len(r.buf)+n]
		if errors.Is(err, io.EOF) {
			return r.buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
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
