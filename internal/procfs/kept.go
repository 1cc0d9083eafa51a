package procfs

import (
	"fmt"
	"strings"
	"syscall"
)

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
