package drm

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
)

// files reads the small attribute files of sysfs (and procfs's osrelease) through one buffer. It opens a file
// itself, never a symlink in its last component, nor anything but a regular file, and reads at most maxAttr bytes:
// a --path.sysfs that is not the kernel's must not make the exporter hang on a FIFO or read a large file into
// memory. Directories in the path may be symlinks, as sysfs's device links are.
//
// A file read at a reading stays open for the next one, while budget has room, which reads it again from its
// start (sysfs calls the driver's show function at each read from offset 0) with one system call instead of four;
// one not read at a reading is closed after it (sweep), as is one whose read fails. A file that is absent is not
// looked for again for fullLookEvery: what a driver publishes does not change while it is loaded. The absent files
// are forgotten when they appear and once that minute is over (the files of a GPU unbound, of a compute process
// that exited), and at most maxAbsent are remembered: past it, a missing file is looked for at each reading.
type files struct {
	// budget is the files kept open between readings, shared with the DRM files' fdinfo and attribution's process
	// files; nil: none kept.
	budget *procfs.KeptFiles
	buf    []byte
	now    time.Time
	reads  uint64 // the reading, for sweep
	kept   map[string]*keptAttr
	absent map[string]time.Time // when the file was found missing
}

type keptAttr struct {
	fd       int
	lastRead uint64
}

// maxAttr bounds one attribute: a sysfs attribute is at most a page; KFD's topology properties, the longest file
// read, are about 1.5 KB.
const maxAttr = 8 << 10

// maxAbsent bounds the absent files remembered: a dozen attributes per GPU that its driver does not publish, and
// the files of compute processes that exited as they were read.
const maxAbsent = 1 << 12

// errAbsent is the error of a file found missing within fullLookEvery: the same value each time, since a reading
// asks for a dozen files a driver does not publish, and absent files are not reported.
var errAbsent = fmt.Errorf("not published by the driver (looked for within the last minute): %w", fs.ErrNotExist)

var errNotRegular = errors.New("not a regular file, as sysfs attributes are")

// reading starts a reading at now: the files kept open from the last one and not read at it are closed, and the
// absent files looked for over fullLookEvery ago forgotten.
func (f *files) reading(now time.Time) {
	f.now = now
	for path, t := range f.absent {
		if now.Sub(t) >= fullLookEvery {
			delete(f.absent, path)
		}
	}
	for path, k := range f.kept {
		if k.lastRead != f.reads {
			f.close(path, k)
		}
	}
	f.reads++
}

// read returns the contents of the file at path, valid until the next read.
func (f *files) read(path string) ([]byte, error) {
	if k, ok := f.kept[path]; ok {
		b, err := f.readFD(k.fd, path, true)
		if err != nil {
			f.close(path, k)
			return nil, err
		}
		k.lastRead = f.reads
		return b, nil
	}
	if t, ok := f.absent[path]; ok && f.now.Sub(t) < fullLookEvery {
		return nil, errAbsent
	}
	fd, err := open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !f.now.IsZero() && len(f.absent) < maxAbsent {
			if f.absent == nil {
				f.absent = make(map[string]time.Time)
			}
			f.absent[path] = f.now
		}
		return nil, err
	}
	delete(f.absent, path)
	b, err := f.readFD(fd, path, false)
	if err != nil || f.now.IsZero() || f.budget == nil || !f.budget.Reserve() {
		syscall.Close(fd)
		return b, err
	}
	if f.kept == nil {
		f.kept = make(map[string]*keptAttr)
	}
	f.kept[path] = &keptAttr{fd: fd, lastRead: f.reads}
	return b, nil
}

// readFD reads an open file whole, from its start (pread) when it was read before.
func (f *files) readFD(fd int, path string, again bool) ([]byte, error) {
	if f.buf == nil {
		f.buf = make([]byte, maxAttr+1)
	}
	n := 0
	for n < len(f.buf) {
		var m int
		var err error
		if again {
			m, err = syscall.Pread(fd, f.buf[n:], int64(n))
		} else {
			m, err = syscall.Read(fd, f.buf[n:])
		}
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return f.buf[:n], nil
		}
		n += m
		if n < len(f.buf) && m < 4096 {
			// sysfs writes an attribute whole at the first read, and a small regular file comes whole too: the
			// read that would return 0 is spared. A read that filled a page or the buffer goes on.
			return f.buf[:n], nil
		}
	}
	return nil, fmt.Errorf("%s: larger than %d bytes", path, maxAttr)
}

// close closes a kept file, and gives its place in the budget back.
func (f *files) close(path string, k *keptAttr) {
	syscall.Close(k.fd)
	f.budget.Release()
	delete(f.kept, path)
}

// closeAll closes the files kept open.
func (f *files) closeAll() {
	for path, k := range f.kept {
		f.close(path, k)
	}
}

func open(path string) (int, error) {
	for {
		fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			syscall.Close(fd)
			return -1, &fs.PathError{Op: "stat", Path: path, Err: err}
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			syscall.Close(fd)
			return -1, &fs.PathError{Op: "open", Path: path, Err: errNotRegular}
		}
		return fd, nil
	}
}

// text reads a one-line attribute without its newline.
func (f *files) text(path string) (string, error) {
	b, err := f.read(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// uint reads an attribute holding one unsigned decimal number, as hwmon and amdgpu write them.
func (f *files) uint(path string) (uint64, error) {
	b, err := f.read(path)
	if err != nil {
		return 0, err
	}
	return parseAttr(b, path)
}

// parseAttr reads the contents of an attribute holding one unsigned decimal number.
func parseAttr(b []byte, path string) (uint64, error) {
	n, ok := parseUint(trimSpace(b))
	if !ok {
		return 0, fmt.Errorf("%s: %q is not a whole number", path, truncate(b))
	}
	return n, nil
}

// int reads an attribute holding one signed decimal number (hwmon temperatures can be below 0).
func (f *files) int(path string) (int64, error) {
	b, err := f.read(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(string(trimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a whole number", path, truncate(b))
	}
	return n, nil
}

func truncate(b []byte) string {
	b = trimSpace(b)
	if len(b) > 32 {
		b = b[:32]
	}
	return string(b)
}

// absent reports whether a read failed because the kernel does not publish the value: no such file (the driver
// or kernel version has no such attribute), or an attribute the device does not support, which amdgpu and hwmon
// answer with EOPNOTSUPP, ENODATA or EINVAL. Those values are left out without an error; any other failure (an I/O
// error, a GPU in reset answering EBUSY or EPERM) is reported.
func absent(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EOPNOTSUPP) ||
		errors.Is(err, syscall.ENODATA) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENODEV)
}

// dirNames lists a directory's entry names, at most max of them; cut says it has more.
func dirNames(path string, max int) (names []string, cut bool, err error) {
	d, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer d.Close()
	names, err = d.Readdirnames(max + 1)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if len(names) > max {
		names, cut = names[:max], true
	}
	return names, cut, err
}

// bounds are the most entries of each sysfs directory a reading reads, beyond which it says it stopped
// (truncation); a test lowers them.
type bounds struct {
	cards, kfdNodes, kfdProcesses int
}

var defaultBounds = bounds{cards: maxCards, kfdNodes: maxKFDNodes, kfdProcesses: maxKFDProcesses}

// truncation is a directory that listed more entries than a bound lets a reading read: what the entries past it
// name is not read.
type truncation struct {
	dir  string
	max  int
	lost string // what is not read
}

func (t *truncation) Error() string {
	return fmt.Sprintf("%s has more than %d entries, of which only the first %d were read: %s", t.dir, t.max,
		t.max, t.lost)
}
