package collector

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/rate"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// Compatibility outputs (--compat).
const (
	CompatNvidiasmi = "nvidiasmi"
	CompatDCGM      = "dcgm"
)

// ValidateCompat checks the --compat names, naming the first one that is not known.
func ValidateCompat(names []string) error {
	for _, n := range names {
		if n != CompatNvidiasmi && n != CompatDCGM {
			return fmt.Errorf("unknown compatibility output %q (known: %s, %s)", n, CompatNvidiasmi, CompatDCGM)
		}
	}
	return nil
}

// compatParts returns the parts of the compatibility outputs in opts.Compat, each once. They come after the device
// families' part, whose decisions of what a reading's values are (plausible) they follow.
func compatParts(opts Options, plausible *plausibility) []part {
	var parts []part
	if slices.Contains(opts.Compat, CompatNvidiasmi) {
		parts = append(parts, newNvidiasmiMetrics())
	}
	if slices.Contains(opts.Compat, CompatDCGM) {
		parts = append(parts, newDCGMMetrics(opts.CompatHostname, opts.CompatDCGM, plausible))
	}
	return parts
}

// dcgmField is one field of dcgm-exporter's default counter set (etc/default-counters.csv), written under
// --compat=dcgm from a device family (deviceFamily.dcgm) in dcgm-exporter's name, unit and labels.
type dcgmField struct {
	name string
	typ  metricType
	// help is dcgm-exporter's, so that the exposition reads the same; where ours differs, it says how.
	help string
	// convert turns the family's base unit into the field's.
	convert conversion
	// value is the whole GPU's value, in the family's unit; nil: the family's own value.
	value func(d *gpu.Device) gpu.Value
	// share is a process's part of the GPU's value, in the family's unit, for a field that adds up across the pods
	// of a GPU (see dcgmMetrics.split); shareHelp says how it is taken. nil: the field is not split, unless busy
	// is set.
	share     func(d *gpu.Device, p *gpu.Process) gpu.Value
	shareHelp string
	// busy splits a field that measures how busy the GPU was by the pods' shares of that activity
	// (activity.shares); shareHelp says which.
	busy *activity
	// estimate stands in for the value on a GPU without a performance monitor (gpu.Device.PerformanceMonitor 0),
	// with --compat.dcgm-gr-engine-estimate only: an estimate of the field from a reading the GPU does have.
	estimate func(d *gpu.Device) gpu.Value
	// instance is a GPU instance's value, in the family's unit, for a field that a GPU in MIG mode writes per GPU
	// instance; the GPU's own series keeps what no GPU instance has, so that its series still add up to the GPU's
	// value. nil: the GPU's own series alone has the field.
	instance func(m *gpu.MIGInstance) gpu.Value
	// gpuKeepsWhole is set for a field whose GPU instances' values are not parts of the GPU's (a ratio of each one's
	// own time): the GPU's own series keeps the GPU's value rather than a rest.
	gpuKeepsWhole bool
	// rate makes the field the value's increase per second between the last two readings (a counter turned into
	// a bandwidth, as DCGM does), absent on the first reading of a GPU.
	rate bool
	// counters are the label values of the family's counters that the field is read from ("" for the family's own
	// value), for a family whose counters are checked for jumps: where the family left one out of a reading as a
	// jump, the field is left out too, so that it never writes what the family would not.
	counters []string
}

// conversion is a change of unit, from a family's base unit (from) to dcgm-exporter's. The zero conversion keeps
// the value as it is.
type conversion struct {
	from  string
	apply func(float64) float64
}

const mib = 1 << 20

var (
	toMiB         = conversion{"bytes", func(v float64) float64 { return v / mib }}
	toPercent     = conversion{"ratio", func(v float64) float64 { return v * 100 }}
	toMHz         = conversion{"hertz", func(v float64) float64 { return v / 1e6 }}
	toMillijoules = conversion{"joules", func(v float64) float64 { return v * 1000 }}
	toNanoseconds = conversion{"seconds", func(v float64) float64 { return v * 1e9 }}
	// DCGM's NVLink bandwidth: KiB per second (the unit of NVML's counters) / 1000, which it calls MB/s.
	toDCGMNVLinkMBps = conversion{"bytes", func(v float64) float64 { return v / 1024 / 1000 }}
)

func (c conversion) of(v gpu.Value) gpu.Value {
	if c.apply == nil || !v.Valid {
		return v
	}
	return gpu.Known(c.apply(v.V))
}

// dcgmSharedHelp ends the help of a field that is split between the pods of a GPU; dcgmEstimateHelp that of a
// field estimated where the GPU has no reading.
const (
	dcgmSharedHelp   = " On a GPU shared by several pods, each pod's series has its share and the series without a pod the rest."
	dcgmEstimateHelp = " Before Hopper (no performance monitor) an estimate: the GPU's utilization (--compat.dcgm-gr-engine-estimate)."
)

// DCGMOptions tune --compat=dcgm.
type DCGMOptions struct {
	// Version is the dcgm-exporter release whose names to write (--compat.dcgm-version); empty is
	// DefaultDCGMVersion. ParseDCGMVersion checks it.
	Version string
	// EstimateGREngineActive writes DCGM_FI_PROF_GR_ENGINE_ACTIVE from the GPU's utilization on GPUs without a
	// performance monitor (--compat.dcgm-gr-engine-estimate).
	EstimateGREngineActive bool
}

// activity is a kind of work whose share of the GPU's time the driver samples per process as well as per GPU:
// SM (kernels), memory bandwidth, the encoder, the decoder.
type activity struct {
	process func(p *gpu.Process) gpu.Value
	device  func(d *gpu.Device) gpu.Value
}

var (
	smActivity      = &activity{func(p *gpu.Process) gpu.Value { return p.SMUtilizationRatio }, func(d *gpu.Device) gpu.Value { return d.UtilizationRatio }}
	memoryActivity  = &activity{func(p *gpu.Process) gpu.Value { return p.MemoryUtilizationRatio }, func(d *gpu.Device) gpu.Value { return d.MemoryUtilizationRatio }}
	encoderActivity = &activity{func(p *gpu.Process) gpu.Value { return p.EncoderUtilizationRatio }, func(d *gpu.Device) gpu.Value { return d.EncoderUtilizationRatio }}
	decoderActivity = &activity{func(p *gpu.Process) gpu.Value { return p.DecoderUtilizationRatio }, func(d *gpu.Device) gpu.Value { return d.DecoderUtilizationRatio }}
)

// smShareHelp says how the fields split by SM share are split.
const smShareHelp = " A pod's share is its part of the GPU's busy time, by its processes' SM utilization."

// splitBySM makes a field that measures how busy the GPU was split between the pods by their SM shares.
func splitBySM(f dcgmField) dcgmField {
	f.busy, f.shareHelp = smActivity, smShareHelp
	return f
}

// estimated gives a field a stand-in for GPUs that have no reading of it (--compat.dcgm-gr-engine-estimate).
func estimated(f dcgmField, estimate func(d *gpu.Device) gpu.Value) dcgmField {
	f.estimate = estimate
	return f
}

// shares is how much of the entity's activity of this kind was each process's: its sample over the larger of the
// sum of all processes' samples (those outside Kubernetes too) and the GPU's own utilization (perGPU; a GPU
// instance has none of its own). Time-sliced processes take turns, so their samples add up to about the GPU's
// utilization and each gets the part of the busy time it ran; processes that overlap (MPS) add up to more, and
// share what the GPU measured in proportion. An unknown sample is unknown; a GPU that did nothing gives 0.
func (a *activity) shares(d *gpu.Device, processes []gpu.Process, perGPU bool) func(p *gpu.Process) gpu.Value {
	busy := 0.0
	for i := range processes {
		if v := a.process(&processes[i]); v.Valid && v.V > 0 {
			busy += v.V
		}
	}
	if g := a.device(d); perGPU && g.Valid && g.V > busy {
		busy = g.V
	}
	return func(p *gpu.Process) gpu.Value {
		v := a.process(p)
		if !v.Valid || busy <= 0 || v.V <= 0 {
			return gpu.Value{V: 0, Valid: v.Valid}
		}
		return gpu.Known(v.V / busy)
	}
}

// dcgmMetrics is --compat=dcgm: the fields of dcgm-exporter's default counter set that the device families give.
// dcgm-exporter writes one series per GPU (per GPU instance in MIG mode) carrying the pod that the kubelet allocated
// it to, and copies it once per pod on a shared GPU. We write a series per pod that runs on a GPU, and on a shared
// GPU the series still tell the truth when added up: see split and docs/compat.md.
type dcgmMetrics struct {
	hostname string
	estimate bool // --compat.dcgm-gr-engine-estimate
	fields   []dcgmField
	families []*deviceFamily // of each field
	rows     []int           // of each field's family in deviceFamilies
	// plausible are the device families' decisions of what a reading's values are.
	plausible *plausibility
	byField   []*series.Desc
	rates     *rate.Tracker[rateKey] // of the fields that are rates
}

// rateKey is one GPU's counter behind a field that is a rate: the field's index.
type rateKey struct {
	uuid  string
	field int
}

// newDCGMMetrics is --compat=dcgm with the names of opts.Version, which the command line has checked
// (ParseDCGMVersion): an unknown version is a programming error.
func newDCGMMetrics(hostname string, opts DCGMOptions, plausible *plausibility) *dcgmMetrics {
	if opts.Version == "" {
		opts.Version = DefaultDCGMVersion
	}
	version, err := parseDCGMVersion(opts.Version)
	if err != nil {
		panic(err)
	}
	labels := []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", version.hostname, "DCGM_FI_DRIVER_VERSION",
		"GPU_I_PROFILE", "GPU_I_ID", "namespace", "pod", "container"}
	m := &dcgmMetrics{hostname: hostname, estimate: opts.EstimateGREngineActive, rates: rate.New[rateKey](), plausible: plausible}
	for i := range deviceFamilies {
		for _, f := range deviceFamilies[i].dcgm {
			help := f.help
			if f.share != nil || f.busy != nil {
				help += dcgmSharedHelp + f.shareHelp
			}
			if f.estimate != nil && opts.EstimateGREngineActive {
				help += dcgmEstimateHelp
			}
			m.fields = append(m.fields, f)
			m.families = append(m.families, &deviceFamilies[i])
			m.rows = append(m.rows, i)
			m.byField = append(m.byField, series.NewDesc(f.name, help, labels))
		}
	}
	return m
}

func (m *dcgmMetrics) descs() []*series.Desc { return m.byField }

// dcgmSeries is one label set of the output and its values: the whole GPU, a GPU instance (GPU_I_ID) in MIG mode,
// or a pod's share of either.
type dcgmSeries struct {
	profile, instance         string // GPU_I_PROFILE, GPU_I_ID; empty for a whole GPU
	namespace, pod, container string
	v                         []gpu.Value // by field, in the field's unit
}

// deviceSeries are the series of one GPU. A GPU in MIG mode has a series for the GPU (temperature, power, clocks,
// energy, XID, health, the memory outside its GPU instances, and its own profiling ratios and the traffic no GPU
// instance has) and one per GPU instance (the fields with an instance value: its memory and profiling); a GPU
// instance split into compute instances is one entity, as in DCGM. Otherwise one series has it all. Each is then
// split between the pods that use it.
func (m *dcgmMetrics) deviceSeries(d *gpu.Device, r *reading.Reading) []dcgmSeries {
	g := dcgmSeries{v: make([]gpu.Value, len(m.fields))}
	whole := make([]gpu.Value, len(m.fields)) // in the family's unit
	for i := range m.fields {
		whole[i] = m.whole(i, d, r.Snapshot.Time)
		g.v[i] = m.fields[i].convert.of(whole[i])
	}
	if len(d.MIG) == 0 {
		return m.split(d, g, d.Processes, r)
	}
	// What no GPU instance has (the driver's, and what is not assigned), in the family's unit.
	rest := make([]gpu.Value, len(m.fields))
	for i, f := range m.fields {
		if f.instance != nil && !f.gpuKeepsWhole {
			rest[i] = whole[i]
		}
	}
	var out []dcgmSeries
	seen := make(map[int]bool)
	for _, mig := range d.MIG {
		if seen[mig.GPUInstance] {
			continue
		}
		seen[mig.GPUInstance] = true
		e := dcgmSeries{profile: mig.Profile, instance: itoa(mig.GPUInstance), v: make([]gpu.Value, len(m.fields))}
		for i, f := range m.fields {
			if f.instance == nil {
				continue
			}
			v := f.instance(&mig)
			e.v[i] = f.convert.of(v)
			if !f.gpuKeepsWhole {
				rest[i] = gpu.Value{V: rest[i].V - v.V, Valid: rest[i].Valid && v.Valid}
			}
		}
		var processes []gpu.Process
		for _, p := range d.Processes {
			if p.MIG && p.GPUInstance == mig.GPUInstance {
				processes = append(processes, p)
			}
		}
		out = append(out, m.split(d, e, processes, r)...)
	}
	for i, f := range m.fields {
		if f.instance != nil && !f.gpuKeepsWhole {
			g.v[i] = f.convert.of(gpu.Value{V: max(rest[i].V, 0), Valid: rest[i].Valid})
		}
	}
	return append([]dcgmSeries{g}, out...)
}

// whole is field i's value for the whole GPU at the reading of time at, in its family's unit (per second for a
// rate).
func (m *dcgmMetrics) whole(i int, d *gpu.Device, at time.Time) gpu.Value {
	f := m.fields[i]
	v := gpu.Value{}
	if f.value != nil {
		v = f.value(d)
	} else {
		v = m.families[i].value(d)
	}
	// Only a GPU known to have no monitor: one with a monitor has no reading on its first scrape or when the monitor
	// failed, and an estimate there would make its series switch between two measures.
	if !v.Valid && m.estimate && f.estimate != nil && d.PerformanceMonitor == gpu.Known(0) {
		v = f.estimate(d)
	}
	// A field of the family's own value, or of its counters (the energy, the NVLink bandwidth, a policy's violation
	// time), is bounded as the family is (and counted there), and left out where the family left out a jump; one of
	// a value of its own (the clock event mask) is not.
	if (f.value == nil || f.rate || len(f.counters) > 0) && v.Valid && !m.families[i].Range.Holds(v.V) {
		v = gpu.Value{}
	}
	for _, label := range f.counters {
		if m.plausible.jumpedAt(counterKey{m.rows[i], d.UUID, label}, at) {
			v = gpu.Value{}
		}
	}
	if f.rate {
		v = m.rates.Rate(rateKey{d.UUID, i}, v, at)
	}
	return v
}

// split splits an entity (a GPU, or a GPU instance) between the pods whose processes run on it. With no pod, it
// is one series without pod labels, as in dcgm-exporter; with one pod and nothing else, one series with the pod's
// labels. Otherwise (several pods, or a pod and processes outside Kubernetes) each pod gets a series with its part
// of each field that adds up, and the series without pod labels keeps the rest and every other field, once: so that
// summing a GPU's series gives the GPU's value, and a field that does not add up (temperature, clocks) is not
// repeated. This is the one rule for every such field; only the part differs: a pod's own amount (memory; power
// times its SM utilization), or for a field that measures how busy the GPU was (utilization, engine and SM
// activity) the GPU's value times the pod's share of that activity (activity.shares). Where a pod's part of a field
// is unknown, the field is not split: the GPU's series keeps all of it. Parts that add up to more than the whole
// (per-process and per-GPU samples differ) are scaled down to it. Docker and Podman containers outside Kubernetes
// count as pods: they have a container label.
func (m *dcgmMetrics) split(d *gpu.Device, e dcgmSeries, processes []gpu.Process, r *reading.Reading) []dcgmSeries {
	type key struct{ namespace, pod, container string }
	var pods []key
	byPod := make(map[key][]*gpu.Process)
	outside := false
	for i := range processes {
		p := &processes[i]
		id := r.Owner(*p).Identity
		k := key{id.Namespace, id.Pod, id.Container}
		if k == (key{}) {
			outside = true
			continue
		}
		if _, ok := byPod[k]; !ok {
			pods = append(pods, k)
		}
		byPod[k] = append(byPod[k], p)
	}
	switch {
	case len(pods) == 0:
		return []dcgmSeries{e}
	case len(pods) == 1 && !outside:
		e.namespace, e.pod, e.container = pods[0].namespace, pods[0].pod, pods[0].container
		return []dcgmSeries{e}
	}
	out := make([]dcgmSeries, len(pods), len(pods)+1)
	for i, k := range pods {
		out[i] = dcgmSeries{profile: e.profile, instance: e.instance, namespace: k.namespace, pod: k.pod, container: k.container,
			v: make([]gpu.Value, len(m.fields))}
	}
	shares := map[*activity]func(p *gpu.Process) gpu.Value{}
	for f, field := range m.fields {
		whole := e.v[f]
		if !whole.Valid || (field.share == nil && field.busy == nil) {
			continue
		}
		part := func(p *gpu.Process) gpu.Value { return field.convert.of(field.share(d, p)) }
		if field.busy != nil {
			share, ok := shares[field.busy]
			if !ok {
				// A GPU instance has no utilization of its own: its processes' samples are all there is.
				share = field.busy.shares(d, processes, e.instance == "")
				shares[field.busy] = share
			}
			part = func(p *gpu.Process) gpu.Value {
				s := share(p)
				return gpu.Value{V: whole.V * s.V, Valid: s.Valid}
			}
		}
		parts := make([]float64, len(pods))
		sum, known := 0.0, true
		for i, k := range pods {
			for _, p := range byPod[k] {
				v := part(p)
				known = known && v.Valid
				parts[i] += v.V
			}
			sum += parts[i]
		}
		if !known {
			continue
		}
		scale := 1.0
		if sum > whole.V {
			scale = whole.V / sum
		}
		rest := whole.V
		for i := range pods {
			out[i].v[f] = gpu.Known(parts[i] * scale)
			rest -= parts[i] * scale
		}
		e.v[f] = gpu.Known(max(rest, 0))
	}
	return append(out, e)
}

// update writes the series of the NVIDIA GPUs, the only ones DCGM reads: an AMD or Intel GPU of a mixed node has no
// series under DCGM's names. DCGM numbers its GPUs (gpu, and device nvidiaN) as NVML does, and a mixed node keeps
// NVML's index for its NVIDIA GPUs (the others are numbered after them), so the index is DCGM's.
func (m *dcgmMetrics) update(b *series.Batch, r *reading.Reading) {
	snap := r.Snapshot
	for i := range snap.Devices {
		d := &snap.Devices[i]
		if d.Vendor != gpu.VendorNVIDIA {
			continue
		}
		idx := itoa(d.Index)
		driver := cmp.Or(d.DriverVersion, snap.DriverVersion)
		for _, s := range m.deviceSeries(d, r) {
			labels := []string{idx, d.UUID, d.PCIBusID, "nvidia" + idx, d.Name, m.hostname, driver,
				s.profile, s.instance, s.namespace, s.pod, s.container}
			for f, v := range s.v {
				if v.Valid {
					m.fields[f].typ.write(b, m.byField[f], v.V, labels)
				}
			}
		}
	}
}
