// Package testkit is what the tests share: waiting for a condition, recording logs, a buffer that one goroutine
// writes while another reads, short directories for unix sockets, a gRPC server on one, a self-signed TLS
// certificate, and client_golang's text exposition of metric families. Only tests import it.
package testkit

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// maxPoll is the longest pause between two looks at a condition: polls start at a millisecond, for unit tests
// whose conditions hold within microseconds, and back off to this, for end-to-end tests that scrape or query a
// server at each look.
const maxPoll = 100 * time.Millisecond

// WaitFor polls cond until it holds, and fails the test if limit passes first.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	problems := Eventually(limit, func() []string {
		if cond() {
			return nil
		}
		return []string{what}
	})
	if problems != nil {
		t.Fatalf("timed out after %s waiting for %s", limit, what)
	}
}

// Eventually polls check until it reports no problem or limit passes, and returns the last problems (nil on
// success), for a test that says what was still wrong.
func Eventually(limit time.Duration, check func() []string) []string {
	deadline := time.Now().Add(limit)
	for pause := time.Millisecond; ; pause = min(2*pause, maxPoll) {
		p := check()
		if len(p) == 0 || time.Now().After(deadline) {
			return p
		}
		time.Sleep(pause)
	}
}

// Within runs f and returns what it returns, and fails the test at once if f has not returned after limit: for a
// call that must not block (a read of what may be a FIFO), where waiting for it would hang the test instead.
func Within(t testing.TB, limit time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("%s: still blocked after %s", what, limit)
		return nil
	}
}

// Logs is a slog.Handler that keeps every record, for a test to count what was logged. It is safe for concurrent
// use; the zero value is ready.
type Logs struct {
	mu      sync.Mutex
	records []slog.Record
}

// Enabled implements slog.Handler: every level is kept.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// WithAttrs implements slog.Handler; the attributes are not kept.
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler.
func (l *Logs) WithGroup(string) slog.Handler { return l }

// Count returns how many records were logged at level.
func (l *Logs) Count(level slog.Level) int {
	return l.count(func(lvl slog.Level) bool { return lvl == level })
}

// CountAtLeast returns how many records were logged at level or above.
func (l *Logs) CountAtLeast(level slog.Level) int {
	return l.count(func(lvl slog.Level) bool { return lvl >= level })
}

// Messages returns the messages logged at level, in order.
func (l *Logs) Messages(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var msgs []string
	for _, r := range l.records {
		if r.Level == level {
			msgs = append(msgs, r.Message)
		}
	}
	return msgs
}

// Records returns every record logged, in order.
func (l *Logs) Records() []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.records)
}

func (l *Logs) count(match func(slog.Level) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if match(r.Level) {
			n++
		}
	}
	return n
}

// SyncBuffer is a bytes.Buffer that one goroutine may write while another reads it: a log sink or a child
// process's output that a test looks at before it ends. The zero value is ready.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// SocketDir returns a new directory for unix sockets, removed when the test ends. A socket's path must fit in 108
// bytes, which one in t.TempDir() may not.
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// ServeGRPC serves the services that register adds on a new unix socket at path, until the test ends or the
// returned server is stopped (which removes the socket, as a daemon's shutdown does).
func ServeGRPC(t testing.TB, path string, register func(*grpc.Server)) *grpc.Server {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return srv
}

// Exited reports whether the process with this PID has exited. A zombie counts: it holds nothing, and reaping an
// orphan is init's job.
func Exited(pid string) bool {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && bytes.HasPrefix(stat[i:], []byte(") Z"))
}
