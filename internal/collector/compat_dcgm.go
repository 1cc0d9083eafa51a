package collector

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/scrape"
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

// dcgmMetrics is --compat=dcgm: the metrics of dcgm-exporter's default counter set (etc/default-counters.csv) that
// a snapshot has, in dcgm-exporter's names, units and labels. dcgm-exporter writes one series per GPU (per GPU
// instance in MIG mode) carrying the pod that the kubelet allocated it to. We write one series per pod that runs
// on it, and on a shared GPU FB_USED and GPU_UTIL are the pod's own share, not the whole GPU's; see dcgmShares and
// docs/compat.md.
type dcgmMetrics struct {
	hostname                           string
	smClock, memClock, temp, power     *prometheus.Desc
	energy, util, memCopyUtil, encUtil *prometheus.Desc
	decUtil, xid, fbFree, fbUsed       *prometheus.Desc
}

func newDCGMMetrics(hostname string) *dcgmMetrics {
	labels := []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
		"GPU_I_PROFILE", "GPU_I_ID", "namespace", "pod", "container"}
	// Help texts are dcgm-exporter's, so that the exposition reads the same.
	desc := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, labels, nil) }
	return &dcgmMetrics{
		hostname:    hostname,
		smClock:     desc("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
		memClock:    desc("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."),
		temp:        desc("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
		power:       desc("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
		energy:      desc("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ)."),
		util:        desc("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %). On a GPU shared by several pods, the pod's own SM utilization; the series without a pod has the rest."),
		memCopyUtil: desc("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
		encUtil:     desc("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %)."),
		decUtil:     desc("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %)."),
		xid:         desc("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered (here: the highest XID seen since the exporter started)."),
		fbFree:      desc("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
		fbUsed:      desc("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB). On a GPU shared by several pods, the pod's own memory; the series without a pod has the rest."),
	}
}

func (m *dcgmMetrics) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.smClock, m.memClock, m.temp, m.power, m.energy, m.util, m.memCopyUtil,
		m.encUtil, m.decUtil, m.xid, m.fbFree, m.fbUsed} {
		ch <- d
	}
}

// dcgmEntity is what dcgm-exporter writes one series for: a whole GPU, or one GPU instance of a GPU in MIG mode.
type dcgmEntity struct {
	profile, instance string    // GPU_I_PROFILE, GPU_I_ID; empty for a whole GPU
	used, free, util  gpu.Value // bytes, bytes, ratio
	processes         []gpu.Process
}

// dcgmEntities are the GPU's entities: its GPU instances when it has any, else the GPU itself. A GPU instance
// split into several compute instances is one entity, as in DCGM, and its memory is the GPU instance's.
func dcgmEntities(d *gpu.Device) []dcgmEntity {
	if len(d.MIG) == 0 {
		return []dcgmEntity{{used: d.MemoryUsedBytes, free: d.MemoryFreeBytes, util: d.UtilizationRatio, processes: d.Processes}}
	}
	var out []dcgmEntity
	seen := make(map[int]bool)
	for _, mig := range d.MIG {
		if seen[mig.GPUInstance] {
			continue
		}
		seen[mig.GPUInstance] = true
		e := dcgmEntity{profile: mig.Profile, instance: itoa(mig.GPUInstance), used: mig.MemoryUsedBytes}
		if mig.MemoryTotalBytes.Valid && mig.MemoryUsedBytes.Valid {
			e.free = gpu.Known(mig.MemoryTotalBytes.V - mig.MemoryUsedBytes.V)
		}
		// NVML has no utilization of a GPU instance; DCGM's GPU_UTIL is absent there too.
		for _, p := range d.Processes {
			if p.MIG && p.GPUInstance == mig.GPUInstance {
				e.processes = append(e.processes, p)
			}
		}
		out = append(out, e)
	}
	return out
}

// dcgmShare is one series of an entity: a pod (namespace, pod, container), or none, and its FB_USED and GPU_UTIL.
type dcgmShare struct {
	namespace, pod, container string
	used, util                gpu.Value // bytes, ratio
}

// dcgmShares splits an entity between the pods that use it. A GPU that no pod uses has one series without pod
// labels and the GPU's values, as in dcgm-exporter; so has a GPU used by one pod and nothing else, with that pod's
// labels. A GPU shared by several pods, or by a pod and processes outside Kubernetes, gets a series per pod with
// the pod's own memory and SM utilization, and a series without pod labels with the rest (processes outside
// Kubernetes, the driver's own memory), so that a GPU's series still add up to the GPU. The rest is unknown when a
// process's share is. Docker and Podman containers outside Kubernetes count as pods here: they have a container
// label.
func dcgmShares(e *dcgmEntity, r *scrape.Result) []dcgmShare {
	type key struct{ namespace, pod, container string }
	var order []key
	pods := make(map[key]*dcgmShare)
	outside := false
	usedKnown, utilKnown := true, true
	for _, p := range e.processes {
		id := r.Owner(p).Identity
		k := key{id.Namespace, id.Pod, id.Container}
		if k == (key{}) {
			outside = true
			continue
		}
		s, ok := pods[k]
		if !ok {
			s = &dcgmShare{namespace: k.namespace, pod: k.pod, container: k.container}
			pods[k] = s
			order = append(order, k)
		}
		addValue(&s.used, p.UsedMemoryBytes)
		addValue(&s.util, p.SMUtilizationRatio)
		usedKnown = usedKnown && p.UsedMemoryBytes.Valid
		utilKnown = utilKnown && p.SMUtilizationRatio.Valid
	}
	switch {
	case len(order) == 0:
		return []dcgmShare{{used: e.used, util: e.util}}
	case len(order) == 1 && !outside:
		s := pods[order[0]]
		s.used, s.util = e.used, e.util
		return []dcgmShare{*s}
	}
	rest := dcgmShare{used: e.used, util: e.util}
	out := make([]dcgmShare, 0, len(order)+1)
	for _, k := range order {
		s := pods[k]
		rest.used.V -= s.used.V
		rest.util.V -= s.util.V
		out = append(out, *s)
	}
	rest.used.Valid = rest.used.Valid && usedKnown
	rest.util.Valid = rest.util.Valid && utilKnown
	// Per-process SM utilization and the GPU's busy time are sampled differently and can disagree by a little.
	rest.used.V, rest.util.V = max(rest.used.V, 0), max(rest.util.V, 0)
	return append(out, rest)
}

func (m *dcgmMetrics) update(ch chan<- prometheus.Metric, r *scrape.Result) {
	snap := r.Snapshot
	for i := range snap.Devices {
		d := &snap.Devices[i]
		var smClock, memClock gpu.Value
		for _, c := range d.Clocks {
			switch c.Name {
			case "sm":
				smClock = gpu.Known(c.Hertz / 1e6)
			case "memory":
				memClock = gpu.Known(c.Hertz / 1e6)
			}
		}
		var xid gpu.Value
		for _, x := range d.XIDErrors {
			xid = gpu.Known(max(xid.V, float64(x.XID)))
		}
		energy := scaled(d.EnergyJoules, 1000)
		idx := itoa(d.Index)
		for _, e := range dcgmEntities(d) {
			for _, s := range dcgmShares(&e, r) {
				labels := []string{idx, d.UUID, d.PCIBusID, "nvidia" + idx, d.Name, m.hostname, snap.DriverVersion,
					e.profile, e.instance, s.namespace, s.pod, s.container}
				put := func(desc *prometheus.Desc, v gpu.Value) {
					if v.Valid {
						gauge(ch, desc, v.V, labels...)
					}
				}
				put(m.smClock, smClock)
				put(m.memClock, memClock)
				put(m.temp, d.TemperatureCelsius)
				put(m.power, d.PowerUsageWatts)
				if energy.Valid {
					counter(ch, m.energy, energy.V, labels...)
				}
				put(m.util, scaled(s.util, 100))
				if e.instance == "" {
					put(m.memCopyUtil, scaled(d.MemoryUtilizationRatio, 100))
					put(m.encUtil, scaled(d.EncoderUtilizationRatio, 100))
					put(m.decUtil, scaled(d.DecoderUtilizationRatio, 100))
				}
				put(m.xid, xid)
				put(m.fbFree, scaled(e.free, 1.0/mib))
				put(m.fbUsed, scaled(s.used, 1.0/mib))
			}
		}
	}
}

func scaled(v gpu.Value, factor float64) gpu.Value {
	return gpu.Value{V: v.V * factor, Valid: v.Valid}
}
