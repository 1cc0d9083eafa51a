//go:build linux && cgo

package nvml

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// fakeGPM is a GPU performance monitor as NVML's GPM API shows it: sample buffers from nvmlGpmSampleAlloc, filled
// by nvmlGpmSampleGet (GPU) or nvmlGpmMigSampleGet (GPU instance) with a sequence number, and nvmlGpmMetricsGet,
// which answers each metric from the pair of samples it is given.
type fakeGPM struct {
	allocated, freed int
	freedOf          map[string]int // by the entity last sampled into the buffer
	seq              int
	// calls are the (sample1, sample2) sequence numbers and entity of each nvmlGpmMetricsGet call, and how many
	// metrics it asked for.
	calls []gpmCall
	// metric answers one metric of an entity ("gpu" or "gi<N>"); nil answers value(id).
	metric func(entity string, id gonvml.GpmMetricId) (float64, gonvml.Return)
}

type gpmCall struct {
	entity         string
	older, newer   int
	metrics        uint32
	firstMetric    uint32
	samplesOrdered bool
}

type fakeSample struct {
	*mock.GpmSample
	seq    int
	entity string
}

// gpmValue is the fake's default value of a metric: the ID, in percent or MiB/s.
func gpmValue(id gonvml.GpmMetricId) float64 { return float64(id) }

func (g *fakeGPM) attach(lib *mock.Interface, devs ...*mock.Device) {
	lib.GpmSampleAllocFunc = func() (gonvml.GpmSample, gonvml.Return) {
		g.allocated++
		s := &fakeSample{}
		s.GpmSample = &mock.GpmSample{FreeFunc: func() gonvml.Return {
			g.freed++
			if g.freedOf == nil {
				g.freedOf = map[string]int{}
			}
			g.freedOf[s.entity]++
			return gonvml.SUCCESS
		}}
		return s, gonvml.SUCCESS
	}
	lib.GpmMetricsGetFunc = func(req *gonvml.GpmMetricsGetType) gonvml.Return {
		a, b := req.Sample1.(*fakeSample), req.Sample2.(*fakeSample)
		if a.entity != b.entity {
			return gonvml.ERROR_INVALID_ARGUMENT
		}
		g.calls = append(g.calls, gpmCall{entity: a.entity, older: a.seq, newer: b.seq, metrics: req.NumMetrics,
			firstMetric: req.Metrics[0].MetricId, samplesOrdered: a.seq < b.seq})
		for i := range req.NumMetrics {
			m := &req.Metrics[i]
			id := gonvml.GpmMetricId(m.MetricId)
			v, ret := gpmValue(id), gonvml.SUCCESS
			if g.metric != nil {
				v, ret = g.metric(a.entity, id)
			}
			m.Value, m.NvmlReturn = v, uint32(ret)
		}
		return gonvml.SUCCESS
	}
	for _, d := range devs {
		d.GpmQueryDeviceSupportFunc = func() (gonvml.GpmSupport, gonvml.Return) {
			return gonvml.GpmSupport{Version: 1, IsSupportedDevice: 1}, gonvml.SUCCESS
		}
		d.GpmSampleGetFunc = func(s gonvml.GpmSample) gonvml.Return {
			g.seq++
			s.(*fakeSample).seq, s.(*fakeSample).entity = g.seq, "gpu"
			return gonvml.SUCCESS
		}
		d.GpmMigSampleGetFunc = func(gi int, s gonvml.GpmSample) gonvml.Return {
			g.seq++
			s.(*fakeSample).seq, s.(*fakeSample).entity = g.seq, fmt.Sprintf("gi%d", gi)
			return gonvml.SUCCESS
		}
	}
}

// pairs are the distinct (older, newer) sample pairs metrics were computed from, for one entity, in order.
func (g *fakeGPM) pairs(entity string) [][2]int {
	var pairs [][2]int
	for _, c := range g.calls {
		p := [2]int{c.older, c.newer}
		if c.entity == entity && (len(pairs) == 0 || pairs[len(pairs)-1] != p) {
			pairs = append(pairs, p)
		}
	}
	return pairs
}

// clockSource is a source whose clock the test sets.
func clockSource(t *testing.T, lib gonvml.Interface, now *time.Time) *Source {
	t.Helper()
	s, err := New(Config{Library: lib, Now: func() time.Time { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// wantGPMValues checks every metric of p against the fake's default values, converted: percent to a ratio, MiB/s
// to bytes per second.
func wantGPMValues(t *testing.T, p *gpu.Profiling) {
	t.Helper()
	if p == nil {
		t.Fatal("profiling absent")
	}
	for _, m := range gpmMetrics {
		if got, want := *m.value(p), gpu.Known(gpmValue(m.id)*m.scale); got != want {
			t.Errorf("metric %d = %+v, want %+v", m.id, got, want)
		}
	}
}

// Profiling is computed from the sample of each reading and the newest kept sample at least 100 ms older, older
// sample first, one metric per nvmlGpmMetricsGet call; the first reading has none. A reading less than 100 ms after
// the last goes back to the sample before it, as DCGM does. Close frees every sample.
func TestGPMBaselineIsTheNewestSampleAtLeast100msOlder(t *testing.T) {
	dev := newDevice("GPU-0")
	lib := newLibrary(dev)
	g := &fakeGPM{}
	g.attach(lib, dev)
	now := testNow
	s := clockSource(t, lib, &now)
	var profiles []*gpu.Profiling
	for _, at := range []time.Duration{0, time.Second, 1050 * time.Millisecond, 1120 * time.Millisecond, 2120 * time.Millisecond} {
		now = testNow.Add(at)
		snap := snapshot(t, s)
		wantNoErrors(t, snap)
		profiles = append(profiles, deviceByUUID(t, snap, "GPU-0").Profiling)
	}
	if profiles[0] != nil {
		t.Errorf("first reading has profiling %+v", profiles[0])
	}
	for _, p := range profiles[1:] {
		wantGPMValues(t, p)
	}
	if got, want := g.pairs("gpu"), [][2]int{{1, 2}, {1, 3}, {2, 4}, {4, 5}}; !slices.Equal(got, want) {
		t.Errorf("sample pairs %v, want %v", got, want)
	}
	for _, c := range g.calls {
		if c.metrics != 1 || !c.samplesOrdered {
			t.Fatalf("nvmlGpmMetricsGet call %+v: want one metric, older sample first", c)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if g.allocated != g.freed {
		t.Errorf("%d samples allocated, %d freed after Close", g.allocated, g.freed)
	}
}

// Readings closer than 100 ms keep the oldest sample as the next baseline and at most gpmMaxSamples samples, plus
// one spare buffer.
func TestGPMKeepsFewSamplesWhenReadingsComeFast(t *testing.T) {
	dev := newDevice("GPU-0")
	lib := newLibrary(dev)
	g := &fakeGPM{}
	g.attach(lib, dev)
	now := testNow
	s := clockSource(t, lib, &now)
	for i := range 9 {
		now = testNow.Add(time.Duration(i) * 10 * time.Millisecond)
		if p := deviceByUUID(t, snapshot(t, s), "GPU-0").Profiling; p != nil {
			t.Errorf("reading at %v ms has profiling", i*10)
		}
		if live := g.allocated - g.freed; live > gpmMaxSamples+1 {
			t.Fatalf("%d samples allocated after %d readings", live, i+1)
		}
	}
	now = testNow.Add(105 * time.Millisecond)
	wantGPMValues(t, deviceByUUID(t, snapshot(t, s), "GPU-0").Profiling)
	if got := g.pairs("gpu"); len(got) != 1 || got[0][0] != 1 {
		t.Errorf("pairs %v, want the first sample as the baseline", got)
	}
}

// A scrape never waits for GPM's interval: inside a synctest bubble, where any sleep or timer would move the clock,
// no time passes during a reading, and the second reading has profiling.
func TestSnapshotDoesNotWaitForGPM(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev := newDevice("GPU-0")
		lib := newLibrary(dev)
		(&fakeGPM{}).attach(lib, dev)
		s, err := New(Config{Library: lib})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for i := range 2 {
			start := time.Now()
			snap := snapshot(t, s)
			if took := time.Since(start); took != 0 {
				t.Errorf("reading %d took %v of the bubble's clock: it waited", i, took)
			}
			d := deviceByUUID(t, snap, "GPU-0")
			if p := d.Profiling; (p != nil) != (i == 1) {
				t.Errorf("reading %d profiling = %+v", i, p)
			}
			// The first reading has no profiling, and still says that the GPU has a monitor.
			if d.PerformanceMonitor != gpu.Known(1) {
				t.Errorf("reading %d: performance monitor %+v, want known 1", i, d.PerformanceMonitor)
			}
			time.Sleep(time.Second) // the next scrape
		}
	})
}

// Where GPM is not supported (before Hopper: NVML says so, or answers NOT_SUPPORTED; a driver before R520 lacks the
// functions) the profiling is absent, not 0, without an error, and no sample is allocated.
func TestGPMAbsentWhereUnsupported(t *testing.T) {
	for _, tc := range []struct {
		name    string
		support func() (gonvml.GpmSupport, gonvml.Return)
		missing []string
	}{
		{"not a supported device", func() (gonvml.GpmSupport, gonvml.Return) { return gonvml.GpmSupport{Version: 1}, gonvml.SUCCESS }, nil},
		{"NOT_SUPPORTED", func() (gonvml.GpmSupport, gonvml.Return) { return gonvml.GpmSupport{}, gonvml.ERROR_NOT_SUPPORTED }, nil},
		{"driver without GPM", nil, []string{"nvmlGpmMetricsGet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := newDevice("GPU-0")
			lib := newLibrary(dev)
			g := &fakeGPM{}
			g.attach(lib, dev)
			queries := 0
			dev.GpmQueryDeviceSupportFunc = func() (gonvml.GpmSupport, gonvml.Return) {
				queries++
				return tc.support()
			}
			now := testNow
			s := clockSource(t, withoutSymbols(lib, tc.missing...), &now)
			for i := range 3 {
				now = testNow.Add(time.Duration(i) * time.Second)
				snap := snapshot(t, s)
				wantNoErrors(t, snap)
				d := deviceByUUID(t, snap, "GPU-0")
				if d.Profiling != nil || d.PerformanceMonitor != gpu.Known(0) {
					t.Errorf("profiling %+v, performance monitor %+v; want absent, and known 0", d.Profiling, d.PerformanceMonitor)
				}
			}
			if g.allocated != 0 || queries > 1 {
				t.Errorf("%d samples allocated, support asked %d times; want none, at most once", g.allocated, queries)
			}
		})
	}
}

// go-nvml from v0.12.4-1 to v0.13.0-1 sent a struct version NVML rejects (go-nvml#168): every support query failed
// with ARGUMENT_VERSION_MISMATCH. Such a failure is an error, reported, and asked again at the next reading, not
// taken for a GPU without GPM.
func TestGPMSupportQueryFailureIsReported(t *testing.T) {
	dev := newDevice("GPU-0")
	lib := newLibrary(dev)
	(&fakeGPM{}).attach(lib, dev)
	queries := 0
	dev.GpmQueryDeviceSupportFunc = func() (gonvml.GpmSupport, gonvml.Return) {
		queries++
		return gonvml.GpmSupport{}, gonvml.ERROR_ARGUMENT_VERSION_MISMATCH
	}
	s := newSource(t, lib)
	for range 2 {
		snap := snapshot(t, s)
		if e, ok := findError(snap, 0, gpu.OpProfiling); !ok || !isReturn(e.Err, gonvml.ERROR_ARGUMENT_VERSION_MISMATCH) {
			t.Errorf("profiling error = %v (found %v)", e, ok)
		}
		if m := deviceByUUID(t, snap, "GPU-0").PerformanceMonitor; m.Valid {
			t.Errorf("performance monitor %+v, want unknown: NVML did not say", m)
		}
	}
	if queries != 2 {
		t.Errorf("support asked %d times, want once per reading", queries)
	}
}

// Each metric's own return code counts: NOT_SUPPORTED leaves that metric absent without an error; another failure
// leaves it absent with one profiling error per GPU and reading; values no reading can have (NaN, negative, a
// utilization over 100%) are absent. The other metrics are read.
func TestGPMMetricReturnCodes(t *testing.T) {
	dev := newDevice("GPU-0")
	lib := newLibrary(dev)
	g := &fakeGPM{metric: func(_ string, id gonvml.GpmMetricId) (float64, gonvml.Return) {
		switch id {
		case gonvml.GPM_METRIC_FP64_UTIL:
			return 0, gonvml.ERROR_NOT_SUPPORTED
		case gonvml.GPM_METRIC_FP32_UTIL, gonvml.GPM_METRIC_FP16_UTIL:
			return 0, gonvml.ERROR_UNKNOWN
		case gonvml.GPM_METRIC_SM_OCCUPANCY:
			return math.NaN(), gonvml.SUCCESS
		case gonvml.GPM_METRIC_DRAM_BW_UTIL:
			return 100.5, gonvml.SUCCESS
		case gonvml.GPM_METRIC_PCIE_RX_PER_SEC:
			return -1, gonvml.SUCCESS
		}
		return gpmValue(id), gonvml.SUCCESS
	}}
	g.attach(lib, dev)
	now := testNow
	s := clockSource(t, lib, &now)
	snapshot(t, s)
	now = now.Add(time.Second)
	snap := snapshot(t, s)
	p := deviceByUUID(t, snap, "GPU-0").Profiling
	if p == nil {
		t.Fatal("profiling absent")
	}
	for what, v := range map[string]gpu.Value{"FP64": p.FP64Active, "FP32": p.FP32Active, "FP16": p.FP16Active,
		"SM occupancy": p.SMOccupancy, "DRAM": p.DRAMActive, "PCIe RX": p.PCIeRXBytesPerSecond} {
		wantAbsent(t, what, v)
	}
	wantValue(t, "graphics", p.GraphicsEngineActive, 0.01)
	wantValue(t, "PCIe TX", p.PCIeTXBytesPerSecond, 20<<20)
	var errs []gpu.DeviceError
	for _, e := range snap.Errors {
		if e.Operation == gpu.OpProfiling {
			errs = append(errs, e)
		}
	}
	if len(errs) != 1 || !isReturn(errs[0].Err, gonvml.ERROR_UNKNOWN) {
		t.Errorf("profiling errors = %v, want one UNKNOWN", errs)
	}
}

// In MIG mode each GPU instance is sampled with nvmlGpmMigSampleGet and its profiling set on its MIG device with the
// lowest compute instance; the whole GPU is sampled too. When a GPU instance goes, its samples are freed; when the
// GPU goes, all of them.
func TestGPMPerGPUInstance(t *testing.T) {
	a := newMIGDevice("MIG-a", 1, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40*gib, gib)
	b0 := newMIGDevice("MIG-b0", 2, 0, "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", 40*gib, gib)
	b1 := newMIGDevice("MIG-b1", 2, 1, "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", 40*gib, gib)
	slots := []gonvml.Device{a, b1, b0}
	parent := newMIGParent()
	parent.GetMigDeviceHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
		if i < len(slots) {
			return slots[i], gonvml.SUCCESS
		}
		return nil, gonvml.ERROR_NOT_FOUND
	}
	present := true
	lib := newLibrary(parent)
	lib.DeviceGetCountFunc = func() (int, gonvml.Return) {
		if present {
			return 1, gonvml.SUCCESS
		}
		return 0, gonvml.SUCCESS
	}
	g := &fakeGPM{metric: func(entity string, id gonvml.GpmMetricId) (float64, gonvml.Return) {
		if entity == "gi2" {
			return gpmValue(id) / 2, gonvml.SUCCESS
		}
		return gpmValue(id), gonvml.SUCCESS
	}}
	g.attach(lib, parent)
	now := testNow
	s := clockSource(t, lib, &now)
	snapshot(t, s)
	now = now.Add(time.Second)
	snap := snapshot(t, s)
	wantNoErrors(t, snap)
	d := deviceByUUID(t, snap, "GPU-MIG")
	wantGPMValues(t, d.Profiling)
	byUUID := map[string]*gpu.Profiling{}
	for _, inst := range d.MIG {
		byUUID[inst.UUID] = inst.Profiling
	}
	wantGPMValues(t, byUUID["MIG-a"])
	if byUUID["MIG-b1"] != nil || byUUID["MIG-b0"] == nil || byUUID["MIG-b0"].GraphicsEngineActive != gpu.Known(0.005) {
		t.Errorf("GPU instance 2: compute instance 0 %+v, 1 %+v; want it on compute instance 0, halved", byUUID["MIG-b0"], byUUID["MIG-b1"])
	}
	if g.pairs("gi1") == nil || g.pairs("gi2") == nil {
		t.Errorf("GPU instances not sampled with nvmlGpmMigSampleGet: %+v", g.calls)
	}

	slots = []gonvml.Device{a} // GPU instance 2 destroyed
	now = now.Add(time.Second)
	snapshot(t, s)
	if g.freedOf["gi2"] != 2 || s.gpm.entities[gpmKey{"GPU-MIG", 2}] != nil {
		t.Errorf("%d samples of GPU instance 2 freed after it went, want its 2", g.freedOf["gi2"])
	}
	present = false
	now = now.Add(time.Second)
	snapshot(t, s)
	if g.allocated != g.freed {
		t.Errorf("%d samples allocated, %d freed after the GPU went", g.allocated, g.freed)
	}
}
