package nvidiasmi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
)

// Defaults for Config fields left zero.
const (
	DefaultPath    = "nvidia-smi"
	DefaultTimeout = 6 * time.Second
	// DefaultMaxOutputBytes is sized to real outputs: one GPU prints about 45 KB (testdata's RTX 3090s: 178 KB
	// for four, most of it the supported clocks table), so 4 MiB holds 16 GPUs and their processes several times
	// over, while a flooding or broken nvidia-smi costs a few MiB, not hundreds.
	DefaultMaxOutputBytes = 4 << 20
	// waitDelay bounds how long a run waits for stdout and stderr to close after nvidia-smi exited or was killed:
	// a helper that escaped the process group and holds the pipe must not hold the scrape.
	waitDelay = 500 * time.Millisecond
	// stderrLimit keeps enough of stderr for the error message.
	stderrLimit = 64 << 10
	// maxKeptOutput bounds the output buffer kept from one run for the next: 8 GPUs write about 400 KB.
	maxKeptOutput = 4 << 20
)

// Config configures the nvidia-smi source.
type Config struct {
	// Path is the nvidia-smi program: a name looked up in $PATH, or a path. Default "nvidia-smi".
	Path string
	// Timeout bounds one run of nvidia-smi, which can hang for minutes on a GPU that fell off the bus.
	// Default 6s.
	Timeout time.Duration
	// MaxOutputBytes bounds what is read from nvidia-smi's stdout; a run that prints more fails. Default
	// DefaultMaxOutputBytes.
	MaxOutputBytes int
	Logger         *slog.Logger
}

// Error is a failed run. Kind says what failed, for callers that tell failures apart: "start", "timeout" (the
// run's own timeout or the caller's context), "exit", "output" (too much output), "parse" or "closed".
type Error struct {
	Kind string
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Is makes a run that timed out a context.DeadlineExceeded, as an NVML call past its deadline is: a caller tells a
// source that is too slow from one that fails without knowing which source it is.
func (e *Error) Is(target error) bool {
	return target == context.DeadlineExceeded && e.Kind == "timeout"
}

// Source runs `nvidia-smi -q -x` for each snapshot. Like every gpu.Source it is called one snapshot at a time;
// reading.Reader makes concurrent scrapes share one run.
type Source struct {
	path      string
	timeout   time.Duration
	maxOutput int
	logger    *slog.Logger

	// base is cancelled by Close and stops the run in flight.
	base    context.Context
	stop    context.CancelFunc
	running sync.WaitGroup

	mu     sync.Mutex
	closed bool

	last []byte // the last run's output buffer, for the next run (one runs at a time)

	// leftovers ("killed" after a run whose leftover processes were killed) and stderr (what the last run wrote
	// there) are logged when they change, not at every scrape while a helper keeps lingering or a GPU stays
	// unreadable.
	leftovers, stderr *logstate.State
}

// errRunTimeout is the cause of a run that took longer than Config.Timeout.
var errRunTimeout = errors.New("nvidia-smi run timed out")

// New checks that nvidia-smi can be found and returns the source. The error wraps exec.ErrNotFound (or the file
// system error for an explicit path), so that --gpu.source=auto can tell "not installed" from other failures.
func New(cfg Config) (*Source, error) {
	if cfg.Path == "" {
		cfg.Path = DefaultPath
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	path, err := exec.LookPath(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi source: %q not found (install the NVIDIA driver utilities, or mount "+
			"nvidia-smi into the container and set --nvidia-smi.path): %w", cfg.Path, err)
	}
	base, stop := context.WithCancel(context.Background())
	return &Source{
		path:      path,
		timeout:   cfg.Timeout,
		maxOutput: cfg.MaxOutputBytes,
		logger:    cfg.Logger,
		base:      base,
		stop:      stop,
		leftovers: logstate.Limited(),
		stderr:    logstate.Limited(),
	}, nil
}

// Name implements gpu.Source.
func (s *Source) Name() string { return "nvidia-smi" }

// Timeout implements gpu.Timeouter: a snapshot takes at most one run's timeout.
func (s *Source) Timeout() time.Duration { return s.timeout }

// Snapshot implements gpu.Source: one run of nvidia-smi, which ends when ctx does, at the run's timeout, or at
// Close, whichever comes first.
func (s *Source) Snapshot(ctx context.Context) (*gpu.Snapshot, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("nvidia-smi source is closed")
	}
	s.running.Add(1)
	s.mu.Unlock()
	defer s.running.Done()
	return s.run(ctx)
}

// Close stops a run in flight, waits for it to be reaped, and makes later Snapshot calls fail.
func (s *Source) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stop()
	s.running.Wait()
	return nil
}

// run executes nvidia-smi once. nvidia-smi runs in a process group of its own, and on timeout the whole group is
// killed, so that helpers it forked die with it; WaitDelay then bounds the wait for pipes that something outside
// the group still holds.
func (s *Source) run(ctx context.Context) (*gpu.Snapshot, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeoutCause(ctx, s.timeout, errRunTimeout)
	defer cancel()
	defer context.AfterFunc(s.base, cancel)()

	stdout := &limitedBuffer{limit: s.maxOutput, onOverflow: cancel}
	// The last run's buffer, if it is not too large to keep: the output is about the same size every time, and
	// growing a new buffer to it is a scrape's largest allocation.
	stdout.buf = *bytes.NewBuffer(s.last[:0])
	defer func() {
		if b := stdout.Bytes(); cap(b) <= maxKeptOutput {
			s.last = b[:0]
		} else {
			s.last = nil
		}
	}()
	stderr := &limitedBuffer{limit: stderrLimit}
	cmd := exec.CommandContext(ctx, s.path, "-q", "-x")
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The group id is the child's PID (Setpgid with Pgid 0). Until Wait reaps the child the PID cannot be
		// reused, so this cannot hit another group.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = waitDelay

	if err := cmd.Start(); err != nil {
		return nil, &Error{Kind: "start", Err: fmt.Errorf("starting nvidia-smi: %w", err)}
	}
	pid := cmd.Process.Pid
	waitErr := cmd.Wait()
	elapsed := time.Since(start)

	killed := false
	if errors.Is(waitErr, exec.ErrWaitDelay) {
		// nvidia-smi exited, but a process it left behind kept stdout open. If that process is still in the group,
		// the group still exists (so its id is still ours): kill it rather than leak it once per scrape.
		killed = syscall.Kill(-pid, syscall.SIGKILL) == nil
	}
	s.logLeftovers(killed, pid)

	if stdout.overflow {
		return nil, &Error{Kind: "output", Err: fmt.Errorf("nvidia-smi printed more than %d bytes", s.maxOutput)}
	}
	// A run that ended well is used even if the deadline passed in the meantime; ErrWaitDelay alone means only
	// that a leftover process held the pipes after nvidia-smi exited successfully.
	if waitErr != nil && !errors.Is(waitErr, exec.ErrWaitDelay) {
		return nil, s.runError(ctx, waitErr, stdout, stderr)
	}
	snap, err := parse(stdout.Bytes())
	if err != nil {
		return nil, &Error{Kind: "parse", Err: fmt.Errorf("parsing nvidia-smi output: %w", err)}
	}
	snap.Time = start
	// A GPU nvidia-smi cannot open is left out of the XML (Parse reports the count mismatch) and named only on
	// stderr; say what it said.
	msg := firstLine(stderr.Bytes())
	if c := s.stderr.Update(msg); c.Log && msg != "" {
		s.logger.Warn("nvidia-smi wrote to stderr", unlogged(c, "stderr", msg)...)
	}
	s.logger.Debug("ran nvidia-smi", "duration", elapsed, "bytes", len(stdout.Bytes()), "devices", len(snap.Devices))
	return snap, nil
}

// logLeftovers logs that a run left processes holding its output, killed (with the group id of the run that did),
// when that starts, and when it stops.
func (s *Source) logLeftovers(killed bool, pgid int) {
	state := ""
	if killed {
		state = "killed"
	}
	switch c := s.leftovers.Update(state); {
	case !c.Log:
	case killed:
		s.logger.Warn("killed processes that nvidia-smi left holding its output; logged again when runs stop leaving them",
			unlogged(c, "pgid", pgid)...)
	default:
		s.logger.Info("nvidia-smi no longer leaves processes holding its output", unlogged(c)...)
	}
}

// unlogged adds to a log line's attributes how many changes the rate limit held back before it.
func unlogged(c logstate.Change, attrs ...any) []any {
	if c.Unlogged > 0 {
		attrs = append(attrs, "changes_not_logged", c.Unlogged)
	}
	return attrs
}

// runError says why a run failed.
func (s *Source) runError(ctx context.Context, waitErr error, stdout, stderr *limitedBuffer) error {
	switch {
	case errors.Is(context.Cause(ctx), errRunTimeout):
		return &Error{Kind: "timeout", Err: fmt.Errorf("nvidia-smi timed out after %s", s.timeout)}
	case s.base.Err() != nil:
		return &Error{Kind: "closed", Err: errors.New("nvidia-smi stopped: source closed")}
	case ctx.Err() != nil:
		return &Error{Kind: "timeout", Err: fmt.Errorf("nvidia-smi stopped: %w", ctx.Err())}
	}
	var exitErr *exec.ExitError
	if !errors.As(waitErr, &exitErr) {
		return &Error{Kind: "exit", Err: fmt.Errorf("running nvidia-smi: %w", waitErr)}
	}
	msg := firstLine(stderr.Bytes())
	if msg == "" {
		// nvidia-smi prints many of its errors ("NVIDIA-SMI has failed because it couldn't communicate with the
		// NVIDIA driver…") on stdout.
		msg = firstLine(stdout.Bytes())
	}
	if msg == "" {
		msg = "no output"
	}
	if fix := gpu.DriverFix(msg); fix != "" {
		msg += " (" + fix + ")"
	}
	if exitErr.Exited() {
		return &Error{Kind: "exit", Err: fmt.Errorf("nvidia-smi exited with status %d: %s", exitErr.ExitCode(), msg)}
	}
	return &Error{Kind: "exit", Err: fmt.Errorf("nvidia-smi ended by %s: %s", exitErr, msg)}
}

// limitedBuffer keeps up to limit bytes. Past the limit it discards, records the overflow and calls onOverflow
// (which kills the run: there is no point reading garbage to the timeout).
type limitedBuffer struct {
	mu         sync.Mutex
	buf        bytes.Buffer
	limit      int
	overflow   bool
	onOverflow func()
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.limit - b.buf.Len(); len(p) > room {
		if room > 0 {
			b.buf.Write(p[:room])
		}
		if !b.overflow && b.onOverflow != nil {
			b.overflow = true
			b.onOverflow()
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *limitedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Bytes()
}

// firstLine returns the first non-blank line, shortened for an error message.
func firstLine(b []byte) string {
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			if len(line) > 200 {
				line = line[:200] + "…"
			}
			return strings.ToValidUTF8(line, "\uFFFD")
		}
	}
	return ""
}
