package collector

import (
	"fmt"
	"slices"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
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

// compatParts returns the parts of the compatibility outputs in opts.Compat, each once.
func compatParts(opts Options) []part {
	var parts []part
	if slices.Contains(opts.Compat, CompatNvidiasmi) {
		parts = append(parts, newNvidiasmiMetrics())
	}
	if slices.Contains(opts.Compat, CompatDCGM) {
		parts = append(parts, newDCGMMetrics(opts.CompatHostname))
	}
	return parts
}

const mib = 1 << 20

// The fields of --compat=dcgm, in the order of dcgmMetrics.fields.
const (
	dcgmSMClock = iota
	dcgmMemClock
	dcgmTemp
	dcgmPower
	dcgmEnergy
	dcgmUtil
	dcgmMemCopyUtil
	dcgmEncUtil
	dcgmDecUtil
	dcgmXID
	dcgmFBFree
	dcgmFBUsed
	dcgmFields
)

// dcgmMetrics is --compat=dcgm: the metrics of dcgm-exporter's default counter set (etc/default-counters.csv) that
// a snapshot has, in dcgm-exporter's names, units and labels. dcgm-exporter writes one series per GPU (per GPU
// instance in MIG mode) carrying the pod that the kubelet allocated it to, and copies it once per pod on a shared
// GPU. We write a series per pod that runs on a GPU, and on a shared GPU the series still tell the truth when added
// up: see dcgmSplit and docs/compat.md.
type dcgmMetrics struct {
	hostname string
	fields   [dcgmFields]*desc
}

func newDCGMMetrics(hostname string) *dcgmMetrics {
	labels := []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
		"GPU_I_PROFILE", "GPU_I_ID", "namespace", "pod", "container"}
	// Help texts are dcgm-exporter's, so that the exposition reads the same; where ours differs, it says how.
	const shared = " On a GPU shared by several pods, each pod's series has its share and the series without a pod the rest."
	m := &dcgmMetrics{hostname: hostname}
	for f, d := range [dcgmFields][2]string{
		dcgmSMClock:     {"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."},
		dcgmMemClock:    {"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."},
		dcgmTemp:        {"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."},
		dcgmPower:       {"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)." + shared + " A pod's share is the power times its SM utilization."},
		dcgmEnergy:      {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ)."},
		dcgmUtil:        {"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)." + shared + " A pod's share is its SM utilization."},
		dcgmMemCopyUtil: {"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)." + shared},
		dcgmEncUtil:     {"DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %)." + shared},
		dcgmDecUtil:     {"DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %)." + shared},
		dcgmXID:         {"DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered (here: the highest XID seen since the exporter started)."},
		dcgmFBFree:      {"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."},
		dcgmFBUsed:      {"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)." + shared},
	} {
		m.fields[f] = newDesc(d[0], d[1], labels)
	}
	return m
}

func (m *dcgmMetrics) descs() []*desc { return m.fields[:] }

// dcgmSeries is one label set of the output and its values: the whole GPU, a GPU instance (GPU_I_ID) in MIG mode,
// or a pod's share of either.
type dcgmSeries struct {
	profile, instance         string // GPU_I_PROFILE, GPU_I_ID; empty for a whole GPU
	namespace, pod, container string
	v                         [dcgmFields]gpu.Value
}

// dcgmShared are the fields that add up across the pods of a GPU, with a process's part of each. Power is not
// measured per process: a process's part is the GPU's power times its SM utilization (the fraction of the sample
// period it ran), so that an idle GPU's draw stays with the GPU. Energy would add up too, but a counter split by
// shares that change would go backwards: it stays on the GPU's series, whose value alone is the GPU's.
var dcgmShared = []struct {
	field int
	part  func(d *gpu.Device, p *gpu.Process) gpu.Value
}{
	{dcgmFBUsed, func(_ *gpu.Device, p *gpu.Process) gpu.Value { return scaled(p.UsedMemoryBytes, 1.0/mib) }},
	{dcgmUtil, func(_ *gpu.Device, p *gpu.Process) gpu.Value { return scaled(p.SMUtilizationRatio, 100) }},
	{dcgmMemCopyUtil, func(_ *gpu.Device, p *gpu.Process) gpu.Value { return scaled(p.MemoryUtilizationRatio, 100) }},
	{dcgmEncUtil, func(_ *gpu.Device, p *gpu.Process) gpu.Value { return scaled(p.EncoderUtilizationRatio, 100) }},
	{dcgmDecUtil, func(_ *gpu.Device, p *gpu.Process) gpu.Value { return scaled(p.DecoderUtilizationRatio, 100) }},
	{dcgmPower, func(d *gpu.Device, p *gpu.Process) gpu.Value {
		if !d.PowerUsageWatts.Valid || !p.SMUtilizationRatio.Valid {
			return gpu.Value{}
		}
		return gpu.Known(d.PowerUsageWatts.V * p.SMUtilizationRatio.V)
	}},
}

// dcgmDeviceSeries are the series of one GPU. A GPU in MIG mode has a series for the GPU (temperature, power,
// clocks, energy, XID, and the memory outside its GPU instances) and one per GPU instance (its memory); a GPU
// instance split into compute instances is one entity, as in DCGM. Otherwise one series has it all. Each is then split between the pods that use it.
func dcgmDeviceSeries(d *gpu.Device, r *reading.Reading) []dcgmSeries {
	var g dcgmSeries
	for _, c := range d.Clocks {
		switch c.Name {
		case "sm":
			g.v[dcgmSMClock] = gpu.Known(c.Hertz / 1e6)
		case "memory":
			g.v[dcgmMemClock] = gpu.Known(c.Hertz / 1e6)
		}
	}
	for _, x := range d.XIDErrors {
		g.v[dcgmXID] = gpu.Known(max(g.v[dcgmXID].V, float64(x.XID)))
	}
	g.v[dcgmTemp] = d.TemperatureCelsius
	g.v[dcgmPower] = d.PowerUsageWatts
	g.v[dcgmEnergy] = scaled(d.EnergyJoules, 1000)
	g.v[dcgmUtil] = scaled(d.UtilizationRatio, 100)
	g.v[dcgmMemCopyUtil] = scaled(d.MemoryUtilizationRatio, 100)
	g.v[dcgmEncUtil] = scaled(d.EncoderUtilizationRatio, 100)
	g.v[dcgmDecUtil] = scaled(d.DecoderUtilizationRatio, 100)
	if len(d.MIG) == 0 {
		g.v[dcgmFBUsed] = scaled(d.MemoryUsedBytes, 1.0/mib)
		g.v[dcgmFBFree] = scaled(d.MemoryFreeBytes, 1.0/mib)
		return dcgmSplit(d, g, d.Processes, r)
	}
	// The GPU's own series has the memory that no GPU instance has (the driver's, and what is not assigned), so
	// that a GPU's series still add up to its memory.
	restUsed, restFree := d.MemoryUsedBytes, d.MemoryFreeBytes
	var out []dcgmSeries
	seen := make(map[int]bool)
	for _, mig := range d.MIG {
		if seen[mig.GPUInstance] {
			continue
		}
		seen[mig.GPUInstance] = true
		e := dcgmSeries{profile: mig.Profile, instance: itoa(mig.GPUInstance)}
		e.v[dcgmFBUsed] = scaled(mig.MemoryUsedBytes, 1.0/mib)
		restUsed = gpu.Value{V: restUsed.V - mig.MemoryUsedBytes.V, Valid: restUsed.Valid && mig.MemoryUsedBytes.Valid}
		free := gpu.Value{V: mig.MemoryTotalBytes.V - mig.MemoryUsedBytes.V, Valid: mig.MemoryTotalBytes.Valid && mig.MemoryUsedBytes.Valid}
		e.v[dcgmFBFree] = scaled(free, 1.0/mib)
		restFree = gpu.Value{V: restFree.V - free.V, Valid: restFree.Valid && free.Valid}
		var processes []gpu.Process
		for _, p := range d.Processes {
			if p.MIG && p.GPUInstance == mig.GPUInstance {
				processes = append(processes, p)
			}
		}
		out = append(out, dcgmSplit(d, e, processes, r)...)
	}
	g.v[dcgmFBUsed] = gpu.Value{V: max(restUsed.V, 0) / mib, Valid: restUsed.Valid}
	g.v[dcgmFBFree] = gpu.Value{V: max(restFree.V, 0) / mib, Valid: restFree.Valid}
	return append([]dcgmSeries{g}, out...)
}

// dcgmSplit splits an entity (a GPU, or a GPU instance) between the pods whose processes run on it. With no pod,
// it is one series without pod labels, as in dcgm-exporter; with one pod and nothing else, one series with the
// pod's labels. Otherwise (several pods, or a pod and processes outside Kubernetes) each pod gets a series with its
// part of each dcgmShared field, and the series without pod labels keeps the rest and every other field, once: so
// that summing a GPU's series gives the GPU's value, and a field that does not add up (temperature, clocks) is not
// repeated. Where a pod's part of a field is unknown, the field is not split: the GPU's series keeps all of it.
// Parts that add up to more than the whole (per-process and per-GPU samples differ) are scaled down to it. Docker
// and Podman containers outside Kubernetes count as pods: they have a container label.
func dcgmSplit(d *gpu.Device, e dcgmSeries, processes []gpu.Process, r *reading.Reading) []dcgmSeries {
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
		out[i] = dcgmSeries{profile: e.profile, instance: e.instance, namespace: k.namespace, pod: k.pod, container: k.container}
	}
	for _, s := range dcgmShared {
		whole := e.v[s.field]
		if !whole.Valid {
			continue
		}
		parts := make([]float64, len(pods))
		sum, known := 0.0, true
		for i, k := range pods {
			for _, p := range byPod[k] {
				v := s.part(d, p)
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
			out[i].v[s.field] = gpu.Known(parts[i] * scale)
			rest -= parts[i] * scale
		}
		e.v[s.field] = gpu.Known(max(rest, 0))
	}
	return append(out, e)
}

func (m *dcgmMetrics) update(b *batch, r *reading.Reading) {
	snap := r.Snapshot
	for i := range snap.Devices {
		d := &snap.Devices[i]
		idx := itoa(d.Index)
		for _, s := range dcgmDeviceSeries(d, r) {
			labels := []string{idx, d.UUID, d.PCIBusID, "nvidia" + idx, d.Name, m.hostname, snap.DriverVersion,
				s.profile, s.instance, s.namespace, s.pod, s.container}
			for f, v := range s.v {
				switch {
				case !v.Valid:
				case f == dcgmEnergy:
					b.counter(m.fields[f], v.V, labels...)
				default:
					b.gauge(m.fields[f], v.V, labels...)
				}
			}
		}
	}
}

func scaled(v gpu.Value, factor float64) gpu.Value {
	return gpu.Value{V: v.V * factor, Valid: v.Valid}
}
