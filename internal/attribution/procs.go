package attribution

import (
	"errors"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/cgroup"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
)

// procEntry is what the cgroup file of one process told.
type procEntry struct {
	start     uint64 // start time, clock ticks after boot
	identity  Identity
	outer     string
	delegated bool
	// stat is the process's open stat file (comm on the kernel's procfs, see keptComm), read again at the next
	// scrape; nil past maxOpenStat.
	stat *procfs.KeptFile
}

// maxOpenStat bounds the stat files kept open: one per GPU process, up to this many; the processes beyond it are
// read by path, three system calls instead of one.
const maxOpenStat = 4096

func (e *procEntry) closeStat() {
	if e.stat != nil {
		_ = e.stat.Close()
		e.stat = nil
	}
}

// fromProcFS reads what procfs tells about one process, and returns it with the ID of the pod's container that
// holds the process's container, if any (cgroup.Info.OuterContainerID), and whether its cgroup is below a user
// manager (cgroup.Info.UserManager). A process that has exited keeps the source's name and an empty identity. The
// cgroup file of a process seen at the last reading, with the same start time, is not read again; seen gets the
// process's entry.
func (a *Attributor) fromProcFS(r *procfs.Reader, p gpu.Process, tally *procfs.Tally, seen map[uint32]*procEntry) (Owner, string, bool) {
	o := Owner{Name: p.Name}
	comm, start, stat, err := a.readStat(r, p.PID, len(seen) < maxOpenStat)
	if err != nil {
		a.procfsFailed(p.PID, err, tally)
		return o, "", false
	}
	if comm != "" {
		o.Name = comm
	}
	if !a.boot.IsZero() {
		o.Started = procfs.Started(a.boot, start)
	}
	if e, ok := a.procs[p.PID]; ok && e.start == start {
		tally.Read++
		e.stat = stat
		seen[p.PID] = e
		o.Identity = e.identity
		return o, e.outer, e.delegated
	}
	content, err := r.Cgroup(p.PID)
	if err != nil {
		if stat != nil {
			_ = stat.Close()
		}
		a.procfsFailed(p.PID, err, tally)
		return o, "", false
	}
	tally.Read++
	info := cgroup.Parse(content)
	// Parse returns substrings of the file, and the entry below lives as long as the process: copied, the IDs no
	// longer hold the whole file (2.5 KB on a kubelet's cgroup v1 node, 6 MB of live heap at 2,048 processes).
	o.Identity = Identity{
		PodUID:      strings.Clone(info.PodUID),
		ContainerID: strings.Clone(info.ContainerID),
		Runtime:     info.Runtime,
		QoS:         info.QoS,
		SlurmJobID:  strings.Clone(info.SlurmJobID),
		SystemdUnit: strings.Clone(info.SystemdUnit),
	}
	outer := strings.Clone(info.OuterContainerID)
	if a.users != nil {
		// A process that exited in between keeps no user; its other labels are still right.
		o.Identity.User, _ = a.users.User(p.PID)
	}
	delegated := info.UserManager != ""
	seen[p.PID] = &procEntry{start: start, identity: o.Identity, outer: outer, delegated: delegated, stat: stat}
	return o, outer, delegated
}

// readStat reads the name and start time of pid: through the file kept open from the last scrape (stat, or comm on
// the kernel's procfs), or else by opening it, and keeping it open when keep is set. A kept file that fails to read
// belongs to a process that has exited (ESRCH), whose PID may now be another's: it is closed and the PID's file
// opened anew.
func (a *Attributor) readStat(r *procfs.Reader, pid uint32, keep bool) (string, uint64, *procfs.KeptFile, error) {
	if e, ok := a.procs[pid]; ok && e.stat != nil {
		f := e.stat
		e.stat = nil // the caller owns it now: keeps it in its entry of seen, or closes it
		if a.keptComm {
			if comm, err := r.ReadComm(f); err == nil {
				return comm, e.start, f, nil // the same process: its start time is what it was
			}
		} else if comm, start, err := r.ReadStat(f); err == nil {
			return comm, start, f, nil
		}
		_ = f.Close()
	}
	var f *procfs.KeptFile
	err := procfs.ErrNoKeptRoom
	switch {
	case !keep:
	case a.keptComm:
		f, err = a.kept.OpenComm(r, pid)
	default:
		f, err = a.kept.OpenStat(r, pid)
	}
	if errors.Is(err, procfs.ErrNoKeptRoom) { // past the file budget: read by path, as often as it takes
		comm, start, err := r.Stat(pid)
		return comm, start, nil, err
	}
	if err != nil {
		return "", 0, nil, err
	}
	var comm string
	var start uint64
	if a.keptComm {
		// comm is opened before stat is read: it is then tied to the process whose start time is read, or to one
		// that exited before it, whose file fails at the next scrape and is opened anew.
		comm, start, err = r.Stat(pid)
	} else {
		comm, start, err = r.ReadStat(f)
	}
	if err != nil {
		_ = f.Close()
		return "", 0, nil, err
	}
	return comm, start, f, nil
}

// procfsFailed counts a failed procfs read: an exited process is normal, anything else tells on procfs's health.
func (a *Attributor) procfsFailed(pid uint32, err error, tally *procfs.Tally) {
	if procfs.Exited(err) {
		a.metrics.procfsErrors.WithLabelValues("exited").Inc()
		tally.Missing(pid)
		a.logger.Debug("GPU process exited before it could be attributed", "pid", pid, "err", err)
		return
	}
	a.metrics.procfsErrors.WithLabelValues("other").Inc()
	tally.Failed(pid, err)
	a.logger.Debug("cannot read procfs", "pid", pid, "err", err)
}
