// Package socket handles the unix sockets of the local daemons the exporter asks (container runtimes, the
// kubelet): it reads their unix:// endpoints, dials their gRPC APIs, and tells whether a socket exists cheaply
// enough to ask before every call, so that a daemon that is not installed, or has not started yet, is a definite
// answer instead of a failed dial, and one that starts after the exporter is found within an interval.
package socket

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
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

// DialGRPC returns a client of the gRPC API served on the unix socket at path, without connecting. The socket is
// local, so there is no TLS; answers are bounded to maxRecv bytes, and reconnects back off at most maxDelay, so
// that a daemon that restarts is asked again within about that long rather than gRPC's default two minutes.
func DialGRPC(path string, maxRecv int, maxDelay time.Duration) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecv)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxDelay},
			MinConnectTimeout: time.Second,
		}),
	)
}

// RecheckInterval is how long a Watch trusts its last look at the sockets.
const RecheckInterval = 10 * time.Second

// Exists reports whether path is a unix socket (following links).
func Exists(path string) bool { return Check(path) == nil }

// Check returns nil when path is a unix socket (following links), else why not; nothing at path is an error
// wrapping fs.ErrNotExist.
func Check(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s is not a unix socket", path)
	}
	return nil
}

// Watch remembers which of some sockets exist, looking again (one stat each) at most once per interval, so that a
// daemon that is not there costs one stat per interval and one that starts later is found within one. It is safe
// for concurrent use.
type Watch struct {
	paths []string
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	checked time.Time
	found   []string
}

// NewWatch returns a Watch of the sockets at paths. A nil now is time.Now; every <= 0 is RecheckInterval.
func NewWatch(paths []string, every time.Duration, now func() time.Time) *Watch {
	if now == nil {
		now = time.Now
	}
	if every <= 0 {
		every = RecheckInterval
	}
	return &Watch{paths: paths, every: every, now: now}
}

// Found returns the watched paths that were unix sockets when last looked at, looking again if that was an
// interval ago; looked says whether it did. A socket listed under two names (/var/run is usually a link to /run)
// is returned once, under the first.
func (w *Watch) Found() (found []string, looked bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	if w.checked.IsZero() || now.Sub(w.checked) >= w.every || now.Before(w.checked) {
		w.found, w.checked, looked = w.look(), now, true
	}
	return w.found, looked
}

// look returns the paths that are unix sockets, once each.
func (w *Watch) look() []string {
	var found []string
	seen := make(map[string]bool)
	for _, path := range w.paths {
		if !Exists(path) {
			continue
		}
		real := path
		if r, err := filepath.EvalSymlinks(path); err == nil {
			real = r
		}
		if !seen[real] {
			seen[real] = true
			found = append(found, path)
		}
	}
	return found
}

// Present reports whether any watched socket existed when last looked at, looking again if that was an interval
// ago.
func (w *Watch) Present() bool {
	found, _ := w.Found()
	return len(found) > 0
}

// Gone records that a dial found no socket, so that calls stop until the next look finds one again.
func (w *Watch) Gone() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.found = nil
	w.checked = w.now()
}
