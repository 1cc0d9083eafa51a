// Package reading takes one attributed reading of the node: a GPU snapshot, then the owner of every GPU process.
// One reading is in flight at a time, the only place that serializes calls to the GPU source; concurrent scrapes
// share it, and a scrape waits for it no longer than the collection timeout.
package reading

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/logstate"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/selfmetrics"
)

// ErrTimeout is returned when a reading took longer than the collection timeout. The reading goes on in the
// background and the next scrape joins it instead of starting another.
var ErrTimeout = errors.New("collection timed out")

// Attributor finds the owners of a snapshot's processes.
type Attributor interface {
	Attribute(ctx context.Context, snap *gpu.Snapshot) map[uint32]attribution.Owner
}

// Reading is one attributed reading of the node.
type Reading struct {
	Snapshot *gpu.Snapshot
	Owners   map[uint32]attribution.Owner
}

// Owner returns the owner of a process, with the source's process name when attribution learned nothing.
func (r *Reading) Owner(p gpu.Process) attribution.Owner {
	if o, ok := r.Owners[p.PID]; ok {
		return o
	}
	return attribution.Owner{Name: p.Name}
}

// Reader reads the node on demand.
type Reader struct {
	source     gpu.Source
	attributor Attributor
	timeout    time.Duration
	// readTimeout is the deadline of one reading: the source's own timeout (the collection timeout when it has
	// none), then the collection timeout again for attribution.
	readTimeout time.Duration
	logger      *slog.Logger

	mu       sync.Mutex
	inflight *flight
	problem  *logstate.State // logged once per change, not once per scrape, and rate-limited when it flaps

	duration     *prometheus.GaugeVec
	up           *prometheus.GaugeVec
	errors       *prometheus.CounterVec
	deviceErrors *prometheus.CounterVec
	timeouts     prometheus.Counter
	self         selfmetrics.Set // all of the above
}

type flight struct {
	done chan struct{}
	res  *Reading
	err  error
}

// New returns a Reader. timeout bounds how long one scrape waits for a reading.
func New(source gpu.Source, attributor Attributor, timeout time.Duration, logger *slog.Logger) *Reader {
	sourceTimeout := timeout
	if t, ok := source.(gpu.Timeouter); ok {
		sourceTimeout = t.Timeout()
	}
	s := &Reader{
		source:      source,
		attributor:  attributor,
		timeout:     timeout,
		readTimeout: sourceTimeout + timeout,
		logger:      logger,
		problem:     logstate.Limited(),
		duration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_pod_exporter_collection_duration_seconds",
			Help: "How long the last reading of the GPU source and attribution took.",
		}, []string{"source"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: families.SourceUp.Name,
			Help: "1 if the last reading of the GPU source succeeded, 0 if it failed or timed out.",
		}, []string{"source"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_pod_exporter_collection_errors_total",
			Help: "Readings of the GPU source that failed as a whole.",
		}, []string{"source"}),
		deviceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_pod_exporter_device_errors_total",
			Help: "Failures to read one GPU or one of its properties, by GPU index (empty when not tied to one) and operation.",
		}, []string{"source", "gpu", "operation"}),
		timeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_pod_exporter_collection_timeouts_total",
			Help: "Scrapes that gave up waiting for a reading after the collection timeout.",
		}),
	}
	s.self = selfmetrics.Set{s.duration, s.up, s.errors, s.deviceErrors, s.timeouts}
	// A counter that exists from the start lets rate() and increase() see the first failure.
	s.errors.WithLabelValues(source.Name())
	return s
}

// Scrape returns a fresh reading, joining the one in flight if there is one. It waits at most the collection
// timeout, or less if ctx ends sooner.
func (s *Reader) Read(ctx context.Context) (*Reading, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()

	s.mu.Lock()
	f := s.inflight
	if f == nil {
		f = &flight{done: make(chan struct{})}
		s.inflight = f
		go s.run(f)
	}
	s.mu.Unlock()

	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		s.timeouts.Inc()
		s.up.WithLabelValues(s.source.Name()).Set(0)
		s.logChange(stateTooSlow, fmt.Sprintf("a reading of %s has not finished within the collection timeout (%s); "+
			"scrapes get self-metrics only until one does", s.source.Name(), s.timeout))
		return nil, fmt.Errorf("%w after %s", ErrTimeout, s.timeout)
	}
}

// read takes one reading. It gets its own deadline, not the scrape's, so that a scrape that gave up does not cancel
// the work that the next scrape will join.
func (s *Reader) run(f *flight) {
	defer func() {
		s.mu.Lock()
		s.inflight = nil
		s.mu.Unlock()
		close(f.done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), s.readTimeout)
	defer cancel()

	name := s.source.Name()
	start := time.Now()
	snap, err := s.source.Snapshot(ctx)
	if err != nil {
		s.errors.WithLabelValues(name).Inc()
		s.up.WithLabelValues(name).Set(0)
		state := stateFailed
		if errors.Is(err, context.DeadlineExceeded) {
			state = stateTooSlow
		}
		s.logChange(state, fmt.Sprintf("reading GPUs from %s: %v", name, err))
		f.err = fmt.Errorf("reading GPUs from %s: %w", name, err)
		return
	}
	for _, e := range snap.Errors {
		index := ""
		if e.Index >= 0 {
			index = strconv.Itoa(e.Index)
		}
		s.deviceErrors.WithLabelValues(name, index, string(e.Operation)).Inc()
	}
	if len(snap.Errors) > 0 {
		s.logChange(stateDeviceErrors, fmt.Sprintf("reading GPUs from %s: %d errors, first: %v", name, len(snap.Errors), snap.Errors[0]))
	} else {
		s.logChange(stateOK, "")
	}
	owners := s.attributor.Attribute(ctx, snap)
	d := time.Since(start)
	s.duration.WithLabelValues(name).Set(d.Seconds())
	s.up.WithLabelValues(name).Set(1)
	f.res = &Reading{Snapshot: snap, Owners: owners}
}

// The states of the source that are logged when they change. They are kinds, not messages: an error whose text
// differs from one reading to the next (a PID, a duration) is still the same problem and is not logged again.
// stateTooSlow is one kind whether the scrape gave up first (the collection timeout) or the source did (its own
// timeout): a hung source does both at every scrape, and is one problem.
const (
	stateOK           = ""
	stateFailed       = "failed"
	stateTooSlow      = "too slow"
	stateDeviceErrors = "device errors"
)

// logChange logs a problem when it first appears or changes kind, and once when it is gone, so that a GPU that stays
// broken does not write a line per scrape; a source that flaps (a slow one that sometimes makes the collection
// timeout) is rate-limited, its lines counting the changes in between.
func (s *Reader) logChange(state, message string) {
	c := s.problem.Update(state)
	if !c.Log {
		return
	}
	var attrs []any
	if c.Unlogged > 0 {
		attrs = append(attrs, "changes_not_logged", c.Unlogged)
	}
	if state == stateOK {
		s.logger.Info("GPU source recovered", append([]any{"source", s.source.Name()}, attrs...)...)
	} else {
		s.logger.Error(message, attrs...)
	}
}

// Describe implements prometheus.Collector for the reader's self-metrics.
func (s *Reader) Describe(ch chan<- *prometheus.Desc) { s.self.Describe(ch) }

// Collect implements prometheus.Collector for the reader's self-metrics.
func (s *Reader) Collect(ch chan<- prometheus.Metric) { s.self.Collect(ch) }
