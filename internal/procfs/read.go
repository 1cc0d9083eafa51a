// Package procfs reads the files the exporter reads of a process, <procfs>/<pid>/stat, comm and cgroup,
// and says when the proc filesystem cannot be read (hidepid, a missing --path.procfs mount).
package procfs

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"syscall"
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
	root   string
	path   []byte
	buf    []byte
	fdinfo []byte // "fdinfo/<fd>", built per read (fd_linux.go)
	dents  []byte // getdents buffer (fd_linux.go)
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
