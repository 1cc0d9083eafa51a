// Package configfile reads the files that flags name (the web and HTTP client configurations, the password,
// token and certificate files they name, the simulated node): regular files only, within a size cap. A flag that
// names /dev/zero would otherwise be read until memory ran out, and one that names a FIFO would block the read,
// and the exporter's start or a scrape with it, for as long as nothing writes to it.
package configfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// MaxBytes is the cap on a file a flag names: 4 MiB holds any configuration, certificate chain or CA bundle (the
// whole public web PKI's is about 220 KB) many times over.
const MaxBytes = 4 << 20

// ErrNotRegular is the error for a path that is not a regular file: a device, a FIFO, a socket, a directory.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is the error for a file over its cap.
var ErrTooLarge = errors.New("too large")

// ErrChanged is the error for a path that named another file each time it was opened, between the check and the
// open.
var ErrChanged = errors.New("replaced while being opened")

// openTries bounds the opens of a path that is replaced between its check and its open. A Kubernetes Secret or
// ConfigMap volume replaces its files at once on an update (a symlink swapped), so a second try finds the new file
// settled; a path replaced at every try is refused.
const openTries = 3

// Open opens path for reading if it is a regular file of at most max bytes. The path is checked before it is
// opened, since opening some devices does something (/dev/watchdog arms the watchdog, a tape drive rewinds); the
// open is non-blocking, so that a FIFO put in its place in between cannot block it, and the file opened must be
// the one checked (same device and inode), else it is tried again. Symlinks are followed, as the files of a
// Kubernetes Secret or ConfigMap volume are symlinks.
func Open(path string, max int64) (*os.File, error) { return open(path, max, os.Stat) }

// open is Open with the check's stat given, for tests.
func open(path string, max int64, stat func(string) (fs.FileInfo, error)) (*os.File, error) {
	for range openTries {
		want, err := stat(path)
		if err != nil {
			return nil, err
		}
		if err := check(path, want, max); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, err
		}
		got, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		if !os.SameFile(want, got) {
			f.Close()
			continue
		}
		if err := check(path, got, max); err != nil { // it grew in between
			f.Close()
			return nil, err
		}
		return f, nil
	}
	return nil, fmt.Errorf("%s: %w %d times", path, ErrChanged, openTries)
}

// Read reads the regular file at path, of at most max bytes.
func Read(path string, max int64) ([]byte, error) {
	f, err := Open(path, max)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max { // it grew since it was opened
		return nil, fmt.Errorf("%s: %w: more than %s", path, ErrTooLarge, size(max))
	}
	return b, nil
}

// Check reports whether path is a regular file of at most max bytes, for a file that a library reads itself.
func Check(path string, max int64) error {
	f, err := Open(path, max)
	if err != nil {
		return err
	}
	return f.Close()
}

func check(path string, fi fs.FileInfo, max int64) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: %w: it is %s", path, ErrNotRegular, kind(fi.Mode()))
	}
	if fi.Size() > max {
		return fmt.Errorf("%s: %w: %s, over the cap of %s", path, ErrTooLarge, size(fi.Size()), size(max))
	}
	return nil
}

// kind names what a file that is not regular is.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "not a regular file (" + m.Type().String() + ")"
}

// size says a number of bytes as a person reads it.
func size(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
