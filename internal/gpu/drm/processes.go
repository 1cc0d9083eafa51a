package drm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"time"

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
	// denied counts processes whose open files could not be read for want of permission, deniedErr says the first
	// one's; failed counts those whose files could not be looked at for another reason than having exited, with the
	// first error; truncated says the per-reading bound stopped the pass, and cut counts the processes whose files
	// were not all looked at.
	denied    int
	deniedErr error
	failed    int
	failedErr error
	truncated bool
	cut       int
	err       error // the proc filesystem could not be listed
}

// unreadable counts a process whose open files could not all be read, for want of permission or for another
// reason; a process that exited meanwhile is not one.
func (s *scan) unreadable(err error) {
	switch {
	case errors.Is(err, fs.ErrPermission):
		if s.denied++; s.deniedErr == nil {
			s.deniedErr = err
		}
	case !procfs.Exited(err):
		if s.failed++; s.failedErr == nil {
			s.failedErr = err
		}
	}
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

// fullLookEvery is how often every open file of a process is looked at. A process is looked at in full when it is
// first seen (a new PID), then once in this time, the looks of processes seen together spread over it; in between,
// only the DRM files it was found to hold are read again. A GPU process opens its DRM files when it starts, which
// its first look sees; a DRM file that a process opens later is found within this time. A known DRM file is read
// at every reading, through its fdinfo opened once, which must still be a DRM client's.
const fullLookEvery = time.Minute

// Bounds on what the scanner keeps: the processes whose DRM files it remembers, and the fdinfo files it keeps open.
// Past them, processes are looked at in full every time, and fdinfo files opened and closed each time.
const (
	maxTracked = 1 << 16
	maxKept    = 1 << 13
)

// openFiles is what the scanner knows of one process: its DRM files, and when it last looked at all its files.
type openFiles struct {
	drm      []drmFile
	lastFull time.Time
}

// drmFile is one open DRM file of a process, with its fdinfo kept open (nil when past maxKept), and its client as
// the last reading parsed it, which the next parses into.
type drmFile struct {
	procfs.DeviceFD
	info   *procfs.KeptFile
	client Client
}

// scanner looks through the processes' open files for DRM clients, reading by reading.
type scanner struct {
	root   string
	r      *procfs.Reader
	budget *procfs.KeptFiles
	procs  map[uint32]*openFiles
	kept   int // fdinfo files open
	// Reused from one reading to the next.
	pids    []uint32
	fds     []procfs.DeviceFD
	clients []client
	seen    map[clientKey]bool
	byPCI   map[string]int
	byMinor map[uint32]int
}

func newScanner(procfsRoot string, budget *procfs.KeptFiles) *scanner {
	if budget == nil {
		budget = procfs.NewKeptFiles(maxKept)
	}
	return &scanner{root: procfsRoot, r: procfs.NewReader(procfsRoot), budget: budget,
		procs: make(map[uint32]*openFiles), seen: make(map[clientKey]bool), byPCI: make(map[string]int),
		byMinor: make(map[uint32]int)}
}

// scan finds the DRM clients of the drivers and devices this source reads in every process's open files, each
// client once: the first process found holding it (the lowest PID) has it, and the clients come in the order of
// their PIDs. It never opens a device: an open file is known to be a DRM node by a stat of its fd link, and only
// then is its fdinfo, a procfs text file, read. The clients, and their engines and regions, are good until the
// next scan.
func (sc *scanner) scan(ctx context.Context, devs []*device, perProcess, perReading int, now time.Time) scan {
	s := scan{clients: sc.clients[:0]}
	defer func() { sc.clients = s.clients }()
	byPCI, byMinor := sc.byPCI, sc.byMinor
	clear(byPCI)
	clear(byMinor)
	for i, d := range devs {
		byPCI[d.pci] = i
		byMinor[uint32(d.minor)] = i
		if d.render >= 0 {
			byMinor[uint32(d.render)] = i
		}
	}
	var err error
	sc.pids, err = sc.r.AppendPIDs(sc.pids[:0])
	if err != nil {
		s.err = fmt.Errorf("listing processes: %w", err)
		return s
	}
	slices.Sort(sc.pids) // the kernel's procfs lists them in order already; a copy of it may not
	for pid, p := range sc.procs {
		if _, live := slices.BinarySearch(sc.pids, pid); !live {
			sc.drop(pid, p)
		}
	}
	seen := sc.seen
	clear(seen)
	budget := perReading
	for i, pid := range sc.pids {
		if ctx.Err() != nil || budget == 0 {
			s.truncated, s.cut = true, s.cut+len(sc.pids)-i
			break
		}
		p := sc.procs[pid]
		if p == nil || now.Sub(p.lastFull) >= fullLookEvery {
			var looked int
			var cut bool
			p, looked, cut, err = sc.look(pid, p, min(perProcess, budget), now)
			budget -= looked
			if err != nil {
				s.unreadable(err) // unless it exited since it was listed
				continue
			}
			if cut {
				s.cut++
			}
		}
		denied := false
		for j := 0; j < len(p.drm); j++ {
			f := &p.drm[j]
			dev, ok := byMinor[f.Minor]
			if !ok {
				continue // a DRM device of another driver (nvidia-drm, a display controller)
			}
			c, err := sc.read(pid, f)
			if err != nil {
				// Closed, reused for a file that is no DRM client's, or the process exited (its PID possibly
				// another's now): forgotten, and a process with none left is looked at in full next time. A file whose
				// fdinfo may not be read (the process's credentials changed since its fds were stat'ed) is a client
				// whose use is unknown: its process counts as unreadable, once.
				if errors.Is(err, fs.ErrPermission) && !denied {
					denied = true
					s.unreadable(err)
				}
				sc.forget(pid, p, j)
				j--
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
			cl := client{pid: pid, fd: f.FD, dev: dev, Client: *c}
			if k := cl.key(); !seen[k] {
				seen[k] = true
				s.clients = append(s.clients, cl)
			}
		}
	}
	return s
}

// look lists every fd of a process and stats each through its link, keeping the DRM device nodes, with their
// fdinfo files kept open; p is what was known of the process (nil for a new one).
//
// Listing the fds needs only the fd directory's permissions, which root has; following an fd's link, as stat does,
// and reading its fdinfo need ptrace read access to the process (the kernel's ptrace_may_access), which a reader
// without CAP_SYS_PTRACE, or confined by AppArmor, lacks for other processes: a stat that fails for that is the
// process's error, never a file closed since it was listed (ENOENT), lest an unreadable process read as one
// without a GPU.
func (sc *scanner) look(pid uint32, p *openFiles, limit int, now time.Time) (_ *openFiles, looked int, cut bool, err error) {
	sc.fds = sc.fds[:0]
	var statErr error
	looked, cut, err = sc.r.FDs(pid, limit, func(fd int, stat func() (procfs.FDTarget, error)) bool {
		t, err := stat()
		if err != nil {
			if procfs.Exited(err) {
				return true // closed since it was listed, or the process exited
			}
			statErr = fmt.Errorf("following %s/%d/fd/%d: %w", sc.root, pid, fd, err)
			return false
		}
		if minor, ok := t.CharDevice(DRMMajor); ok {
			sc.fds = append(sc.fds, procfs.DeviceFD{FD: fd, Minor: minor})
		}
		return true
	})
	if err == nil {
		err = statErr
	}
	if err != nil {
		if p != nil {
			sc.drop(pid, p)
		}
		return nil, looked, cut, err
	}
	tracked := true
	if p == nil {
		p = &openFiles{}
		// The next full looks of processes first seen together are spread over fullLookEvery.
		p.lastFull = now.Add(-time.Duration(pid%60) * fullLookEvery / 60)
		if tracked = len(sc.procs) < maxTracked; tracked {
			sc.procs[pid] = p
		}
	} else {
		p.lastFull = now
	}
	// Keep the DRM files still open under the same numbers with their fdinfo; open the new ones'.
	old := p.drm
	p.drm = make([]drmFile, 0, len(sc.fds))
	for _, f := range sc.fds {
		i := slices.IndexFunc(old, func(o drmFile) bool { return o.DeviceFD == f })
		if i >= 0 {
			p.drm = append(p.drm, old[i])
			old[i].info = nil
			continue
		}
		d := drmFile{DeviceFD: f}
		if tracked && sc.kept < maxKept {
			if k, err := sc.budget.OpenFDInfo(sc.r, pid, f.FD); err == nil {
				d.info = k
				sc.kept++
			}
		}
		p.drm = append(p.drm, d)
	}
	for _, o := range old {
		sc.close(o)
	}
	return p, looked, cut, nil
}

// read reads and parses one DRM file's fdinfo, through its kept file where it has one, into its client.
func (sc *scanner) read(pid uint32, f *drmFile) (*Client, error) {
	var b []byte
	var err error
	if f.info != nil {
		b, err = sc.r.ReadFDInfo(f.info)
	} else {
		b, err = sc.r.FDInfo(pid, f.FD)
	}
	if err != nil {
		return nil, err
	}
	if err := f.client.parse(b); err != nil {
		return nil, err
	}
	return &f.client, nil
}

// forget drops a process's j-th DRM file; a process with none left, or that exited, is looked at in full at the
// next reading.
func (sc *scanner) forget(pid uint32, p *openFiles, j int) {
	sc.close(p.drm[j])
	p.drm = slices.Delete(p.drm, j, j+1)
	if len(p.drm) == 0 {
		sc.drop(pid, p)
	}
}

// drop forgets a process.
func (sc *scanner) drop(pid uint32, p *openFiles) {
	for _, f := range p.drm {
		sc.close(f)
	}
	p.drm = nil
	delete(sc.procs, pid)
}

func (sc *scanner) close(f drmFile) {
	if f.info != nil {
		_ = f.info.Close()
		sc.kept--
	}
}

// closeAll closes every kept file.
func (sc *scanner) closeAll() {
	for pid, p := range sc.procs {
		sc.drop(pid, p)
	}
}
