package view

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// FromNode lays out a node's reading, and what the kubelet's allocations say of it (allocs.Known false: nothing).
func FromNode(r *reading.Reading, allocs allocation.Signals) *Reading {
	snap := r.Snapshot
	v := &Reading{Time: snap.Time, Simulated: snap.Simulated, AllocationsKnown: allocs.Known, Warnings: Warnings(snap)}
	n := 0
	for i := range snap.Devices {
		n += len(snap.Devices[i].Processes)
	}
	v.Processes = make([]Process, 0, n)
	distinct := make(map[attribution.WorkloadKey]struct{})
	for i := range snap.Devices {
		d := &snap.Devices[i]
		// Each value as its family bounds it, so that a driver's "not available" (0xFFFFFFFF) is unknown here as it
		// is absent from the exporter's series and from the cluster's view.
		g := GPU{
			Index: d.Index, UUID: d.UUID, Name: strings.TrimPrefix(d.Name, "NVIDIA "),
			Utilization: families.Utilization.Known(d.UtilizationRatio), MemoryUsed: families.MemoryUsed.Known(d.MemoryUsedBytes),
			MemoryTotal: families.MemoryTotal.Known(d.MemoryTotalBytes), Temperature: families.Temperature.Known(d.TemperatureCelsius),
			Power: families.Power.Known(d.PowerUsageWatts), MIG: d.MIGMode == gpu.MIGEnabled, MIGInstances: len(d.MIG),
			ProcessesListed: d.ProcessesListed,
		}
		h := HealthOf(d)
		g.Health, g.Severity = h.Problems()
		clear(distinct)
		for _, p := range d.Processes {
			o := r.Owner(p)
			distinct[WorkloadOf(&o.Identity)] = struct{}{}
			g.MPS = g.MPS || p.Type == gpu.ProcessMPS
			v.Processes = append(v.Processes, Process{
				GPU: d.Index, UUID: d.UUID, PID: p.PID, Name: o.Name, Type: p.Type,
				Memory: families.ProcessMemory.Known(p.UsedMemoryBytes), SM: families.ProcessSM.Known(p.SMUtilizationRatio), MIG: p.MIG, GPUInstance: p.GPUInstance, ComputeInstance: p.ComputeInstance,
				Started: o.Started, Identity: o.Identity,
			})
		}
		g.Workloads = len(distinct)
		v.GPUs = append(v.GPUs, g)
	}
	slices.SortFunc(v.GPUs, func(a, b GPU) int { return cmp.Compare(a.Index, b.Index) })
	SortProcesses(v.Processes, ByGPU)
	if allocs.Known {
		v.Signals = allocationSignals(allocs, v.GPUs)
	}
	for i := range v.GPUs {
		if s, ok := HealthSignal(&v.GPUs[i]); ok {
			v.Signals = append(v.Signals, s)
		}
	}
	SortSignals(v.Signals)
	return v
}

// WorkloadOf is the workload a process with this identity belongs to: one value of the identity labels that
// workload series carry (attribution.WorkloadKey), as gpu_workloads and the gpu_workload_* series count them. The
// processes nobody could name share the empty identity, and are one workload.
func WorkloadOf(id *attribution.Identity) attribution.WorkloadKey { return id.Key() }

// Warnings are what a node's reading could not read, one line each, naming the GPU where there is one.
func Warnings(snap *gpu.Snapshot) []string {
	var w []string
	for _, e := range snap.Errors {
		if e.Index < 0 {
			w = append(w, e.Error())
		} else {
			w = append(w, fmt.Sprintf("GPU %d: %v", e.Index, e))
		}
	}
	return w
}

// allocationSignals counts each GPU's allocations and lists the allocation signals.
func allocationSignals(a allocation.Signals, gpus []GPU) []Signal {
	byIndex := make(map[int]*GPU, len(gpus))
	for i := range gpus {
		byIndex[gpus[i].Index] = &gpus[i]
	}
	type podOnGPU struct {
		gpu           int
		namespace, pd string
	}
	allocated, idle, unrequested := make(map[podOnGPU]bool), make(map[podOnGPU]bool), make(map[podOnGPU]bool)
	var out []Signal
	for _, al := range a.Allocations {
		k := podOnGPU{al.GPU, al.Namespace, al.Pod}
		g := byIndex[al.GPU]
		if g != nil && !allocated[k] {
			allocated[k] = true
			g.AllocatedPods++
		}
		if al.Processes != 0 {
			continue
		}
		if g != nil && !idle[k] {
			idle[k] = true
			g.IdlePods++
		}
		out = append(out, AllocationSignal(IdleAllocation, "", al.GPU, al.IsMIG(), al.GPUInstance, al.ComputeInstance,
			al.Namespace, al.Pod, al.Container))
	}
	for _, u := range a.Unrequested {
		k := podOnGPU{u.GPU, u.Namespace, u.Pod}
		if g := byIndex[u.GPU]; g != nil && !unrequested[k] {
			unrequested[k] = true
			g.Unrequested++
		}
		out = append(out, AllocationSignal(Unrequested, "", u.GPU, u.IsMIG(), u.GPUInstance, u.ComputeInstance,
			u.Namespace, u.Pod, u.Container))
	}
	return out
}
