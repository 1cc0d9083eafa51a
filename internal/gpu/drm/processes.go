package drm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
)

// DRMMajor is the major number of DRM device nodes, /dev/dri/card<N> and renderD<N> (include/uapi/linux/major.h).
const DRMMajor = 226

// Defaults of the bounds on the open files looked at to find DRM clients: a process rarely has more than a few
// hundred open files, and a GPU process opens its DRM files first; a node's processes have tens of thousands.
const (
	DefaultMaxFDsPerProcess = 4096
	DefaultMaxFDsPerReading = 1 << 18
)

// client is one DRM client found in one process's open files, with the device it is on.
type client struct {
	pid uint32
	fd  int
	dev int // index into the reading's devices
	Client
}

// scan is what one pass over the processes' open files found.
type scan struct {
	clients []client
	// denied counts processes whose open files could not be read for want of permission; truncated says the
	// per-reading bound stopped the pass, and cut counts the processes whose files were not all looked at.
	denied    int
	truncated bool
	cut       int
	err       error // the proc filesystem could not be listed
}

// clientKey identifies a DRM client: drm-client-id is unique per device (or per system), so a client open through
// several fds, or inherited across fork, is one. A client without an ID is its fd.
type clientKey struct {
	dev int
	id  uint64
	pid uint32 // with fd, only for a client without an ID
	fd  int
}

func (c *client) key() clientKey {
	if c.HasID {
		return clientKey{dev: c.dev, id: c.ID}
	}
	return clientKey{dev: c.dev, pid: c.pid, fd: c.fd}
}

// scanProcesses looks at every process's open files for DRM device nodes, reads the fdinfo of each and keeps the
// clients of the drivers and devices this source reads, each client once: the first process found holding it (the
// kernel lists PIDs in increasing order) has it. It never opens a device: an open file is known to be a DRM node by
// a stat of its fd link, and only then is its fdinfo, a procfs text file, read.
func scanProcesses(ctx context.Context, r *procfs.Reader, pids []uint32, fds []procfs.DeviceFD, devs []*device,
	perProcess, perReading int) (scan, []uint32, []procfs.DeviceFD) {
	var s scan
	byPCI := make(map[string]int, len(devs))
	byMinor := make(map[uint32]int, 2*len(devs))
	for i, d := range devs {
		byPCI[d.pci] = i
		byMinor[uint32(d.minor)] = i
		if d.render >= 0 {
			byMinor[uint32(d.render)] = i
		}
	}
	pids, err := r.AppendPIDs(pids[:0])
	if err != nil {
		s.err = fmt.Errorf("listing processes: %w", err)
		return s, pids, fds
	}
	slices.Sort(pids) // the kernel's procfs lists them in order already; a copy of it may not
	seen := make(map[clientKey]bool)
	budget := perReading
	for i, pid := range pids {
		if ctx.Err() != nil || budget == 0 {
			s.truncated, s.cut = true, s.cut+len(pids)-i
			break
		}
		var looked int
		var cut bool
		fds, looked, cut, err = r.CharDeviceFDs(fds[:0], pid, DRMMajor, min(perProcess, budget))
		budget -= looked
		switch {
		case errors.Is(err, fs.ErrPermission):
			s.denied++
			continue
		case err != nil:
			continue // exited since it was listed
		case cut:
			s.cut++
		}
		for _, f := range fds {
			dev, ok := byMinor[f.Minor]
			if !ok {
				continue // a DRM device of another driver (nvidia-drm, a display controller)
			}
			b, err := r.FDInfo(pid, f.FD)
			if err != nil {
				continue // closed since it was listed, or the process exited
			}
			c, err := ParseFDInfo(b)
			if err != nil {
				continue
			}
			if _, ours := Drivers[c.Driver]; !ours {
				continue
			}
			// drm-pdev, where the driver prints it, names the device; it and the node's minor agree on a real
			// node, and the minor is the fallback for a driver that does not print it.
			if c.PDev != "" {
				if d, ok := byPCI[c.PDev]; ok {
					dev = d
				} else {
					continue
				}
			}
			cl := client{pid: pid, fd: f.FD, dev: dev, Client: c}
			if k := cl.key(); !seen[k] {
				seen[k] = true
				s.clients = append(s.clients, cl)
			}
		}
	}
	return s, pids, fds
}
