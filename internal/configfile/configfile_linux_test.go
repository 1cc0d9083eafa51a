package configfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A path that is not a regular file is refused without being opened: opening some devices does something
// (/dev/watchdog arms the watchdog, a tape rewinds). inotify reports every open of the file it watches.
func TestNotRegularIsNotOpened(t *testing.T) {
	path := fifo(t)
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Skip("no inotify:", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	if err := Check(path, MaxBytes); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("Check(FIFO) = %v, want ErrNotRegular", err)
	}
	// The events of the calls above are queued by now: inotify queues them as the calls happen.
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	if n > 0 {
		t.Errorf("the FIFO was opened (%d bytes of inotify events)", n)
	} else if !errors.Is(err, unix.EAGAIN) {
		t.Fatal(err)
	}
}

// The file opened must be the one checked: where the path names another file at the open than at the check (a
// regular file swapped for a device), it is tried again, and refused where it changes at every try.
func TestReplacedBetweenCheckAndOpen(t *testing.T) {
	dir := t.TempDir()
	path, other := filepath.Join(dir, "config.yml"), filepath.Join(dir, "other.yml")
	for _, p := range []string{path, other} {
		if err := os.WriteFile(p, []byte("a: 1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	stats := 0
	always := func(string) (fs.FileInfo, error) { stats++; return os.Stat(other) } // another file at every check
	if f, err := open(path, MaxBytes, always); !errors.Is(err, ErrChanged) {
		if f != nil {
			f.Close()
		}
		t.Errorf("a path replaced at every try: %v, want ErrChanged", err)
	}
	if stats != openTries {
		t.Errorf("%d tries, want %d", stats, openTries)
	}
	stats = 0
	once := func(p string) (fs.FileInfo, error) { // replaced once, as a Secret volume's update does
		stats++
		if stats == 1 {
			return os.Stat(other)
		}
		return os.Stat(p)
	}
	f, err := open(path, MaxBytes, once)
	if err != nil {
		t.Fatalf("a path replaced once: %v, want the new file", err)
	}
	f.Close()
}
