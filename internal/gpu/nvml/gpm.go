//go:build linux && cgo

package nvml

import (
	"math"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Profiling comes from NVML's GPU performance monitor (GPM, Hopper and newer, R520 and later), which gives metrics
// between two samples of a GPU's (or GPU instance's) counters. The source takes one sample per GPU and GPU
// instance in each snapshot and computes the metrics against an earlier one it kept, so a scrape never waits for
// an interval to pass. NVML asks for more than 100 ms between samples ("the internal sample refresh rate"); as
// DCGM does, the baseline is the newest kept sample at least that much older, so a reading right after another
// goes back to an older one. The first reading has no profiling.
//
// Each metric is asked for in its own nvmlGpmMetricsGet call: several metrics in one call have given wrong values
// on some drivers (DataDog's agent switched to one metric per call for that on H100s, datadog-agent#51934, with no
// root cause published), and a wrong value passes any plausibility check a batch could make. The cost is eleven
// more calls per GPU per scrape into a library function that only computes from two host buffers.
const (
	gpmMinInterval = 100 * time.Millisecond
	// gpmMaxSamples bounds the samples kept per GPU or GPU instance when readings come less than gpmMinInterval
	// apart: the baseline and the newest ones.
	gpmMaxSamples = 4
)

// gpmMetrics are the metrics read, with the conversion to base units: NVML's utilizations are percent, its rates
// MiB/s. Every ID here is in the first header with GPM (520.56.06), so every driver that has GPM defines it.
var gpmMetrics = []struct {
	id    gonvml.GpmMetricId
	scale float64
	value func(*gpu.Profiling) *gpu.Value
}{
	{gonvml.GPM_METRIC_GRAPHICS_UTIL, 0.01, func(p *gpu.Profiling) *gpu.Value { return &p.GraphicsEngineActive }},
	{gonvml.GPM_METRIC_SM_UTIL, 0.01, func(p *gpu.Profiling) *gpu.Value { return &p.SMActive }},
	{gonvml.GPM_METRIC_SM_OCCUPANCY, 0.01, func(p *gpu.Profiling) *gpu.Value { return &p.SMOccupancy }},
	{gonvml.GPM_METRIC_ANY_TENSOR_UTIL, 0.01, func(p *gpu.Profiling) *gpu.Value { return &p.TensorActive }},
	{gonvml.GPM_METRIC_DRAM_BW_UTIL, 0.01, func(p *gpu.Profiling) *gpu.Value { return &p.DRAMActive }},
	{gonvml.GPM_METRIC_FP64_UTIL, 0.01, func(p *gpu.Profiling) *gpu.Value { return &p.FP64Active }},
	{gonvml.GPM_METRIC_FP32_UTIL, 0.01, func(p *gpu.Profiling) *gpu.Value { return &p.FP32Active }},
	{gonvml.GPM_METRIC_FP16_UTIL, 0.01, func(p *gpu.Profiling) *gpu.Value { return &p.FP16Active }},
	{gonvml.GPM_METRIC_PCIE_TX_PER_SEC, 1 << 20, func(p *gpu.Profiling) *gpu.Value { return &p.PCIeTXBytesPerSecond }},
	{gonvml.GPM_METRIC_PCIE_RX_PER_SEC, 1 << 20, func(p *gpu.Profiling) *gpu.Value { return &p.PCIeRXBytesPerSecond }},
	{gonvml.GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, 1 << 20, func(p *gpu.Profiling) *gpu.Value { return &p.NVLinkTXBytesPerSecond }},
	{gonvml.GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, 1 << 20, func(p *gpu.Profiling) *gpu.Value { return &p.NVLinkRXBytesPerSecond }},
}

// gpmKey names what a sample is of: a GPU, or one of its GPU instances.
type gpmKey struct {
	uuid        string
	gpuInstance int // wholeGPU for the GPU
}

const wholeGPU = -1

type gpmSample struct {
	sample gonvml.GpmSample
	at     time.Time
}

// gpmEntity is the samples kept of one GPU or GPU instance, oldest first, and one spare buffer.
type gpmEntity struct {
	history []gpmSample
	spare   gonvml.GpmSample
	seen    bool // read in the snapshot being taken
}

// gpmState is what the source keeps between snapshots for GPM.
type gpmState struct {
	entities map[gpmKey]*gpmEntity
	// supported is NVML's answer to nvmlGpmQueryDeviceSupport per GPU UUID, which does not change while it runs.
	supported map[string]bool
	// request is reused for every nvmlGpmMetricsGet call: it holds room for every metric ID go-nvml knows.
	request gonvml.GpmMetricsGetType
}

// readProfiling samples the GPU, and each of its GPU instances in MIG mode, and computes their profiling. It says
// whether the GPU has a monitor, so that a reading without profiling (the first, a failed one) is not taken for a
// GPU without one.
func (r *deviceReader) readProfiling(h gonvml.Device, d *gpu.Device) {
	if !r.s.syms.gpm {
		d.PerformanceMonitor = gpu.Known(0) // a driver before R520
		return
	}
	if r.lost != nil {
		return
	}
	supported, known := r.gpmSupported(h)
	if !known {
		return
	}
	d.PerformanceMonitor = gpu.Known(0)
	if !supported {
		return
	}
	d.PerformanceMonitor = gpu.Known(1)
	d.Profiling = r.profile(gpmKey{r.uuid, wholeGPU}, h.GpmSampleGet)
	if d.MIGMode != gpu.MIGEnabled || !r.s.syms.gpmMIG {
		return
	}
	for gi, i := range lowestComputeInstances(d.MIG) {
		if r.lost != nil {
			return
		}
		d.MIG[i].Profiling = r.profile(gpmKey{r.uuid, gi}, func(s gonvml.GpmSample) gonvml.Return {
			return h.GpmMigSampleGet(gi, s)
		})
	}
}

// gpmSupported asks NVML once per GPU whether it has GPM; known is false where NVML could not say.
// nvmlGpmSupport_t.version is the plain 1 of NVML_GPM_SUPPORT_VERSION, not an NVML_STRUCT_VERSION: go-nvml from
// v0.12.4-1 to v0.13.0-1 sent the latter, and every query failed with ARGUMENT_VERSION_MISMATCH (go-nvml#168, fixed
// in v0.13.1-0); such a failure is reported, not taken as "no GPM".
func (r *deviceReader) gpmSupported(h gonvml.Device) (supported, known bool) {
	g := &r.s.gpm
	if v, ok := g.supported[r.uuid]; ok {
		return v, true
	}
	support, ret := h.GpmQueryDeviceSupport()
	switch {
	case ret == gonvml.SUCCESS:
		g.supported[r.uuid] = support.IsSupportedDevice != 0
	case unsupported(ret):
		g.supported[r.uuid] = false
	default:
		r.ok(gpu.OpProfiling, ret) // asked again at the next reading
		return false, false
	}
	return g.supported[r.uuid], true
}

// profile takes a sample of one GPU or GPU instance and returns the metrics since the newest kept sample at least
// gpmMinInterval older, or nil when there is none yet or no metric could be computed.
func (r *deviceReader) profile(key gpmKey, take func(gonvml.GpmSample) gonvml.Return) *gpu.Profiling {
	s := r.s
	e := s.gpm.entities[key]
	if e == nil {
		e = &gpmEntity{}
		s.gpm.entities[key] = e
	}
	e.seen = true
	sample := e.spare
	e.spare = nil
	if sample == nil {
		var ret gonvml.Return
		if sample, ret = s.lib.GpmSampleAlloc(); !r.ok(gpu.OpProfiling, ret) {
			return nil
		}
	}
	if ret := take(sample); ret != gonvml.SUCCESS {
		e.release(sample)
		r.ok(gpu.OpProfiling, ret)
		return nil
	}
	now := s.now()
	base := -1
	for i := len(e.history) - 1; i >= 0; i-- {
		if now.Sub(e.history[i].at) >= gpmMinInterval {
			base = i
			break
		}
	}
	var p *gpu.Profiling
	if base >= 0 {
		p = r.gpmMetrics(e.history[base].sample, sample)
		// Nothing older than the baseline can be a later reading's baseline.
		for _, old := range e.history[:base] {
			e.release(old.sample)
		}
		e.history = append(e.history[:0], e.history[base:]...)
	}
	e.history = append(e.history, gpmSample{sample, now})
	for len(e.history) > gpmMaxSamples {
		e.release(e.history[1].sample) // keep the oldest, the next baseline
		e.history = append(e.history[:1], e.history[2:]...)
	}
	return p
}

// gpmMetrics computes each metric from the older and the newer sample, in that order (DataDog's agent once passed
// them the other way round, datadog-agent#44338: the counters' differences then wrap). A metric with a return code
// of its own that is not SUCCESS, or a value no reading can have, is absent.
func (r *deviceReader) gpmMetrics(older, newer gonvml.GpmSample) *gpu.Profiling {
	req := &r.s.gpm.request
	p := &gpu.Profiling{}
	valid, reported, dropped := false, false, 0
	for _, m := range gpmMetrics {
		req.NumMetrics, req.Sample1, req.Sample2 = 1, older, newer
		req.Metrics[0] = gonvml.GpmMetric{MetricId: uint32(m.id)}
		if ret := r.s.lib.GpmMetricsGet(req); !r.ok(gpu.OpProfiling, ret) {
			return nil // the call itself failed: every metric would
		}
		got := req.Metrics[0]
		if ret := gonvml.Return(got.NvmlReturn); ret != gonvml.SUCCESS {
			if !reported && !unsupported(ret) {
				r.ok(gpu.OpProfiling, ret) // once per GPU or GPU instance and reading
				reported = true
			}
			continue
		}
		v := got.Value
		if got.MetricId != uint32(m.id) || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || (m.scale < 1 && v > 100) {
			dropped++
			continue
		}
		*m.value(p) = gpu.Known(v * m.scale)
		valid = true
	}
	if dropped > 0 {
		r.s.log.Debug("dropped GPM metrics with values no reading can have", "gpu", r.index, "uuid", r.uuid, "dropped", dropped)
	}
	if !valid {
		return nil
	}
	return p
}

// release keeps a sample buffer for the next sample, or frees it when one is kept already.
func (e *gpmEntity) release(s gonvml.GpmSample) {
	if e.spare == nil {
		e.spare = s
		return
	}
	s.Free()
}

// free frees every sample buffer of the entity.
func (e *gpmEntity) free() {
	for _, h := range e.history {
		h.sample.Free()
	}
	if e.spare != nil {
		e.spare.Free()
	}
	e.history, e.spare = nil, nil
}

// forgetUnseen frees the samples of GPUs and GPU instances that the snapshot did not read (gone, lost, or their
// MIG layout changed) and forgets the GPM support of GPUs not in seen.
func (g *gpmState) forgetUnseen(seen map[string]bool) {
	for key, e := range g.entities {
		if !e.seen {
			e.free()
			delete(g.entities, key)
			continue
		}
		e.seen = false
	}
	for uuid := range g.supported {
		if !seen[uuid] {
			delete(g.supported, uuid)
		}
	}
}

// freeAll frees every sample, before NVML is shut down.
func (g *gpmState) freeAll() {
	for key, e := range g.entities {
		e.free()
		delete(g.entities, key)
	}
	clear(g.supported)
}
