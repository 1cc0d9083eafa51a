//go:build linux && cgo

package nvml

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// eventSet is a mock event set fed by the test: Wait returns the next queued reply, or ERROR_TIMEOUT when none
// comes within its timeout, like NVML's nvmlEventSetWait.
type eventSet struct {
	*mock.EventSet
	replies chan waitReply
	freed   chan struct{}
}

type waitReply struct {
	data gonvml.EventData
	ret  gonvml.Return
}

// newEventSet must be called inside the synctest bubble so that its channels and timers belong to it.
func newEventSet() *eventSet {
	es := &eventSet{replies: make(chan waitReply), freed: make(chan struct{})}
	es.EventSet = &mock.EventSet{
		WaitFunc: func(timeoutMs uint32) (gonvml.EventData, gonvml.Return) {
			select {
			case r := <-es.replies:
				return r.data, r.ret
			case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
				return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() gonvml.Return {
			close(es.freed)
			return gonvml.SUCCESS
		},
	}
	return es
}

func xid(dev gonvml.Device, code uint64) waitReply {
	return waitReply{data: gonvml.EventData{Device: dev, EventType: gonvml.EventTypeXidCriticalError, EventData: code}}
}

func TestXIDErrorsCountedAndWatcherStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev0, dev1 := newDevice("GPU-0"), newDevice("GPU-1")
		// GPU-2 does not support XID events and must not be registered.
		dev2 := newDevice("GPU-2")
		dev2.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return 0, gonvml.SUCCESS }
		es := newEventSet()
		lib := newLibrary(dev0, dev1, dev2)
		lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return es, gonvml.SUCCESS }
		s, err := New(Config{Library: lib, Now: time.Now})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []*mock.Device{dev0, dev1} {
			calls := d.RegisterEventsCalls()
			if len(calls) != 1 || calls[0].V != gonvml.EventTypeXidCriticalError || calls[0].EventSet != es {
				t.Errorf("RegisterEvents calls = %+v", calls)
			}
		}
		if n := len(dev2.RegisterEventsCalls()); n != 0 {
			t.Errorf("GPU-2 registered %d times although it does not support XID events", n)
		}

		time.Sleep(3 * time.Second) // fake time: several waits time out, which must not count anything
		for _, r := range []waitReply{
			xid(dev0, 79), xid(dev0, 13), xid(dev0, 79), xid(dev1, 48),
			// Not an XID event, and an event without a device: both ignored.
			{data: gonvml.EventData{Device: dev1, EventType: gonvml.EventTypeSingleBitEccError, EventData: 1}},
			{data: gonvml.EventData{EventType: gonvml.EventTypeXidCriticalError, EventData: 31}},
		} {
			es.replies <- r
		}
		synctest.Wait() // the watcher has recorded the last event and waits again

		snap, err := s.Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		wantXIDs(t, deviceByUUID(t, snap, "GPU-0").XIDErrors, []gpu.XIDCount{{XID: 13, Count: 1}, {XID: 79, Count: 2}})
		wantXIDs(t, deviceByUUID(t, snap, "GPU-1").XIDErrors, []gpu.XIDCount{{XID: 48, Count: 1}})
		wantXIDs(t, deviceByUUID(t, snap, "GPU-2").XIDErrors, nil)

		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-es.freed:
		default:
			t.Error("event set not freed by Close")
		}
		if n := len(lib.ShutdownCalls()); n != 1 {
			t.Errorf("Shutdown called %d times, want 1", n)
		}
		// The goroutine has ended: no more waits happen, however long we wait.
		waits := len(es.WaitCalls())
		time.Sleep(time.Minute)
		if n := len(es.WaitCalls()); n != waits {
			t.Errorf("%d waits after Close", n-waits)
		}
		if err := s.Close(); err != nil || len(lib.ShutdownCalls()) != 1 {
			t.Errorf("second Close = %v, Shutdown calls %d", err, len(lib.ShutdownCalls()))
		}
		// synctest.Test itself fails if any goroutine of the bubble is still running here.
	})
}

// NVML says an event set whose wait failed is in an undefined state and should be freed. The watcher frees it,
// waits for the backoff (without spinning), registers a new set, and counts the XIDs that arrive on it; the
// xid_watcher_up self-metric follows.
func TestXIDWatcherRegistersAgainAfterFailedWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev := newDevice("GPU-0")
		sets := []*eventSet{newEventSet(), newEventSet()}
		lib := newLibrary(dev)
		lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) {
			n := len(lib.EventSetCreateCalls()) // this call included
			if n > len(sets) {
				t.Error("more event sets created than expected")
				return nil, gonvml.ERROR_UNKNOWN
			}
			return sets[n-1], gonvml.SUCCESS
		}
		s, err := New(Config{Library: lib, EventErrorBackoff: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := testutil.ToFloat64(s); got != 1 {
			t.Errorf("xid_watcher_up = %v after start, want 1", got)
		}

		sets[0].replies <- waitReply{ret: gonvml.ERROR_UNKNOWN}
		synctest.Wait()
		select {
		case <-sets[0].freed:
		default:
			t.Fatal("event set not freed after its wait failed")
		}
		if got := testutil.ToFloat64(s); got != 0 {
			t.Errorf("xid_watcher_up = %v after the failed wait, want 0", got)
		}
		waits := len(sets[0].WaitCalls())
		time.Sleep(9 * time.Second)
		if n, created := len(sets[0].WaitCalls()), len(lib.EventSetCreateCalls()); n != waits || created != 1 {
			t.Errorf("within the backoff: %d more waits on the freed set, %d sets created", n-waits, created)
		}

		time.Sleep(2 * time.Second)
		synctest.Wait()
		if created := len(lib.EventSetCreateCalls()); created != 2 || len(dev.RegisterEventsCalls()) != 2 ||
			dev.RegisterEventsCalls()[1].EventSet != sets[1] {
			t.Fatalf("after the backoff: %d sets created, registrations %+v", created, dev.RegisterEventsCalls())
		}
		if got := testutil.ToFloat64(s); got != 1 {
			t.Errorf("xid_watcher_up = %v after registering again, want 1", got)
		}
		sets[1].replies <- xid(dev, 48)
		synctest.Wait()
		snap, err := s.Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		wantXIDs(t, deviceByUUID(t, snap, "GPU-0").XIDErrors, []gpu.XIDCount{{XID: 48, Count: 1}})

		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sets[1].freed:
		default:
			t.Error("second event set not freed by Close")
		}
	})
}

// A GPU that falls off the bus reports XID 79 and then answers GPU_IS_LOST to everything, GetUUID included. The
// XID is counted under the UUID learnt at registration, and the GPU stays in the snapshot with its XID counts
// (and a device error), so that the XID 79 alert can fire.
func TestXIDOfLostGPUIsStillExported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev0, dev1 := newDevice("GPU-0"), newDevice("GPU-1")
		lost := false
		dev1.GetUUIDFunc = func() (string, gonvml.Return) {
			if lost {
				return "", gonvml.ERROR_GPU_IS_LOST
			}
			return "GPU-1", gonvml.SUCCESS
		}
		es := newEventSet()
		lib := newLibrary(dev0, dev1)
		lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return es, gonvml.SUCCESS }
		s, err := New(Config{Library: lib, Now: time.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if _, err := s.Snapshot(t.Context()); err != nil { // GPU 1 read while healthy
			t.Fatal(err)
		}
		lost = true
		es.replies <- xid(dev1, 79)
		synctest.Wait()

		for range 2 { // and again on the next scrape: the count stays
			snap, err := s.Snapshot(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			lostGPU := deviceByUUID(t, snap, "GPU-1")
			wantXIDs(t, lostGPU.XIDErrors, []gpu.XIDCount{{XID: 79, Count: 1}})
			// The identity it last had, so that its gpu_info stays one series.
			if lostGPU.Index != 1 || lostGPU.Name != "NVIDIA H100 80GB HBM3" || lostGPU.PCIBusID != "00000000:1A:00.0" {
				t.Errorf("lost GPU = %d %q %q, want its last identity", lostGPU.Index, lostGPU.Name, lostGPU.PCIBusID)
			}
			wantAbsent(t, "lost GPU's memory", lostGPU.MemoryTotalBytes)
			wantValue(t, "GPU-0 power", deviceByUUID(t, snap, "GPU-0").PowerUsageWatts, 250.5)
			if len(snap.Devices) != 2 {
				t.Errorf("devices = %+v, want GPU-0 read and GPU-1 with its XIDs only", snap.Devices)
			}
			e, ok := findError(snap, 1, gpu.OpDevice)
			if !ok || e.UUID != "GPU-1" || !isReturn(e.Err, gonvml.ERROR_GPU_IS_LOST) {
				t.Errorf("device error of GPU 1 = %+v (found %v)", e, ok)
			}
		}
	})
}

// Without XID support on any GPU, no goroutine runs and the event set is freed at once.
func TestXIDUnsupportedRunsNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		es := newEventSet()
		dev := newDevice("GPU-0")
		dev.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
		lib := newLibrary(dev)
		lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return es, gonvml.SUCCESS }
		s, err := New(Config{Library: lib})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-es.freed:
		default:
			t.Error("unused event set not freed")
		}
		synctest.Wait()
		if n := len(es.WaitCalls()); n != 0 {
			t.Errorf("%d waits on an event set with no GPU registered", n)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// A driver in an XID storm answers every wait at once with another XID. Every XID read is counted, exactly; the
// watcher reads at most maxXIDEventsPerSecond a second (the rest wait in NVML's queue), so the storm costs a bounded
// share of a core; and the log has each GPU's first xidLogBurst XIDs of a minute and then one line with the rest,
// rather than a line per XID (673,565 WARN lines in 10 s before).
func TestXIDStormIsPacedAndSummarized(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev0, dev1 := newDevice("GPU-0"), newDevice("GPU-1")
		const storm = 20 * maxXIDEventsPerSecond // then the driver is quiet
		var sent [2]uint64
		set := &mock.EventSet{
			WaitFunc: func(timeoutMs uint32) (gonvml.EventData, gonvml.Return) {
				if sent[0]+sent[1] == storm {
					time.Sleep(time.Duration(timeoutMs) * time.Millisecond)
					return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
				}
				i := (sent[0] + sent[1]) % 4 / 3 // three XIDs of GPU 0 for one of GPU 1
				sent[i]++
				dev := []*mock.Device{dev0, dev1}[i]
				return gonvml.EventData{Device: dev, EventType: gonvml.EventTypeXidCriticalError, EventData: 13 + 18*i}, gonvml.SUCCESS
			},
			FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
		}
		lib := newLibrary(dev0, dev1)
		lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return set, gonvml.SUCCESS }
		logs := &testkit.Logs{}
		s, err := New(Config{Library: lib, Logger: slog.New(logs)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })

		time.Sleep(10 * time.Second) // fake time: the watcher runs only while the storm lets it
		waits := len(set.WaitCalls())
		if waits < 10*maxXIDEventsPerSecond || waits > 11*maxXIDEventsPerSecond {
			t.Errorf("%d waits in 10 s of a storm, want about %d a second", waits, maxXIDEventsPerSecond)
		}
		if n := logs.Count(slog.LevelWarn); n != 2*xidLogBurst {
			t.Errorf("%d WARN lines in 10 s of a storm on 2 GPUs, want %d (each GPU's first %d)", n, 2*xidLogBurst, xidLogBurst)
		}

		time.Sleep(51 * time.Second) // the storm is over, and the minute: one summary line per GPU
		synctest.Wait()
		snap, err := s.Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		counted := map[string]uint64{}
		for _, d := range snap.Devices {
			for _, x := range d.XIDErrors {
				counted[d.UUID] += x.Count
			}
		}
		if counted["GPU-0"] != sent[0] || counted["GPU-1"] != sent[1] {
			t.Errorf("counted %v, want every XID read: GPU-0 %d, GPU-1 %d", counted, sent[0], sent[1])
		}
		var summaries []string
		for _, r := range logs.Records() {
			if strings.Contains(r.Message, "more XIDs on GPU") {
				summaries = append(summaries, r.Message)
			}
		}
		want := []string{fmt.Sprintf("%d more XIDs on GPU GPU-0 in the last minute", sent[0]-xidLogBurst),
			fmt.Sprintf("%d more XIDs on GPU GPU-1 in the last minute", sent[1]-xidLogBurst)}
		if len(summaries) != 2 || !slices.ContainsFunc(summaries, func(m string) bool { return strings.HasPrefix(m, want[0]) }) ||
			!slices.ContainsFunc(summaries, func(m string) bool { return strings.HasPrefix(m, want[1]) }) {
			t.Errorf("summaries %q, want one per GPU starting %q", summaries, want)
		}
		if n := logs.Count(slog.LevelWarn); n > 2*(2*xidLogBurst+1) {
			t.Errorf("%d WARN lines in 61 s of a storm on 2 GPUs, want at most %d", n, 2*(2*xidLogBurst+1))
		}
	})
}

func wantXIDs(t *testing.T, got, want []gpu.XIDCount) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("XIDs = %v, want %v", got, want)
		return
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("XIDs = %v, want %v", got, want)
			return
		}
	}
}
