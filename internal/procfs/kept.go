package procfs

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
)

// KeptFile is an open <procfs>/<pid>/stat (or comm, see OpenComm), read again at each scrape with one pread instead
// of an open, an fstat, reads and a close. On procfs it stays tied to the process it was opened for: once that
// process has exited, reading it fails with ESRCH, even when the kernel has given its PID to another process. A
// KeptFile is used by one goroutine at a time; it holds a file descriptor, and a place in its KeptFiles, until
// closed.
type KeptFile struct {
	fd    int
	path  string
	owner *KeptFiles
}

// ErrNoKeptRoom is the answer of an open past the KeptFiles' budget: the file is to be read by its path instead.
var ErrNoKeptRoom = errors.New("no room for another kept file")

// KeptFiles bounds the files kept open between readings by a budget of file descriptors (KeptFileBudget), so that
// however many processes a node runs, the exporter keeps descriptors for its connections and its other files, and
// the processes past the budget are read by path, each scrape, rather than not at all. It is safe for concurrent
// use, and its self-metrics say how many files it keeps against how many it may.
type KeptFiles struct {
	budget int64
	open   atomic.Int64
}

// NewKeptFiles returns a budget of n kept files.
func NewKeptFiles(n int) *KeptFiles { return &KeptFiles{budget: int64(max(n, 0))} }

// OpenStat opens <procfs>/<pid>/stat for ReadStat, as every file of a process is opened (see read), when the budget
// has room; ErrNoKeptRoom when it has none. Close it when done.
func (k *KeptFiles) OpenStat(r *Reader, pid uint32) (*KeptFile, error) {
	f, err := k.openFile(r, pid, "stat")
	if err != nil {
		return nil, fmt.Errorf("reading process status: %w", err)
	}
	return f, nil
}

// OpenComm opens <procfs>/<pid>/comm for ReadComm, when the budget has room; ErrNoKeptRoom when it has none. On the
// kernel's procfs an open comm file is tied to its process as a stat file is, and costs a third as much to read (the
// kernel formats one field instead of fifty-two). Close it when done.
func (k *KeptFiles) OpenComm(r *Reader, pid uint32) (*KeptFile, error) {
	f, err := k.openFile(r, pid, "comm")
	if err != nil {
		return nil, fmt.Errorf("reading process name: %w", err)
	}
	return f, nil
}

func (k *KeptFiles) openFile(r *Reader, pid uint32, file string) (*KeptFile, error) {
	if !k.Reserve() {
		return nil, ErrNoKeptRoom
	}
	path := r.pathOf(pid, file)
	fd, err := open(path)
	if err != nil {
		k.Release()
		return nil, err
	}
	return &KeptFile{fd: fd, path: path, owner: k}, nil
}

// Reserve takes a place in the budget for a file that the caller opens and keeps open itself (the drm source's
// sysfs attributes): false when there is none, and the file is to be closed after each read. Release gives the
// place back once the file is closed.
func (k *KeptFiles) Reserve() bool {
	if k.open.Add(1) > k.budget {
		k.open.Add(-1)
		return false
	}
	return true
}

// Release gives back a place that Reserve took.
func (k *KeptFiles) Release() { k.open.Add(-1) }

const keptFilesHelp = "Files kept open between readings (a GPU process's stat, or comm on the kernel's procfs; the drm " +
	"source's DRM fdinfo files and sysfs attributes), up to the budget; the files past it are read by path at each reading."

var (
	keptFilesDesc       = prometheus.NewDesc("gpu_pod_exporter_attribution_kept_files", keptFilesHelp, nil, nil)
	keptFilesBudgetDesc = prometheus.NewDesc("gpu_pod_exporter_attribution_kept_files_budget",
		"How many process files may be kept open: the soft limit on open files less the connections the server may "+
			"hold and a reserve for the exporter's other files, at most 16,384.", nil, nil)
)

// Describe implements prometheus.Collector.
func (k *KeptFiles) Describe(ch chan<- *prometheus.Desc) {
	ch <- keptFilesDesc
	ch <- keptFilesBudgetDesc
}

// Collect implements prometheus.Collector.
func (k *KeptFiles) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(keptFilesDesc, prometheus.GaugeValue, float64(k.open.Load()))
	ch <- prometheus.MustNewConstMetric(keptFilesBudgetDesc, prometheus.GaugeValue, float64(k.budget))
}

// ReadStat reads an open stat file from its start: the process name and start time, as Stat gives them.
func (r *Reader) ReadStat(f *KeptFile) (comm string, start uint64, err error) {
	b, err := r.readFD(f.fd, f.path, maxProcFile, true)
	if err != nil {
		return "", 0, fmt.Errorf("reading process status: %w", err)
	}
	return statFields(b, f.path)
}

// Close closes the file, and gives its place back.
func (f *KeptFile) Close() error {
	f.owner.Release()
	return syscall.Close(f.fd)
}

// ReadComm reads an open comm file from its start: the process name, as Comm gives it.
func (r *Reader) ReadComm(f *KeptFile) (string, error) {
	b, err := r.readFD(f.fd, f.path, maxCommFile, true)
	if err != nil {
		return "", fmt.Errorf("reading process name: %w", err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}
