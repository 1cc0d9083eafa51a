package nvml

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// xidWatcher counts XID critical errors per GPU UUID and XID code from an NVML event set, in its own goroutine
// because NVML only reports them as events. A watcher that could not register any GPU runs no goroutine and counts
// nothing.
type xidWatcher struct {
	set    gonvml.EventSet
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	counts map[string]map[uint64]uint64 // UUID -> XID -> count
}

// startXIDWatcher registers every GPU that supports XID events and starts the goroutine. Failures only cost the XID
// counts, so they are logged, not returned.
func startXIDWatcher(lib gonvml.Interface, log *slog.Logger, wait, backoff time.Duration) *xidWatcher {
	w := &xidWatcher{counts: map[string]map[uint64]uint64{}}
	set, ret := lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		log.Warn("XID errors will not be counted: creating NVML event set failed", "err", ret)
		return w
	}
	if registerXIDEvents(lib, set, log) == 0 {
		log.Warn("XID errors will not be counted: no GPU supports XID events")
		set.Free()
		return w
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.set, w.cancel, w.done = set, cancel, make(chan struct{})
	go w.run(ctx, log, wait, backoff)
	return w
}

// registerXIDEvents registers XID critical error events of every GPU that supports them and returns how many did.
func registerXIDEvents(lib gonvml.Interface, set gonvml.EventSet, log *slog.Logger) int {
	count, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		log.Warn("counting GPUs for XID events failed", "err", ret)
		return 0
	}
	registered := 0
	for i := 0; i < count; i++ {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			log.Warn("XID errors of this GPU will not be counted: getting its handle failed", "gpu", i, "err", ret)
			continue
		}
		supported, ret := h.GetSupportedEventTypes()
		if ret != gonvml.SUCCESS || supported&gonvml.EventTypeXidCriticalError == 0 {
			log.Info("GPU does not report XID events", "gpu", i, "err", ret)
			continue
		}
		if ret := h.RegisterEvents(gonvml.EventTypeXidCriticalError, set); ret != gonvml.SUCCESS {
			log.Warn("XID errors of this GPU will not be counted: registering events failed", "gpu", i, "err", ret)
			continue
		}
		registered++
	}
	return registered
}

// run waits for events until ctx is cancelled. Each wait blocks at most wait, which bounds how long stop takes.
// A failing wait (other than the timeout that means "no event") pauses for backoff so that a broken event set does
// not spin a CPU.
func (w *xidWatcher) run(ctx context.Context, log *slog.Logger, wait, backoff time.Duration) {
	defer close(w.done)
	waitMs := uint32(wait.Milliseconds())
	failures := 0
	for ctx.Err() == nil {
		ev, ret := w.set.Wait(waitMs)
		switch ret {
		case gonvml.SUCCESS:
			failures = 0
			w.record(ev, log)
		case gonvml.ERROR_TIMEOUT:
			failures = 0
		default:
			// Warn once per run of failures; a persistent failure would otherwise log every backoff.
			if failures == 0 {
				log.Warn("waiting for NVML XID events failed", "err", ret)
			}
			failures++
			timer := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		}
	}
}

func (w *xidWatcher) record(ev gonvml.EventData, log *slog.Logger) {
	if ev.EventType != gonvml.EventTypeXidCriticalError || ev.Device == nil {
		return
	}
	uuid, ret := ev.Device.GetUUID()
	if ret != gonvml.SUCCESS {
		log.Warn("XID error on a GPU whose UUID cannot be read", "xid", ev.EventData, "err", ret)
		return
	}
	log.Warn("XID error", "uuid", uuid, "xid", ev.EventData)
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
	slices.SortFunc(out, func(a, b gpu.XIDCount) int {
		switch {
		case a.XID < b.XID:
			return -1
		case a.XID > b.XID:
			return 1
		}
		return 0
	})
	return out
}

// stop ends the goroutine, waits for it, and frees the event set.
func (w *xidWatcher) stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	<-w.done
	w.set.Free()
}
