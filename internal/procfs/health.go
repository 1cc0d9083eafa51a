package procfs

import (
	"log/slog"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
)

// Health logs procfs failures once per change of state, not on every scrape: a procfs that is not readable
// (hidepid, a missing --path.procfs mount) fails for every PID of every scrape, and one that is not the host's (a
// container's own /proc) has none of the GPU processes. The state is decided per Tally, one reading's reads:
// failing when any of them failed for a reason other than an exit, so that a reading with both readable and
// unreadable processes does not make it flap; missing when every one of its processes was missing. It is safe for
// concurrent use.
type Health struct {
	root   string
	logger *slog.Logger
	state  logstate.State
}

// NewHealth returns the Health of the proc filesystem at root, logging to logger.
func NewHealth(root string, logger *slog.Logger) *Health {
	return &Health{root: root, logger: logger}
}

// Tally is what one reading's procfs reads came to.
type Tally struct {
	Read     int // processes whose files were read
	missing  int // processes missing from procfs (exited, or never in this procfs)
	failures int // reads that failed for a reason other than an exit
	pid      uint32
	err      error // the first such failure, for the log
}

// Failed counts a read that failed for a reason other than an exit.
func (t *Tally) Failed(pid uint32, err error) {
	if t.failures == 0 {
		t.pid, t.err = pid, err
	}
	t.failures++
}

// Missing counts a process that procfs does not have (Exited).
func (t *Tally) Missing(pid uint32) {
	if t.failures == 0 && t.missing == 0 {
		t.pid = pid
	}
	t.missing++
}

// Health states.
const (
	stateFailing = "failing"
	stateMissing = "missing"
)

// Update sets the health from one reading's reads and logs when it changes. A reading that had no process to
// read says nothing, and leaves it as it was.
//
// A reading whose processes are all missing is most likely read from the wrong procfs, since the GPU listing and
// the procfs read are milliseconds apart; a single process that exits in between also shows as such, which is why
// this is a warning once per change and not an error.
func (h *Health) Update(t Tally) {
	var state string
	switch {
	case t.Read == 0 && t.failures == 0 && t.missing == 0:
		return
	case t.failures > 0:
		state = stateFailing
	case t.Read == 0:
		state = stateMissing
	}
	prev, changed := h.state.Set(state)
	if !changed {
		return
	}
	switch state {
	case stateFailing:
		h.logger.Warn("cannot read procfs: processes are left without identity (is --path.procfs the host's /proc?)",
			"procfs", h.root, "pid", t.pid, "err", t.err, "unreadable", t.failures, "readable", t.Read)
	case stateMissing:
		h.logger.Warn("none of the GPU processes is in procfs: they are left without identity "+
			"(is --path.procfs the host's /proc, with the host's PID namespace?)",
			"procfs", h.root, "missing", t.missing, "pid", t.pid)
	default:
		if prev == stateMissing {
			h.logger.Info("GPU processes are in procfs again", "procfs", h.root)
		} else {
			h.logger.Info("procfs readable again", "procfs", h.root)
		}
	}
}
