// Package socket tells whether a container runtime's unix socket exists, cheaply enough to ask before every
// runtime call: a runtime that is not installed, or has not started yet, is then a definite answer instead of a
// failed dial, and one that starts after the exporter is found within an interval.
package socket

import (
	"os"
	"sync"
	"time"
)

// RecheckInterval is how long a Watch trusts its last look at the socket.
const RecheckInterval = 10 * time.Second

// Exists reports whether path is a unix socket (following links).
func Exists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// Watch remembers whether one socket exists, looking again (one stat) at most once per interval. It is safe for
// concurrent use.
type Watch struct {
	path  string
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	checked time.Time
	present bool
}

// NewWatch returns a Watch of the socket at path. A nil now is time.Now; every <= 0 is RecheckInterval.
func NewWatch(path string, every time.Duration, now func() time.Time) *Watch {
	if now == nil {
		now = time.Now
	}
	if every <= 0 {
		every = RecheckInterval
	}
	return &Watch{path: path, every: every, now: now}
}

// Path returns the watched path.
func (w *Watch) Path() string { return w.path }

// Present reports whether the socket existed when last looked at, looking again if that was an interval ago.
func (w *Watch) Present() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	if w.checked.IsZero() || now.Sub(w.checked) >= w.every || now.Before(w.checked) {
		w.present = Exists(w.path)
		w.checked = now
	}
	return w.present
}

// Gone records that a dial found no socket, so that calls stop until the next look finds it again.
func (w *Watch) Gone() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.present = false
	w.checked = w.now()
}
