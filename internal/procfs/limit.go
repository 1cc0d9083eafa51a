package procfs

import "syscall"

// The file descriptors the exporter needs besides connections and kept process files: listeners, the sockets of the
// container runtimes and the kubelet, NVML's device files (a few per GPU), the nvidia-smi child's pipes, the files
// read and closed during a reading (one at a time), and the Go runtime's own.
const reserveFiles = 128

// maxKeptFiles bounds the kept files whatever the limit: those of 4,096 GPU processes, far past a node's. A GPU
// process keeps one file (its stat) with the other sources and three with the drm source (its stat, its DRM file's
// fdinfo and KFD's vram file of its GPU), besides the drm source's sysfs attributes; a file past the budget is read
// by path at every reading, an open, a stat, two reads and a close instead of one pread. Each kept procfs or sysfs
// file holds about 4 KiB of kernel memory once read (its seq_file buffer), charged to the exporter's memory cgroup:
// 64 MiB at the bound.
const maxKeptFiles = 16384

// KeptFileBudget raises the soft limit on open files to the hard one, as servers do (Go's syscall package raises it
// to one below at start), and returns how many process files may then be kept open: the soft limit less the
// connections the server may hold and a reserve for the exporter's other files, at most maxKeptFiles, at least none.
// limit is the soft limit; 0 when it cannot be read (the budget is then maxKeptFiles).
func KeptFileBudget(connections int) (budget int, limit uint64) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return maxKeptFiles, 0
	}
	if lim.Cur < lim.Max {
		raised := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			lim = raised
		}
	}
	free := int64(min(lim.Cur, 1<<40)) - int64(connections) - reserveFiles
	return int(max(0, min(free, maxKeptFiles))), lim.Cur
}
