package reading

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// blockingSource answers each Snapshot only when the test releases it, and counts the calls.
type blockingSource struct {
	calls   atomic.Int32
	started chan struct{}
	release chan struct{}
	err     error
	snap    *gpu.Snapshot
}

func (s *blockingSource) Name() string { return "fake" }
func (s *blockingSource) Close() error { return nil }
func (s *blockingSource) Snapshot(ctx context.Context) (*gpu.Snapshot, error) {
	s.calls.Add(1)
	s.started <- struct{}{}
	<-s.release
	return s.snap, s.err
}

type noAttribution struct{}

func (noAttribution) Attribute(context.Context, *gpu.Snapshot) map[uint32]attribution.Owner {
	return nil
}

func newBlocking() *blockingSource {
	return &blockingSource{started: make(chan struct{}, 16), release: make(chan struct{}), snap: &gpu.Snapshot{}}
}

func TestConcurrentScrapesShareOneReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newBlocking()
		s := New(src, noAttribution{}, time.Minute, slog.New(slog.DiscardHandler))
		var wg sync.WaitGroup
		results := make([]*Reading, 5)
		for i := range results {
			wg.Go(func() {
				r, err := s.Read(context.Background())
				if err != nil {
					t.Error(err)
				}
				results[i] = r
			})
		}
		// Every scrape must have joined the reading before it lands: wait until they all block on it.
		synctest.Wait()
		close(src.release)
		wg.Wait()
		if n := src.calls.Load(); n != 1 {
			t.Fatalf("5 concurrent scrapes read the source %d times, want 1", n)
		}
		for _, r := range results[1:] {
			if r != results[0] {
				t.Fatal("concurrent scrapes got different results")
			}
		}
	})
}

// timedSource has a timeout of its own and records the deadline of the reading it is called with.
type timedSource struct {
	blockingSource
	timeout  time.Duration
	deadline time.Time
}

func (s *timedSource) Timeout() time.Duration { return s.timeout }
func (s *timedSource) Snapshot(ctx context.Context) (*gpu.Snapshot, error) {
	s.deadline, _ = ctx.Deadline()
	return &gpu.Snapshot{}, nil
}

// The reading leaves a source with a timeout of its own that long, then the collection timeout for attribution,
// so that a source slower than the scrape's wait is not cut short by the reading's deadline.
func TestReadingDeadlineFollowsTheSourceTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &timedSource{timeout: 30 * time.Second}
		s := New(src, noAttribution{}, 8*time.Second, slog.New(slog.DiscardHandler))
		start := time.Now()
		if _, err := s.Read(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got, want := src.deadline.Sub(start), 38*time.Second; got != want {
			t.Errorf("reading deadline %v after the scrape, want %v", got, want)
		}
	})
}

// inflightWaiters reports whether a reading is in flight; scrapes started before it lands all share it.
func inflightWaiters(s *Reader) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight != nil
}

func TestTimedOutScrapeAnswersAndNextJoinsTheSameReading(t *testing.T) {
	src := newBlocking()
	s := New(src, noAttribution{}, 50*time.Millisecond, slog.New(slog.DiscardHandler))

	_, err := s.Read(context.Background())
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("scrape of a stuck source = %v, want ErrTimeout", err)
	}
	if got := testutil.ToFloat64(s.timeouts); got != 1 {
		t.Errorf("timeouts = %v, want 1", got)
	}
	if got := testutil.ToFloat64(s.up.WithLabelValues("fake")); got != 0 {
		t.Errorf("source_up after a timeout = %v, want 0", got)
	}
	// The stuck reading is still the only one: more scrapes must not start more.
	for range 3 {
		if _, err := s.Read(context.Background()); !errors.Is(err, ErrTimeout) {
			t.Fatalf("scrape = %v, want ErrTimeout", err)
		}
	}
	if n := src.calls.Load(); n != 1 {
		t.Fatalf("source read %d times while stuck, want 1 (no pile-up)", n)
	}
	close(src.release)
	testkit.WaitFor(t, 5*time.Second, "the stuck reading to land", func() bool { return !inflightWaiters(s) })
	if _, err := s.Read(context.Background()); err != nil {
		t.Fatalf("scrape after the source recovered = %v", err)
	}
	if got := testutil.ToFloat64(s.up.WithLabelValues("fake")); got != 1 {
		t.Errorf("source_up after recovery = %v, want 1", got)
	}
}

func TestSourceErrorsAreCounted(t *testing.T) {
	src := newBlocking()
	close(src.release)
	src.err = errors.New("NVML: GPU is lost")
	s := New(src, noAttribution{}, time.Minute, slog.New(slog.DiscardHandler))
	if _, err := s.Read(context.Background()); err == nil || !strings.Contains(err.Error(), "GPU is lost") {
		t.Fatalf("scrape = %v", err)
	}
	if got := testutil.ToFloat64(s.errors.WithLabelValues("fake")); got != 1 {
		t.Errorf("collection errors = %v, want 1", got)
	}

	src.err = nil
	src.snap = &gpu.Snapshot{Errors: []gpu.DeviceError{{Index: 3, Operation: "processes", Err: errors.New("timeout")}}}
	if _, err := s.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.deviceErrors.WithLabelValues("fake", "3", "processes")); got != 1 {
		t.Errorf("device errors for GPU 3 = %v, want 1", got)
	}
}

// scriptedSource answers each reading with the next error of its script (nil: a good reading).
type scriptedSource struct{ errs []error }

func (s *scriptedSource) Name() string { return "fake" }
func (s *scriptedSource) Close() error { return nil }
func (s *scriptedSource) Snapshot(context.Context) (*gpu.Snapshot, error) {
	err := s.errs[0]
	s.errs = s.errs[1:]
	if err != nil {
		return nil, err
	}
	return &gpu.Snapshot{}, nil
}

// A problem is logged when it starts and when it ends, not once per scrape: errors whose text changes from one
// reading to the next (here the PID of a timed-out nvidia-smi) are the same problem.
func TestProblemsAreLoggedOncePerChangeOfKind(t *testing.T) {
	timeout := func(pid int) error {
		return fmt.Errorf("nvidia-smi (pid %d) killed after 6s: %w", pid, context.DeadlineExceeded)
	}
	src := &scriptedSource{errs: []error{timeout(10), timeout(11), timeout(12), timeout(13),
		errors.New("exit status 9"), errors.New("exit status 9"), nil, nil}}
	h := &testkit.Logs{}
	s := New(src, noAttribution{}, time.Minute, slog.New(h))
	for range 8 {
		s.Read(context.Background())
	}
	if h.Count(slog.LevelError) != 2 || h.Count(slog.LevelInfo) != 1 {
		t.Errorf("logged %d errors and %d infos over 4 timeouts, 2 failures and a recovery; want 2 and 1",
			h.Count(slog.LevelError), h.Count(slog.LevelInfo))
	}
}

// Scrapes that time out waiting for a reading that never finishes are logged once, not once per scrape.
func TestCollectionTimeoutsAreLoggedOnce(t *testing.T) {
	src := newBlocking()
	defer close(src.release)
	h := &testkit.Logs{}
	s := New(src, noAttribution{}, 10*time.Millisecond, slog.New(h))
	for range 5 {
		if _, err := s.Read(context.Background()); !errors.Is(err, ErrTimeout) {
			t.Fatalf("scrape = %v, want ErrTimeout", err)
		}
	}
	if h.Count(slog.LevelError) != 1 {
		t.Errorf("logged %d errors over 5 timed-out scrapes, want 1", h.Count(slog.LevelError))
	}
}

// A source that flaps between too slow and fine at every scrape logs a burst of its changes, then holds them: the
// next line, once the limit allows, says how many there were.
func TestFlappingSourceIsRateLimited(t *testing.T) {
	const flaps = 20
	var errs []error
	for i := range flaps + 1 {
		var err error
		if i%2 == 0 && i < flaps {
			err = fmt.Errorf("nvidia-smi timed out: %w", context.DeadlineExceeded)
		}
		errs = append(errs, err)
	}
	h := &testkit.Logs{}
	s := New(&scriptedSource{errs: errs}, noAttribution{}, time.Minute, slog.New(h))
	now := time.Unix(1000, 0)
	s.problem.Now = func() time.Time { return now }
	for range flaps {
		s.Read(context.Background())
		now = now.Add(time.Second)
	}
	if n := h.CountAtLeast(slog.LevelInfo); n != logstate.LimitBurst {
		t.Errorf("%d lines over %d changes within a minute, want the burst of %d", n, flaps, logstate.LimitBurst)
	}
	now = now.Add(logstate.LimitEvery)
	s.Read(context.Background())
	var held int64
	for _, r := range h.Records() {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "changes_not_logged" {
				held = a.Value.Int64()
			}
			return true
		})
	}
	if n := h.CountAtLeast(slog.LevelInfo); n != logstate.LimitBurst+1 || held != flaps-logstate.LimitBurst {
		t.Errorf("a minute later: %d lines, the last counting %d changes not logged; want %d and %d",
			n, held, logstate.LimitBurst+1, flaps-logstate.LimitBurst)
	}
}
