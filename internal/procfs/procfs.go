// Package procfs reads the files the exporter reads of a process, <procfs>/<pid>/stat, comm and cgroup,
// and says when the proc filesystem cannot be read (hidepid, a missing --path.procfs mount).
package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
)

// Only stat, comm, cgroup and status (for its Uid line, internal/users) are read: cmdline and environ may hold
// secrets, and the owner is told by the cgroup alone.

// Reader reads the small procfs files of many processes through one buffer. procfs reports a size of 0, so
// os.ReadFile's Stat and size guess are wasted work; at two files per GPU process per scrape the allocations show.
// A Reader is used by one goroutine.
//
// Every read is bounded by what the kernel writes to that file, and opens the file itself, never what a symlink
// points at, nor anything but a regular file: a --path.procfs that is not the kernel's (a fake tree, a mistaken
// mount) must not make the exporter read /etc/shadow into a label, nor hang on a FIFO.
type Reader struct {
	root string
	path []byte
	buf  []byte
}

// maxCommFile is the most the kernel writes to <pid>/comm: a process's name is at most TASK_COMM_LEN-1 (15) bytes
// and a newline, but proc_task_name formats a workqueue worker's into a 64-byte buffer ("kworker/u8:2-events…").
const maxCommFile = 64

// maxProcFile bounds the other files: a cgroup file has one line per hierarchy, a dozen at most on cgroup v1,
// each path far shorter than PATH_MAX in practice; a stat line is a few hundred bytes.
const maxProcFile = 64 << 10

// maxSize is the most that is read of one file of a process.
func maxSize(file string) int {
	if file == "comm" {
		return maxCommFile
	}
	return maxProcFile
}

// NewReader returns a Reader of the proc filesystem at root.
func NewReader(root string) *Reader {
	return &Reader{root: root, buf: make([]byte, 0, 4096)}
}

// Comm reads <procfs>/<pid>/comm, the kernel's process name.
func (r *Reader) Comm(pid uint32) (string, error) {
	b, err := r.read(pid, "comm")
	if err != nil {
		return "", fmt.Errorf("reading process name: %w", err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// Stat reads <procfs>/<pid>/stat for the process name and the process's start time (clock ticks after boot). A
// PID and its start time name one process for its whole life: a PID that the kernel gives to a new process comes
// with another start time. The name is comm's, read in the same system call.
func (r *Reader) Stat(pid uint32) (comm string, start uint64, err error) {
	b, err := r.read(pid, "stat")
	if err != nil {
		return "", 0, fmt.Errorf("reading process status: %w", err)
	}
	return statFields(b, r.root+"/"+strconv.FormatUint(uint64(pid), 10)+"/stat")
}

// KeptFile is an open <procfs>/<pid>/stat (or comm, see OpenComm), read again at each scrape with one pread instead
// of an open, an fstat, reads and a close. On procfs it stays tied to the process it was opened for: once that
// process has exited, reading it fails with ESRCH, even when the kernel has given its PID to another process. A
// KeptFile is used by one goroutine at a time.
type KeptFile struct {
	fd   int
	path string
}

// OpenStat opens <procfs>/<pid>/stat for ReadStat, as every file of a process is opened (see read). Close it when
// done.
func (r *Reader) OpenStat(pid uint32) (*KeptFile, error) {
	f, err := r.openFile(pid, "stat")
	if err != nil {
		return nil, fmt.Errorf("reading process status: %w", err)
	}
	return f, nil
}

func (r *Reader) openFile(pid uint32, file string) (*KeptFile, error) {
	path := r.pathOf(pid, file)
	fd, err := open(path)
	if err != nil {
		return nil, err
	}
	return &KeptFile{fd: fd, path: path}, nil
}

// ReadStat reads an open stat file from its start: the process name and start time, as Stat gives them.
func (r *Reader) ReadStat(f *KeptFile) (comm string, start uint64, err error) {
	b, err := r.readFD(f.fd, f.path, maxProcFile, true)
	if err != nil {
		return "", 0, fmt.Errorf("reading process status: %w", err)
	}
	return statFields(b, f.path)
}

// Close closes the file.
func (f *KeptFile) Close() error { return syscall.Close(f.fd) }

// OpenComm opens <procfs>/<pid>/comm for ReadComm. On the kernel's procfs an open comm file is tied to its process
// as a stat file is, and costs a third as much to read (the kernel formats one field instead of fifty-two). Close
// it when done.
func (r *Reader) OpenComm(pid uint32) (*KeptFile, error) {
	f, err := r.openFile(pid, "comm")
	if err != nil {
		return nil, fmt.Errorf("reading process name: %w", err)
	}
	return f, nil
}

// ReadComm reads an open comm file from its start: the process name, as Comm gives it.
func (r *Reader) ReadComm(f *KeptFile) (string, error) {
	b, err := r.readFD(f.fd, f.path, maxCommFile, true)
	if err != nil {
		return "", fmt.Errorf("reading process name: %w", err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

func statFields(b []byte, path string) (string, uint64, error) {
	comm, start, ok := parseStat(b)
	if !ok {
		return "", 0, fmt.Errorf("reading process status: %s is not a stat file", path)
	}
	return comm, start, nil
}

// parseStat returns the name (field 2) and start time (field 22) of a stat line. The name is in parentheses and
// may itself hold spaces and parentheses, so the fields after it are counted from its last ')'.
func parseStat(b []byte) (comm string, start uint64, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	rest := b[end+1:]
	// rest is " S ppid ...": field 3 (state) is the first; starttime is field 22, the 20th.
	for field := 3; field < 22; field++ {
		rest = bytes.TrimLeft(rest, " ")
		i := bytes.IndexByte(rest, ' ')
		if i < 0 {
			return "", 0, false
		}
		rest = rest[i:]
	}
	rest = bytes.TrimLeft(rest, " ")
	if i := bytes.IndexAny(rest, " \n"); i >= 0 {
		rest = rest[:i]
	}
	start, err := strconv.ParseUint(string(rest), 10, 64)
	if err != nil {
		return "", 0, false
	}
	return string(b[open+1 : end]), start, true
}

// Status reads <procfs>/<pid>/status. The bytes are the Reader's, good until its next read.
func (r *Reader) Status(pid uint32) ([]byte, error) {
	b, err := r.read(pid, "status")
	if err != nil {
		return nil, fmt.Errorf("reading process status: %w", err)
	}
	return b, nil
}

// Cgroup reads the whole of <procfs>/<pid>/cgroup.
func (r *Reader) Cgroup(pid uint32) (string, error) {
	b, err := r.read(pid, "cgroup")
	if err != nil {
		return "", fmt.Errorf("reading cgroup: %w", err)
	}
	return string(b), nil
}

// errNotRegular is the error of a file that is not a regular file, as procfs files are.
var errNotRegular = errors.New("not a regular file, as procfs files are")

// read returns the contents of <procfs>/<pid>/<file>, valid until the next read. It opens the file with
// O_NOFOLLOW (a symlink fails with ELOOP) and O_NONBLOCK (a FIFO does not block the open), refuses anything but a
// regular file, and fails rather than read more than maxSize(file).
func (r *Reader) read(pid uint32, file string) ([]byte, error) {
	path := r.pathOf(pid, file)
	fd, err := open(path)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	return r.readFD(fd, path, maxSize(file), false)
}

func (r *Reader) pathOf(pid uint32, file string) string {
	r.path = append(r.path[:0], r.root...)
	r.path = append(r.path, '/')
	r.path = strconv.AppendUint(r.path, uint64(pid), 10)
	r.path = append(r.path, '/')
	r.path = append(r.path, file...)
	return string(r.path)
}

// open opens a file of a process as read says.
func open(path string) (int, error) {
	fd, err := ignoringEINTR(func() (int, error) {
		return syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	})
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			err = fmt.Errorf("a symlink, not followed: %w", err)
		}
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		_ = syscall.Close(fd)
		return -1, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		_ = syscall.Close(fd)
		return -1, &fs.PathError{Op: "open", Path: path, Err: errNotRegular}
	}
	return fd, nil
}

// readFD reads an open file whole into r.buf, failing rather than read more than limit. again reads a file read
// before, from its start, with pread, and stops at a read that falls short of what was asked: procfs writes a stat
// line whole, and a regular file ends there, so that a kept stat file costs one system call.
func (r *Reader) readFD(fd int, path string, limit int, again bool) ([]byte, error) {
	r.buf = r.buf[:0]
	for {
		// One byte more than the limit tells a file at the limit from a longer one.
		if len(r.buf) > limit {
			return nil, fmt.Errorf("%s: larger than the %d bytes the kernel writes", path, limit)
		}
		if len(r.buf) == cap(r.buf) {
			r.buf = append(r.buf, 0)[:len(r.buf)]
		}
		end := min(cap(r.buf), limit+1)
		n, err := ignoringEINTR(func() (int, error) {
			if again {
				return syscall.Pread(fd, r.buf[len(r.buf):end], int64(len(r.buf)))
			}
			return syscall.Read(fd, r.buf[len(r.buf):end])
		})
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return r.buf, nil
		}
		asked := end - len(r.buf)
		r.buf = r.buf[:len(r.buf)+n]
		if again && n < asked && len(r.buf) <= limit {
			return r.buf, nil
		}
	}
}

// ignoringEINTR retries a system call that a signal interrupted.
func ignoringEINTR(call func() (int, error)) (int, error) {
	for {
		n, err := call()
		if !errors.Is(err, syscall.EINTR) {
			return n, err
		}
	}
}

// Exited reports whether a procfs read failed because the process is gone: the GPU listing and the read race,
// and a process that exits in between is normal, not an error. The kernel answers ENOENT for a PID that no longer
// exists and ESRCH for one that exited after the file was opened.
func Exited(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// Health logs procfs failures once per change of state, not on every scrape: a procfs that is not readable
// (hidepid, a missing --path.procfs mount) fails for every PID of every scrape, and one that is not the host's (a
// container's own /proc) has none of the GPU processes. The state is decided per Tally, one reading's reads:
// failing when any of them failed for a reason other than an exit, so that a reading with both readable and
// unreadable processes does not make it flap; missing when every one of its processes was missing. It is safe for
// concurrent use.
type Health struct {
	root   string
	logger *slog.Logger
	state  logstate.State
}

// NewHealth returns the Health of the proc filesystem at root, logging to logger.
func NewHealth(root string, logger *slog.Logger) *Health {
	return &Health{root: root, logger: logger}
}

// Tally is what one reading's procfs reads came to.
type Tally struct {
	Read     int // processes whose files were read
	missing  int // processes missing from procfs (exited, or never in this procfs)
	failures int // reads that failed for a reason other than an exit
	pid      uint32
	err      error // the first such failure, for the log
}

// Failed counts a read that failed for a reason other than an exit.
func (t *Tally) Failed(pid uint32, err error) {
	if t.failures == 0 {
		t.pid, t.err = pid, err
	}
	t.failures++
}

// Missing counts a process that procfs does not have (Exited).
func (t *Tally) Missing(pid uint32) {
	if t.failures == 0 && t.missing == 0 {
		t.pid = pid
	}
	t.missing++
}

// Health states.
const (
	stateFailing = "failing"
	stateMissing = "missing"
)

// Update sets the health from one reading's reads and logs when it changes. A reading that had no process to
// read says nothing, and leaves it as it was.
//
// A reading whose processes are all missing is most likely read from the wrong procfs, since the GPU listing and
// the procfs read are milliseconds apart; a single process that exits in between also shows as such, which is why
// this is a warning once per change and not an error.
func (h *Health) Update(t Tally) {
	var state string
	switch {
	case t.Read == 0 && t.failures == 0 && t.missing == 0:
		return
	case t.failures > 0:
		state = stateFailing
	case t.Read == 0:
		state = stateMissing
	}
	prev, changed := h.state.Set(state)
	if !changed {
		return
	}
	switch state {
	case stateFailing:
		h.logger.Warn("cannot read procfs: processes are left without identity (is --path.procfs the host's /proc?)",
			"procfs", h.root, "pid", t.pid, "err", t.err, "unreadable", t.failures, "readable", t.Read)
	case stateMissing:
		h.logger.Warn("none of the GPU processes is in procfs: they are left without identity "+
			"(is --path.procfs the host's /proc, with the host's PID namespace?)",
			"procfs", h.root, "missing", t.missing, "pid", t.pid)
	default:
		if prev == stateMissing {
			h.logger.Info("GPU processes are in procfs again", "procfs", h.root)
		} else {
			h.logger.Info("procfs readable again", "procfs", h.root)
		}
	}
}

// WarnIfHidepid logs a warning when the proc filesystem at procfs is mounted with hidepid: then the processes of
// other users cannot be read, unless the exporter runs with CAP_SYS_PTRACE or in the mount's gid= group, and
// they look like processes that exited (no identity, procfs_errors_total{reason="exited"}). It reads
// <procfs>/self/mountinfo once; what it cannot read it leaves unsaid.
func WarnIfHidepid(procfs string, logger *slog.Logger) {
	b, err := os.ReadFile(filepath.Join(procfs, "self", "mountinfo"))
	if err != nil {
		return
	}
	if opt := hidepid(string(b), procfs); opt != "" {
		logger.Warn("procfs is mounted with "+opt+": GPU processes of other users look exited and get no identity "+
			"unless the exporter runs as root with CAP_SYS_PTRACE or in the mount's gid= group",
			"procfs", procfs)
	}
}

// hidepid returns the hidepid option ("hidepid=2", "hidepid=invisible") of the proc mount at mountPoint in a
// mountinfo file, or "" when it has none or is not listed. The last mount at that point is the visible one.
func hidepid(mountinfo, mountPoint string) string {
	mountPoint = filepath.Clean(mountPoint)
	if real, err := filepath.EvalSymlinks(mountPoint); err == nil {
		mountPoint = real
	}
	found := ""
	for _, line := range strings.Split(mountinfo, "\n") {
		// ID parent major:minor root mount-point mount-options [optional...] - fstype source super-options
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 6 || len(tail) < 1 || tail[0] != "proc" || unescapeMountinfo(fields[4]) != mountPoint {
			continue
		}
		found = ""
		opts := fields[5]
		if len(tail) >= 3 {
			opts += "," + tail[2]
		}
		for _, o := range strings.Split(opts, ",") {
			if v, ok := strings.CutPrefix(o, "hidepid="); ok && v != "0" && v != "off" {
				found = o
			}
		}
	}
	return found
}

// unescapeMountinfo undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
