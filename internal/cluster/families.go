package cluster

import (
	"math"
	"slices"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// family is one of the exporter's families that the cluster view reads: its name, the labels the view reads of
// it (besides the node's), and the values it can hold, outside which a value is unknown. Every query names its
// families from here, and a unit test holds the table to what the exporter writes, so that a family renamed in the
// exporter fails a test here rather than a reading in the field.
type family struct {
	name   string
	labels []string
	// min and max bound a plausible value: NaN, ±Inf and values outside them are dropped as unknown.
	min, max float64
}

// plausible reports whether v is a value the family can hold.
func (f family) plausible(v float64) bool {
	return !math.IsNaN(v) && v >= f.min && v <= f.max
}

const (
	maxBytes = 1 << 50 // a PiB: no GPU holds more
	maxCount = 1 << 24
)

var gpuLabels = []string{"gpu", "uuid"}

var (
	buildInfo     = family{name: "gpu_pod_exporter_build_info", max: 1}
	sourceUp      = family{name: "gpu_pod_exporter_source_up", max: 1}
	unmapped      = family{name: "gpu_pod_exporter_kubelet_unmapped_devices", max: maxCount}
	gpuInfo       = family{name: "gpu_info", labels: append(slices.Clip(gpuLabels), "name", "mig_mode", "simulated"), max: 1}
	processMemory = family{name: "gpu_process_memory_used_bytes", labels: processLabels(), max: maxBytes}
	processSM     = family{name: "gpu_process_sm_utilization_ratio", labels: processLabels(), max: 1}
	utilization   = family{name: "gpu_utilization_ratio", labels: gpuLabels, max: 1}
	memoryUsed    = family{name: "gpu_memory_used_bytes", labels: gpuLabels, max: maxBytes}
	memoryTotal   = family{name: "gpu_memory_total_bytes", labels: gpuLabels, max: maxBytes}
	temperature   = family{name: "gpu_temperature_celsius", labels: gpuLabels, min: -100, max: 300}
	power         = family{name: "gpu_power_usage_watts", labels: gpuLabels, max: 100000}
	workloads     = family{name: "gpu_workloads", labels: gpuLabels, max: maxCount}
	processes     = family{name: "gpu_processes", labels: append(slices.Clip(gpuLabels), "type"), max: maxCount}
	migInfo       = family{name: "gpu_mig_info", labels: gpuLabels, max: 1}
	allocInfo     = family{name: "gpu_allocation_info", labels: append(slices.Clip(gpuLabels), "namespace", "pod"), max: 1}
	allocProcs    = family{name: "gpu_allocation_processes", labels: allocationLabels, min: -1, max: maxCount}
	unrequested   = family{name: "gpu_unrequested_use", labels: allocationLabels, max: 1}
	workloadSM    = family{name: "gpu_workload_sm_utilization_ratio", labels: workloadLabels(), max: maxCount}

	// The families of a GPU's health (view.Health).
	recoveryAction    = family{name: "gpu_recovery_action", labels: gpuLabels, max: 4}
	remapFailure      = family{name: "gpu_row_remap_failure", labels: gpuLabels, max: 1}
	remapPending      = family{name: "gpu_row_remap_pending", labels: gpuLabels, max: 1}
	retirementPending = family{name: "gpu_retired_pages_pending", labels: gpuLabels, max: 1}
	xidErrors         = family{name: "gpu_xid_errors_total", labels: append(slices.Clip(gpuLabels), "xid"), max: math.MaxFloat64}
	clockEvents       = family{name: "gpu_clock_event_active", labels: append(slices.Clip(gpuLabels), "reason"), max: 1}
	pcieWidth         = family{name: "gpu_pcie_link_width", labels: gpuLabels, max: 64}
	pcieMaxWidth      = family{name: "gpu_pcie_link_max_width", labels: gpuLabels, max: 64}
	pcieGeneration    = family{name: "gpu_pcie_link_generation", labels: gpuLabels, max: 16}
	pcieMaxGeneration = family{name: "gpu_pcie_link_max_generation", labels: gpuLabels, max: 16}
	nvlinks           = family{name: "gpu_nvlink_links", labels: append(slices.Clip(gpuLabels), "state"), max: 1024}
	fabricState       = family{name: "gpu_fabric_state", labels: gpuLabels, max: 3}
	fabricHealthy     = family{name: "gpu_fabric_healthy", labels: gpuLabels, max: 1}
)

// families are every family the view reads.
var families = []family{buildInfo, sourceUp, unmapped, gpuInfo, processMemory, processSM, utilization, memoryUsed,
	memoryTotal, temperature, power, workloads, processes, migInfo, allocInfo, allocProcs, unrequested, workloadSM,
	recoveryAction, remapFailure, remapPending, retirementPending, xidErrors, clockEvents, pcieWidth, pcieMaxWidth,
	pcieGeneration, pcieMaxGeneration, nvlinks, fabricState, fabricHealthy}

// gpuLine are the readings of a GPU's line, each with what it fills of view.GPU: a column of top's GPU lines is a
// row here and a field there.
var gpuLine = []gpuLineFamily{
	{utilization, func(g *view.GPU, v gpu.Value) { g.Utilization = v }},
	{memoryUsed, func(g *view.GPU, v gpu.Value) { g.MemoryUsed = v }},
	{memoryTotal, func(g *view.GPU, v gpu.Value) { g.MemoryTotal = v }},
	{temperature, func(g *view.GPU, v gpu.Value) { g.Temperature = v }},
	{power, func(g *view.GPU, v gpu.Value) { g.Power = v }},
	// Absent when the GPU's process list could not be read.
	{workloads, func(g *view.GPU, v gpu.Value) { g.ProcessesListed, g.Workloads = v.Valid, int(v.V) }},
}

// gpuLineFamily is a family of a GPU's line and the field of view.GPU it fills.
type gpuLineFamily struct {
	family
	set func(g *view.GPU, v gpu.Value)
}

// familyNamed finds a family of the table by name.
func familyNamed(name string) (family, bool) {
	i := slices.IndexFunc(families, func(f family) bool { return f.name == name })
	if i < 0 {
		return family{}, false
	}
	return families[i], true
}

var allocationLabels = append(slices.Clip(gpuLabels), "gpu_instance", "compute_instance", "namespace", "pod", "container")

// processLabels are the labels of a process series that its row reads: where it runs, then the identity labels
// that are on process series and in ps' rows (attribution.IdentityLabels).
func processLabels() []string {
	ls := append(slices.Clip(gpuLabels), "pid", "process_name", "process_type", "gpu_instance", "compute_instance")
	for _, l := range attribution.IdentityLabels {
		if l.Use&attribution.OnProcesses != 0 && l.Use&attribution.InPS != 0 && l.Use&attribution.OptIn == 0 {
			ls = append(ls, l.Name)
		}
	}
	return ls
}

// identityLabels are the identity labels a process row reads: those on process series and in ps' rows, the
// opt-in user among them (absent unless the exporter writes it).
func identityLabels() []attribution.IdentityLabel {
	var ls []attribution.IdentityLabel
	for _, l := range attribution.IdentityLabels {
		if l.Use&attribution.OnProcesses != 0 && l.Use&attribution.InPS != 0 {
			ls = append(ls, l)
		}
	}
	return ls
}

// workloadLabels are the labels of a workload series: its identity (attribution.WorkloadKey), the opt-in user
// left out (absent unless the exporter writes it).
func workloadLabels() []string {
	var ls []string
	for _, l := range attribution.IdentityLabels {
		if l.Use&attribution.OnWorkloads != 0 && l.Use&attribution.OptIn == 0 {
			ls = append(ls, l.Name)
		}
	}
	return ls
}

// workloadKeyLabels are all the labels of a workload's identity, the opt-in user included, for by (…).
func workloadKeyLabels() []string {
	var ls []string
	for _, l := range attribution.IdentityLabels {
		if l.Use&attribution.OnWorkloads != 0 {
			ls = append(ls, l.Name)
		}
	}
	return ls
}
