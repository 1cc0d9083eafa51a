package cluster

import (
	"slices"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// family is one of the exporter's families that the cluster view reads: its name, unit and range from the
// exporter's table (internal/families), and the labels the view reads of it (besides the node's). A value outside
// the range is dropped as unknown, as the exporter leaves it out and the node's view shows it. Every query names
// its families from here, and a unit test holds the labels to what the exporter writes, so that a family or label
// renamed in the exporter fails a test here rather than a reading in the field.
type family struct {
	families.Family
	labels []string
}

// plausible reports whether v is a value the family can hold: not NaN, not infinite, within its range.
func (f family) plausible(v float64) bool { return f.Range.Holds(v) }

var gpuLabels = []string{"gpu", "uuid"}

var (
	buildInfo     = family{families.BuildInfo, nil}
	sourceUp      = family{families.SourceUp, nil}
	unmapped      = family{families.UnmappedDevices, nil}
	gpuInfo       = family{families.GPUInfo, append(slices.Clip(gpuLabels), "name", "mig_mode", "simulated")}
	processMemory = family{families.ProcessMemory, processLabels()}
	processSM     = family{families.ProcessSM, processLabels()}
	utilization   = family{families.Utilization, gpuLabels}
	memoryUsed    = family{families.MemoryUsed, gpuLabels}
	memoryTotal   = family{families.MemoryTotal, gpuLabels}
	temperature   = family{families.Temperature, gpuLabels}
	power         = family{families.Power, gpuLabels}
	workloads     = family{families.Workloads, gpuLabels}
	processes     = family{families.Processes, append(slices.Clip(gpuLabels), "type")}
	migInfo       = family{families.MIGInfo, append(slices.Clip(gpuLabels), migKeyLabels...)}
	allocInfo     = family{families.AllocationInfo, append(slices.Clip(gpuLabels), "namespace", "pod")}
	allocProcs    = family{families.AllocationProcesses, allocationLabels}
	unrequested   = family{families.UnrequestedUse, allocationLabels}
	workloadSM    = family{families.WorkloadSM, workloadLabels()}

	// The families of a GPU's health (view.Health).
	recoveryAction    = family{families.RecoveryAction, gpuLabels}
	remapFailure      = family{families.RowRemapFailure, gpuLabels}
	remapPending      = family{families.RowRemapPending, gpuLabels}
	retirementPending = family{families.RetiredPagesPending, gpuLabels}
	xidErrors         = family{families.XIDErrors, append(slices.Clip(gpuLabels), "xid")}
	clockEvents       = family{families.ClockEventActive, append(slices.Clip(gpuLabels), "reason")}
	pcieWidth         = family{families.PCIeLinkWidth, gpuLabels}
	pcieMaxWidth      = family{families.PCIeLinkMaxWidth, gpuLabels}
	pcieGeneration    = family{families.PCIeLinkGeneration, gpuLabels}
	pcieMaxGeneration = family{families.PCIeLinkMaxGeneration, gpuLabels}
	nvlinks           = family{families.NVLinks, append(slices.Clip(gpuLabels), "state")}
	fabricState       = family{families.FabricState, gpuLabels}
	fabricHealthy     = family{families.FabricHealthy, gpuLabels}
)

// familiesRead are every family the view reads.
var familiesRead = []family{buildInfo, sourceUp, unmapped, gpuInfo, processMemory, processSM, utilization, memoryUsed,
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
	i := slices.IndexFunc(familiesRead, func(f family) bool { return f.Name == name })
	if i < 0 {
		return family{}, false
	}
	return familiesRead[i], true
}

// migKeyLabels are what tell a GPU's MIG instances apart.
var migKeyLabels = []string{"gpu_instance", "compute_instance"}

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
