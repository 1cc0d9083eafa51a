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
)

// files reads the small attribute files of sysfs (and procfs's osrelease) through one buffer. sysfs reports a
// size of 4096 for every attribute, so os.ReadFile's size guess is wasted work at a few dozen files per GPU per
// reading. It opens the file itself, never a symlink in its last component, nor anything but a regular file,
// and reads at most maxAttr bytes: a --path.sysfs that is not the kernel's must not make the exporter hang on a
// FIFO or read a large file into memory. Directories in the path may be symlinks, as sysfs's device links are.
type files struct {
	buf []byte
}

// maxAttr bounds one attribute: a sysfs attribute is at most a page; KFD's topology properties, the longest file
// read, are about 1.5 KB.
const maxAttr = 8 << 10

var errNotRegular = errors.New("not a regular file, as sysfs attributes are")

// read returns the contents of the file at path, valid until the next read.
func (f *files) read(path string) ([]byte, error) {
	fd, err := open(path)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	if f.buf == nil {
		f.buf = make([]byte, maxAttr+1)
	}
	n := 0
	for n < len(f.buf) {
		m, err := syscall.Read(fd, f.buf[n:])
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
	}
	return nil, fmt.Errorf("%s: larger than %d bytes", path, maxAttr)
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

// dirNames lists a directory's entry names, at most max of them.
func dirNames(path string, max int) ([]string, error) {
	d, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(max)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return names, err
}
