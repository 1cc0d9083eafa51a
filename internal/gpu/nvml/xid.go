//go:build linux && cgo

package nvml

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// xidWatcher counts XID critical errors per GPU UUID and XID code from an NVML event set, in its own goroutine
// because NVML only reports them as events.
//
// A GPU's UUID is learnt when it is registered, because the GPU an XID is about may already be lost when the event
// is read (XID 79: fallen off the bus), and then GetUUID answers GPU_IS_LOST. Counts are kept for every GPU ever
// registered, so that a lost GPU's XIDs are still exported.
//
// NVML says an event set whose wait failed is in an undefined state and should be freed: the watcher then frees it,
// waits for the backoff, and creates and registers a new one until that works. A watcher that found no GPU that
// supports XID events runs no goroutine and counts nothing.
//
// A driver in an XID storm answers each wait at once. The watcher then reads at most maxXIDEventsPerSecond events a
// second (NVML keeps the others ready for the next waits, each with its own data on Linux), so that the storm costs
// a bounded share of a core, and every event read is counted; the log says the first xidLogBurst XIDs of each GPU
// in a minute one by one and the rest in one line when the minute is over.
type xidWatcher struct {
	lib     gonvml.Interface
	log     *slog.Logger
	wait    time.Duration
	backoff time.Duration
	cancel  context.CancelFunc
	done    chan struct{}
	lines   xidLog // the watcher goroutine's own

	mu     sync.Mutex
	up     bool
	counts map[string]map[uint64]uint64 // UUID -> XID -> count
	// uuids maps the handles registered in the current event set to their GPU's UUID.
	uuids map[gonvml.Device]string
	// registered is every GPU ever registered, by UUID, with its index at the time.
	registered map[string]int
}

// errNoXIDSupport means no GPU supports XID events, which is permanent for the driver and GPUs.
var errNoXIDSupport = errors.New("no GPU supports XID events")

// Bounds of an XID storm: the events read a second, and the XIDs of one GPU logged one by one in a minute.
const (
	maxXIDEventsPerSecond = 1000
	xidLogBurst           = 10
	xidLogWindow          = time.Minute
)

func newXIDWatcher(lib gonvml.Interface, log *slog.Logger, wait, backoff time.Duration) *xidWatcher {
	return &xidWatcher{lib: lib, log: log, wait: wait, backoff: backoff, counts: map[string]map[uint64]uint64{},
		uuids: map[gonvml.Device]string{}, registered: map[string]int{}, lines: xidLog{log: log, gpus: map[string]*xidLogGPU{}}}
}

// start registers every GPU that supports XID events and starts the goroutine. Failures only cost the XID counts,
// so they are logged, not returned. start and stop are not safe to call concurrently with each other.
func (w *xidWatcher) start() {
	set, err := w.register()
	if errors.Is(err, errNoXIDSupport) || errors.Is(err, gonvml.ERROR_NOT_SUPPORTED) {
		w.log.Warn("XID errors will not be counted", "err", err)
		return
	}
	if err != nil {
		w.log.Warn("XID errors are not counted until the event set can be registered", "err", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go w.run(ctx, set)
}

// register creates an event set and registers XID events of every GPU that supports them. It returns the set when
// at least one GPU was registered; errNoXIDSupport when none supports them.
func (w *xidWatcher) register() (gonvml.EventSet, error) {
	set, ret := w.lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("creating NVML event set: %w", ret)
	}
	count, ret := w.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		set.Free()
		return nil, fmt.Errorf("counting GPUs for XID events: %w", ret)
	}
	uuids := map[gonvml.Device]string{}
	indexes := map[string]int{}
	var failed error
	for i := 0; i < count; i++ {
		h, ret := w.lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			failed = fmt.Errorf("getting the handle of GPU %d for XID events: %w", i, ret)
			w.log.Warn("XID errors of this GPU will not be counted: getting its handle failed", "gpu", i, "err", ret)
			continue
		}
		supported, ret := h.GetSupportedEventTypes()
		if ret != gonvml.SUCCESS || supported&gonvml.EventTypeXidCriticalError == 0 {
			w.log.Info("GPU does not report XID events", "gpu", i, "err", ret)
			continue
		}
		uuid, ret := h.GetUUID()
		if ret != gonvml.SUCCESS {
			failed = fmt.Errorf("reading the UUID of GPU %d for XID events: %w", i, ret)
			w.log.Warn("XID errors of this GPU will not be counted: reading its UUID failed", "gpu", i, "err", ret)
			continue
		}
		if ret := h.RegisterEvents(gonvml.EventTypeXidCriticalError, set); ret != gonvml.SUCCESS {
			failed = fmt.Errorf("registering XID events of GPU %d: %w", i, ret)
			w.log.Warn("XID errors of this GPU will not be counted: registering events failed", "gpu", i, "err", ret)
			continue
		}
		uuids[h] = uuid
		indexes[uuid] = i
	}
	if len(uuids) == 0 {
		set.Free()
		if failed != nil {
			return nil, failed
		}
		return nil, errNoXIDSupport
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.uuids = uuids
	maps.Copy(w.registered, indexes)
	return set, nil
}

// run waits for events until ctx is cancelled, starting with set (nil when the first registration failed). Each
// wait blocks at most w.wait, which bounds how long stop takes. A failed wait (other than the timeout that means "no
// event") frees the set; after the backoff a new one is created and registered.
func (w *xidWatcher) run(ctx context.Context, set gonvml.EventSet) {
	defer close(w.done)
	defer func() { w.lines.flush(time.Now(), true) }()
	waitMs := uint32(w.wait.Milliseconds())
	var pace eventPace
	for {
		if set == nil {
			if !sleepCtx(ctx, w.backoff) {
				return
			}
			var err error
			if set, err = w.register(); err != nil {
				w.log.Debug("registering XID events failed again", "err", err)
				continue
			}
			w.log.Info("counting XID errors again")
		}
		w.setUp(true)
		ret := gonvml.SUCCESS
		for ctx.Err() == nil && ret == gonvml.SUCCESS {
			var ev gonvml.EventData
			switch ev, ret = set.Wait(waitMs); ret {
			case gonvml.SUCCESS:
				w.record(ev, time.Now())
				if d := pace.next(time.Now()); d > 0 && !sleepCtx(ctx, d) {
					ret = gonvml.ERROR_TIMEOUT // stopping: leave the loop, and free the set
				}
			case gonvml.ERROR_TIMEOUT:
				ret = gonvml.SUCCESS
			}
			w.lines.flush(time.Now(), false)
		}
		w.setUp(false)
		set.Free()
		set = nil
		if ctx.Err() != nil {
			return
		}
		w.log.Warn("waiting for NVML XID events failed; registering a new event set after the backoff", "err", ret,
			"backoff", w.backoff)
	}
}

// sleepCtx waits for d, or less when ctx ends; it reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

func (w *xidWatcher) setUp(up bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.up = up
}

// isUp reports whether XID events are being waited for.
func (w *xidWatcher) isUp() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.up
}

// record counts one event. The UUID comes from the registration, because a GPU that reports XID 79 is lost by the
// time the event is read; GetUUID is asked only for a handle that was not registered.
func (w *xidWatcher) record(ev gonvml.EventData, now time.Time) {
	if ev.EventType != gonvml.EventTypeXidCriticalError || ev.Device == nil {
		return
	}
	w.mu.Lock()
	uuid, ok := w.uuids[ev.Device]
	w.mu.Unlock()
	if !ok {
		var ret gonvml.Return
		if uuid, ret = ev.Device.GetUUID(); ret != gonvml.SUCCESS {
			w.lines.xid(now, "", ev.EventData, ret)
			return
		}
	}
	w.lines.xid(now, uuid, ev.EventData, nil)
	w.mu.Lock()
	defer w.mu.Unlock()
	byXID := w.counts[uuid]
	if byXID == nil {
		byXID = map[uint64]uint64{}
		w.counts[uuid] = byXID
	}
	byXID[ev.EventData]++
}

// countsOf returns the XID counts of one GPU, sorted by XID.
func (w *xidWatcher) countsOf(uuid string) []gpu.XIDCount {
	w.mu.Lock()
	defer w.mu.Unlock()
	byXID := w.counts[uuid]
	if len(byXID) == 0 {
		return nil
	}
	out := make([]gpu.XIDCount, 0, len(byXID))
	for xid, n := range byXID {
		out = append(out, gpu.XIDCount{XID: xid, Count: n})
	}
	slices.SortFunc(out, func(a, b gpu.XIDCount) int { return cmp.Compare(a.XID, b.XID) })
	return out
}

// unreadGPUs returns the GPUs ever registered whose XIDs were counted and that are not in seen (by UUID), with the
// index each had when it was registered, in index order: a snapshot keeps them so that their XIDs are exported.
func (w *xidWatcher) unreadGPUs(seen map[string]bool) []gpu.Device {
	w.mu.Lock()
	var out []gpu.Device
	for uuid, index := range w.registered {
		if !seen[uuid] && len(w.counts[uuid]) > 0 {
			out = append(out, gpu.Device{Index: index, UUID: uuid, Vendor: gpu.VendorNVIDIA})
		}
	}
	w.mu.Unlock()
	for i := range out {
		out[i].XIDErrors = w.countsOf(out[i].UUID)
	}
	slices.SortFunc(out, func(a, b gpu.Device) int { return cmp.Or(cmp.Compare(a.Index, b.Index), cmp.Compare(a.UUID, b.UUID)) })
	return out
}

// uuidOf returns the UUID that GPU index had when it was last registered, or "".
func (w *xidWatcher) uuidOf(index int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for uuid, i := range w.registered {
		if i == index {
			return uuid
		}
	}
	return ""
}

// stop ends the goroutine, which frees the event set, and waits for it. The counts are kept.
func (w *xidWatcher) stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	<-w.done
	w.cancel, w.done = nil, nil
}

// eventPace bounds the events read a second: next is called after each one, and says how long to wait before the
// next wait, once maxXIDEventsPerSecond were read in the current second.
type eventPace struct {
	second time.Time
	n      int
}

func (p *eventPace) next(now time.Time) time.Duration {
	if now.Sub(p.second) >= time.Second || now.Before(p.second) {
		p.second, p.n = now, 0
	}
	if p.n++; p.n < maxXIDEventsPerSecond {
		return 0
	}
	return time.Second - now.Sub(p.second)
}

// xidLog writes the XID log lines: each GPU's first xidLogBurst XIDs of a minute one by one, the rest counted and
// said in one line when the minute is over. Only the watcher goroutine uses it.
type xidLog struct {
	log  *slog.Logger
	gpus map[string]*xidLogGPU // by UUID; "" for XIDs of a GPU that could not be named
}

type xidLogGPU struct {
	since  time.Time         // the start of the minute
	logged int               // XIDs logged one by one in it
	more   map[uint64]uint64 // the others, by XID
}

// xid logs one XID of the GPU uuid, or counts it for the minute's summary. err is set when the GPU could not be named.
func (l *xidLog) xid(now time.Time, uuid string, code uint64, err error) {
	g := l.gpus[uuid]
	if g == nil {
		g = &xidLogGPU{since: now, more: map[uint64]uint64{}}
		l.gpus[uuid] = g
	}
	if g.logged >= xidLogBurst {
		g.more[code]++
		return
	}
	g.logged++
	if err != nil {
		l.log.Warn("XID error on a GPU that is not registered and whose UUID cannot be read", "xid", code, "err", err)
		return
	}
	l.log.Warn("XID error", "uuid", uuid, "xid", code)
}

// flush ends the minutes that are over (all of them with all set): it says how many XIDs each GPU had past the ones
// logged, and forgets the GPU until its next XID.
func (l *xidLog) flush(now time.Time, all bool) {
	for uuid, g := range l.gpus {
		if !all && now.Sub(g.since) < xidLogWindow {
			continue
		}
		delete(l.gpus, uuid)
		if len(g.more) == 0 {
			continue
		}
		var n uint64
		codes := slices.Sorted(maps.Keys(g.more))
		byCode := make([]string, len(codes))
		for i, c := range codes {
			n += g.more[c]
			byCode[i] = fmt.Sprintf("%d: %d", c, g.more[c])
		}
		l.log.Warn(fmt.Sprintf("%d more XIDs on GPU %s in the last minute, counted but not logged one by one", n, cmp.Or(uuid, "(unnamed)")),
			"uuid", uuid, "more", n, "by_xid", strings.Join(byCode, ", "), "window", now.Sub(g.since).Round(time.Second))
	}
}
