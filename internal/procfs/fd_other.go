//go:build !linux

package procfs

import "errors"

var errNotLinux = errors.New("open files of processes are read on Linux only")

// AppendPIDs fails: only Linux has the proc filesystem the exporter reads.
func (r *Reader) AppendPIDs(pids []uint32) ([]uint32, error) { return pids, errNotLinux }

// DeviceFD is an open file of a process that is a device node.
type DeviceFD struct {
	FD    int
	Minor uint32
}

// FDTarget is what an open file of a process is.
type FDTarget struct {
	Mode uint32
	Rdev uint64
}

// CharDevice reports false: only Linux has the proc filesystem the exporter reads.
func (t FDTarget) CharDevice(uint32) (uint32, bool) { return 0, false }

// FDs fails: only Linux has the proc filesystem the exporter reads.
func (r *Reader) FDs(uint32, int, func(int, func() (FDTarget, error)) bool) (int, bool, error) {
	return 0, false, errNotLinux
}

// FDInfo fails: only Linux has the proc filesystem the exporter reads.
func (r *Reader) FDInfo(uint32, int) ([]byte, error) { return nil, errNotLinux }

// OpenFDInfo fails: only Linux has the proc filesystem the exporter reads.
func (k *KeptFiles) OpenFDInfo(*Reader, uint32, int) (*KeptFile, error) { return nil, errNotLinux }

// ReadFDInfo fails: only Linux has the proc filesystem the exporter reads.
func (r *Reader) ReadFDInfo(*KeptFile) ([]byte, error) { return nil, errNotLinux }
