package collector

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// podLabels maps the --kubernetes.pod-labels allowlist to label names: characters a label name may not hold become
// "_", as in kube-state-metrics (app.kubernetes.io/name becomes label_app_kubernetes_io_name). Unlike
// kube-state-metrics, upper case is kept rather than snake_cased, and of keys that sanitize to the same name the
// first is kept rather than suffixed _conflictN.
type podLabels struct {
	keys  []string
	names []string
	user  bool // the process owner's user name as "user" (--collector.process-user)
}

func newPodLabels(allow []string, user bool) podLabels {
	pl := podLabels{user: user}
	seen := map[string]bool{}
	for _, k := range allow {
		name := "label_" + sanitizeLabelName(k)
		if k == "" || seen[name] {
			continue
		}
		seen[name] = true
		pl.keys = append(pl.keys, k)
		pl.names = append(pl.names, name)
	}
	return pl
}

func sanitizeLabelName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// labelNames are base, then the identity labels of use (attribution.IdentityLabels: OnProcesses or OnWorkloads),
// then the allowlisted pod labels. The opt-in label (user) is among them with --collector.process-user.
func (pl podLabels) labelNames(use attribution.Use, base ...string) []string {
	names := base
	for _, l := range attribution.IdentityLabels {
		if pl.has(l, use) {
			names = append(names, l.Name)
		}
	}
	return append(names, pl.names...)
}

// appendIdentity appends the values of labelNames' identity and pod labels.
func (pl podLabels) appendIdentity(values []string, use attribution.Use, id *attribution.Identity) []string {
	for _, l := range attribution.IdentityLabels {
		if pl.has(l, use) {
			values = append(values, *l.Get(id))
		}
	}
	for _, k := range pl.keys {
		values = append(values, id.PodLabels[k])
	}
	return values
}

func (pl podLabels) has(l attribution.IdentityLabel, use attribution.Use) bool {
	return l.Use&use != 0 && (l.Use&attribution.OptIn == 0 || pl.user)
}

// processMetrics are the per-PID series: one per process per GPU.
type processMetrics struct {
	labels                        podLabels
	memory, sm, memUtil, enc, dec *series.Desc
}

func newProcessMetrics(labels podLabels) *processMetrics {
	names := labels.labelNames(attribution.OnProcesses, "gpu", "uuid", "pid", "process_name", "process_type", "gpu_instance", "compute_instance")
	family := func(f families.Family, help string) *series.Desc { return series.NewDesc(f.Name, help, names) }
	return &processMetrics{
		labels: labels,
		memory: family(families.ProcessMemory, "GPU memory used by the process on this GPU."),
		sm: family(families.ProcessSM, "Fraction of the GPU's SM time the process used, as the driver "+
			"averages it since the previous reading (at least the last second); 0 when it had none."),
		memUtil: family(families.ProcessMemoryUtilization, "Fraction of the GPU's memory bandwidth time the process "+
			"used, as the driver averages it since the previous reading (at least the last second)."),
		enc: family(families.ProcessEncoder, "Video encoder utilization of the process."),
		dec: family(families.ProcessDecoder, "Video decoder utilization of the process."),
	}
}

func (m *processMetrics) descs() []*series.Desc {
	return []*series.Desc{m.memory, m.sm, m.memUtil, m.enc, m.dec}
}

func (m *processMetrics) update(b *series.Batch, r *reading.Reading) {
	values := make([]string, 0, 16)
	for i := range r.Snapshot.Devices {
		d := &r.Snapshot.Devices[i]
		idx := itoa(d.Index)
		for _, p := range d.Processes {
			owner := r.Owner(p)
			gi, ci := "", ""
			if p.MIG {
				gi, ci = itoa(p.GPUInstance), itoa(p.ComputeInstance)
			}
			values = append(values[:0], idx, d.UUID, strconv.FormatUint(uint64(p.PID), 10), processName(owner.Name), p.Type, gi, ci)
			values = m.labels.appendIdentity(values, attribution.OnProcesses, &owner.Identity)
			for _, s := range []struct {
				desc *series.Desc
				v    gpu.Value
			}{{m.memory, processMemory(p)}, {m.sm, processSM(p)},
				{m.memUtil, families.ProcessMemoryUtilization.Known(p.MemoryUtilizationRatio)},
				{m.enc, families.ProcessEncoder.Known(p.EncoderUtilizationRatio)},
				{m.dec, families.ProcessDecoder.Known(p.DecoderUtilizationRatio)}} {
				if s.v.Valid {
					b.Gauge(s.desc, s.v.V, values...)
				}
			}
		}
	}
}

// processMemory and processSM are a process's memory and SM utilization where their families can hold them, as
// its series and its workload's sums read them: a driver's "not available" is unknown.
func processMemory(p gpu.Process) gpu.Value { return families.ProcessMemory.Known(p.UsedMemoryBytes) }
func processSM(p gpu.Process) gpu.Value     { return families.ProcessSM.Known(p.SMUtilizationRatio) }

// processName makes a process name a valid label value. The kernel cuts comm at 15 bytes, often in the middle of
// a multi-byte character, and NVML passes names through as bytes.
func processName(name string) string {
	if utf8.ValidString(name) {
		return name
	}
	return strings.ToValidUTF8(name, "\uFFFD")
}

// workloadMetrics sum the processes of one identity on one GPU, so that dashboards and alerts keep their series
// when PIDs change and when a container restarts in its pod. When no runtime can name a pod's containers, its
// processes in every container have the same identity (pod_uid alone) and sum into one series: deliberately, since
// a series per container ID would be a new series at every restart.
type workloadMetrics struct {
	labels                podLabels
	memory, sm, processes *series.Desc
}

func newWorkloadMetrics(labels podLabels) *workloadMetrics {
	names := labels.labelNames(attribution.OnWorkloads, "gpu", "uuid")
	family := func(f families.Family, help string) *series.Desc { return series.NewDesc(f.Name, help, names) }
	return &workloadMetrics{
		labels:    labels,
		memory:    family(families.WorkloadMemory, "GPU memory used on this GPU by all processes of the workload (pod container, container, Slurm job or service)."),
		sm:        family(families.WorkloadSM, "Sum of the SM utilization of the workload's processes on this GPU."),
		processes: family(families.WorkloadProcesses, "Processes of the workload on this GPU."),
	}
}

func (m *workloadMetrics) descs() []*series.Desc { return []*series.Desc{m.memory, m.sm, m.processes} }

type workload struct {
	id         attribution.Identity
	memory, sm gpu.Value
	processes  int
}

func (m *workloadMetrics) update(b *series.Batch, r *reading.Reading) {
	values := make([]string, 0, 16)
	for i := range r.Snapshot.Devices {
		d := &r.Snapshot.Devices[i]
		idx := itoa(d.Index)
		var order []attribution.WorkloadKey
		workloads := make(map[attribution.WorkloadKey]*workload)
		for _, p := range d.Processes {
			owner := r.Owner(p)
			key := owner.Identity.Key()
			w, ok := workloads[key]
			if !ok {
				w = &workload{id: owner.Identity}
				workloads[key] = w
				order = append(order, key)
			}
			w.processes++
			addValue(&w.memory, processMemory(p))
			addValue(&w.sm, processSM(p))
		}
		for _, key := range order {
			w := workloads[key]
			values = m.labels.appendIdentity(append(values[:0], idx, d.UUID), attribution.OnWorkloads, &w.id)
			b.Gauge(m.processes, float64(w.processes), values...)
			if w.memory.Valid {
				b.Gauge(m.memory, w.memory.V, values...)
			}
			if w.sm.Valid {
				b.Gauge(m.sm, w.sm.V, values...)
			}
		}
	}
}

// addValue adds the known values; a sum of only unknown values stays unknown.
func addValue(sum *gpu.Value, v gpu.Value) {
	if v.Valid {
		sum.V += v.V
		sum.Valid = true
	}
}
