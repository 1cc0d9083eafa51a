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

// CharDeviceFDs fails: only Linux has the proc filesystem the exporter reads.
func (r *Reader) CharDeviceFDs(dst []DeviceFD, _ uint32, _ uint32, _ int) ([]DeviceFD, int, bool, error) {
	return dst, 0, false, errNotLinux
}

// FDInfo fails: only Linux has the proc filesystem the exporter reads.
func (r *Reader) FDInfo(uint32, int) ([]byte, error) { return nil, errNotLinux }
