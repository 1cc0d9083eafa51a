// Package socket handles the unix sockets of the local daemons the exporter asks (container runtimes, the
// kubelet): it reads their unix:// endpoints, and tells whether a socket exists cheaply enough to ask before every
// call, so that a daemon that is not installed, or has not started yet, is a definite answer instead of a failed
// dial, and one that starts after the exporter is found within an interval.
package socket

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Path returns the filesystem path of a unix:///path endpoint (or a bare absolute path). Other schemes are refused:
// these APIs are never served over TCP on a node, and refusing keeps a typo from reaching the network.
func Path(endpoint string) (string, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok && !strings.HasPrefix(endpoint, "/") {
		return "", fmt.Errorf("%q: want unix:///path/to/socket", endpoint)
	}
	if !ok {
		path = endpoint
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%q: socket path must be absolute", endpoint)
	}
	return filepath.Clean(path), nil
}

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
