package server

import (
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// errorLogInterval is how often at most a line of one kind from the HTTP server reaches the log.
const errorLogInterval = time.Minute

// errorLog is the HTTP server's error log, into the exporter's log at WARN. The server writes a line per
// connection for what any client can cause (a failed TLS handshake: a port scan, a probe without TLS, a client that
// does not trust the certificate), so each kind of line is logged when it starts, and after that at most once per
// interval, with how many like it were left out.
func errorLog(logger *slog.Logger, every time.Duration) *log.Logger {
	return log.New(&limitedLog{logger: logger, every: every, kinds: map[string]*lineKind{}}, "", 0)
}

// limitedLog is errorLog's writer; the server writes one line per call.
type limitedLog struct {
	logger *slog.Logger
	every  time.Duration
	mu     sync.Mutex
	kinds  map[string]*lineKind
}

// lineKind is what was logged of one kind of line.
type lineKind struct {
	logged  time.Time // when a line of the kind was last logged
	left    int       // lines left out since
	latest  string    // the last one left out
	pending bool      // a summary of left-out lines is due at logged + every
}

// maxLineKinds bounds the kinds remembered; lines of further kinds share one.
const maxLineKinds = 32

func (w *limitedLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	kind := kindOf(line)
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	k, ok := w.kinds[kind]
	if !ok {
		if len(w.kinds) >= maxLineKinds {
			kind = ""
			k = w.kinds[kind]
		}
		if k == nil {
			k = &lineKind{}
			w.kinds[kind] = k
		}
	}
	if !k.pending && now.Sub(k.logged) >= w.every {
		k.logged = now
		w.logger.Warn(line)
		return len(p), nil
	}
	k.left++
	k.latest = line
	if !k.pending {
		k.pending = true
		time.AfterFunc(k.logged.Add(w.every).Sub(now), func() { w.summarize(k) })
	}
	return len(p), nil
}

// summarize logs the last line left out of a kind, with how many were; the next line after a quiet interval is
// logged at once again.
func (w *limitedLog) summarize(k *lineKind) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.logger.Warn(k.latest, "similar_lines_left_out", k.left-1, "over", w.every)
	k.logged, k.left, k.latest, k.pending = time.Now(), 0, "", false
}

// kindOf is a line's kind: its first words up to the first that holds a digit (an address, a port), at most four.
// "http: TLS handshake error from 10.0.0.1:5: EOF" is of the kind "http: TLS handshake error".
func kindOf(line string) string {
	words := strings.Fields(line)
	n := 0
	for n < len(words) && n < 4 && !strings.ContainsAny(words[n], "0123456789") {
		n++
	}
	return strings.Join(words[:n], " ")
}
