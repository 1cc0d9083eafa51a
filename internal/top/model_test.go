package top

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

const gib = 1 << 30

func proc(pid uint32, mem float64, sm gpu.Value) gpu.Process {
	p := gpu.Process{PID: pid, Type: gpu.ProcessCompute, SMUtilizationRatio: sm}
	if mem >= 0 {
		p.UsedMemoryBytes = gpu.Known(mem)
	}
	return p
}

func pod(ns, name, ctr, comm string) attribution.Owner {
	return attribution.Owner{Name: comm, Identity: attribution.Identity{Namespace: ns, Pod: name, Container: ctr, PodUID: name + "-uid"}}
}

// node is a node with the shapes top lays out: a time-sliced GPU with one pod in two containers and a service,
// a MIG GPU, an MPS GPU, a GPU whose processes could not be listed, and an idle one held by a pod.
func node() Reading {
	mig := func(p gpu.Process, gi int) gpu.Process {
		p.MIG, p.GPUInstance = true, gi
		return p
	}
	mps := func(p gpu.Process) gpu.Process {
		p.Type = gpu.ProcessMPS
		return p
	}
	snap := &gpu.Snapshot{Simulated: true, Devices: []gpu.Device{
		{Index: 1, UUID: "GPU-1", Name: "NVIDIA A100-SXM4-80GB", MIGMode: "enabled", ProcessesListed: true,
			MIG:       []gpu.MIGInstance{{UUID: "MIG-a", GPUInstance: 1}, {UUID: "MIG-b", GPUInstance: 2}},
			Processes: []gpu.Process{mig(proc(20, 10*gib, gpu.Value{}), 1), mig(proc(21, 5*gib, gpu.Value{}), 2)}},
		{Index: 0, UUID: "GPU-0", Name: "NVIDIA H100 80GB HBM3", ProcessesListed: true,
			UtilizationRatio: gpu.Known(0.71), MemoryUsedBytes: gpu.Known(40 * gib), MemoryTotalBytes: gpu.Known(80 * gib),
			TemperatureCelsius: gpu.Known(52), PowerUsageWatts: gpu.Known(402.3), PowerLimitWatts: gpu.Known(700),
			Processes: []gpu.Process{proc(12, 8*gib, gpu.Known(0.30)), proc(11, 2*gib, gpu.Known(0.05)), proc(10, 1*gib, gpu.Known(0.40))}},
		{Index: 2, UUID: "GPU-2", Name: "NVIDIA L4", ProcessesListed: true,
			Processes: []gpu.Process{mps(proc(30, -1, gpu.Known(0.2))), mps(proc(31, 3*gib, gpu.Known(0.1))), proc(32, 1*gib, gpu.Value{})}},
		{Index: 3, UUID: "GPU-3", Name: "NVIDIA L4", ProcessesListed: false},
		{Index: 4, UUID: "GPU-4", Name: "NVIDIA L4", ProcessesListed: true},
	}, Errors: []gpu.DeviceError{{Index: 3, Operation: "processes", Err: fmt.Errorf("not supported")}}}
	owners := map[uint32]attribution.Owner{
		10: {Name: "ollama", Identity: attribution.Identity{SystemdUnit: "ollama.service"}},
		11: pod("ml", "train-0", "sidecar", "python3"),
		12: pod("ml", "train-0", "trainer", "python3"),
		20: pod("vision", "resnet", "train", "python3"),
		21: {Name: "job", Identity: attribution.Identity{SlurmJobID: "88231"}},
		30: pod("inference", "triton-0", "triton", "tritonserver"),
		31: pod("inference", "triton-1", "triton", "tritonserver"),
		// 32 is owned by nobody that attribution knows.
	}
	dev := func(index, gi, ci int) allocation.Device {
		return allocation.Device{GPU: index, UUID: fmt.Sprintf("GPU-%d", index), GPUInstance: gi, ComputeInstance: ci}
	}
	allocs := allocation.Signals{
		Known: true,
		Allocations: []allocation.Allocation{
			{Device: dev(0, -1, -1), Namespace: "ml", Pod: "train-0", Container: "trainer", Processes: 2},
			{Device: dev(0, -1, -1), Namespace: "ml", Pod: "train-0", Container: "sidecar", Processes: 2},
			{Device: dev(1, 1, 0), Namespace: "vision", Pod: "resnet", Container: "train", Processes: 1},
			{Device: dev(2, -1, -1), Namespace: "inference", Pod: "triton-0", Container: "triton", Processes: 1},
			{Device: dev(4, -1, -1), Namespace: "ml", Pod: "sweep-3", Container: "worker", Processes: 0},
			{Device: dev(3, -1, -1), Namespace: "ml", Pod: "blind", Container: "c", Processes: -1},
		},
		Unrequested: []allocation.Use{
			{Device: dev(2, -1, -1), Namespace: "inference", Pod: "triton-1", Container: "triton"},
		},
	}
	return Reading{Result: &reading.Reading{Snapshot: snap, Owners: owners}, Allocations: allocs}
}

func TestHeaders(t *testing.T) {
	s := Build(node(), View{})
	if !s.Simulated || !s.AllocationsKnown || s.Processes != 8 {
		t.Errorf("simulated %v, allocations known %v, %d processes", s.Simulated, s.AllocationsKnown, s.Processes)
	}
	var got []string
	for _, g := range s.GPUs {
		got = append(got, fmt.Sprintf("%d %s [%s] pods=%d unrequested=%d idle=%d", g.Index, g.Name, g.Mode, g.AllocatedPods, g.Unrequested, g.IdlePods))
	}
	want := []string{
		"0 H100 80GB HBM3 [shared ×3] pods=1 unrequested=0 idle=0", // two containers of one pod and a service, as gpu_workloads counts
		"1 A100-SXM4-80GB [MIG ×2] pods=1 unrequested=0 idle=0",
		"2 L4 [MPS ×3] pods=1 unrequested=1 idle=0", // two pods and a process nobody owns
		"3 L4 [?] pods=1 unrequested=0 idle=0",      // the process list could not be read
		"4 L4 [idle] pods=1 unrequested=0 idle=1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("headers:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	g0 := s.GPUs[0]
	if g0.Utilization.V != 0.71 || g0.MemoryUsed.V != 40*gib || g0.Temperature.V != 52 || g0.Power.V != 402.3 {
		t.Errorf("GPU 0 values: %+v", g0)
	}
	if s.GPUs[1].Utilization.Valid {
		t.Error("an unknown utilization became known")
	}

	var signals []string
	for _, sig := range s.Signals {
		signals = append(signals, sig.String())
	}
	if fmt.Sprint(signals) != "[unrequested use: inference/triton-1/triton on GPU 2 idle allocation: ml/sweep-3/worker holds GPU 4]" {
		t.Errorf("signals: %q", signals)
	}
	if fmt.Sprint(s.Warnings) != "[GPU 3: processes: not supported]" {
		t.Errorf("warnings: %q", s.Warnings)
	}

	// Without allocations, nothing is said about them.
	rd := node()
	rd.Allocations = allocation.Signals{}
	if s := Build(rd, View{}); s.AllocationsKnown || len(s.Signals) > 0 || s.GPUs[4].AllocatedPods != 0 {
		t.Errorf("unknown allocations: %+v", s)
	}
}

func pids(rows []Row) string {
	var out []string
	for _, r := range rows {
		out = append(out, r.PID)
	}
	return strings.Join(out, " ")
}

func TestRowsAndOwners(t *testing.T) {
	s := Build(node(), View{})
	var got []string
	for _, r := range s.Rows {
		got = append(got, strings.Join([]string{r.GPU, r.PID, dash(r.Process), ps.Memory(r.Memory), ps.Percent(r.SM), r.Owner}, "|"))
	}
	want := []string{
		"0|10|ollama|1.0 GiB|40%|service ollama.service",
		"0|11|python3|2.0 GiB|5%|pod ml/train-0/sidecar",
		"0|12|python3|8.0 GiB|30%|pod ml/train-0/trainer",
		"1:1/0|20|python3|10.0 GiB|-|pod vision/resnet/train",
		"1:2/0|21|job|5.0 GiB|-|slurm job 88231",
		"2|30|tritonserver|-|20%|pod inference/triton-0/triton",
		"2|31|tritonserver|3.0 GiB|10%|pod inference/triton-1/triton",
		"2|32|-|1.0 GiB|-|-",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSort(t *testing.T) {
	for by, want := range map[Sort]string{
		ByGPU:    "10 11 12 20 21 30 31 32",
		ByMemory: "20 12 21 31 11 10 32 30", // unknown memory last; equal memory by GPU, then PID
		BySM:     "10 12 30 31 11 20 21 32", // unknown SM last, by GPU then PID
	} {
		if got := pids(Build(node(), View{Sort: by}).Rows); got != want {
			t.Errorf("by %s: %s, want %s", by, got, want)
		}
	}
	for in, want := range map[string]Sort{"gpu": ByGPU, "memory": ByMemory, "SM": BySM} {
		if got, err := ParseSort(in); err != nil || got != want {
			t.Errorf("ParseSort(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseSort("pid"); err == nil {
		t.Error("ParseSort accepted pid")
	}
}

func TestFilter(t *testing.T) {
	for filter, want := range map[string]string{
		"":          "10 11 12 20 21 30 31 32",
		"ML":        "11 12", // a namespace, case-insensitive
		"inference": "30 31",
		"triton-1":  "31", // a part of the owner
		"88231":     "21", // a Slurm job
		"service":   "10", // the kind of owner
		"nope":      "",
	} {
		if got := pids(Build(node(), View{Filter: filter}).Rows); got != want {
			t.Errorf("filter %q: %q, want %q", filter, got, want)
		}
	}
}

func TestGroupByWorkload(t *testing.T) {
	s := Build(node(), View{Group: true, Sort: ByMemory})
	var got []string
	for _, r := range s.Rows {
		got = append(got, strings.Join([]string{r.GPU, r.PID, dash(r.Process), ps.Memory(r.Memory), ps.Percent(r.SM), r.Owner}, "|"))
	}
	want := []string{
		"0|2 procs|python3|10.0 GiB|35%|pod ml/train-0", // two containers of one pod, summed
		"1|20|python3|10.0 GiB|-|pod vision/resnet",
		"1|21|job|5.0 GiB|-|slurm job 88231",
		"2|31|tritonserver|3.0 GiB|10%|pod inference/triton-1",
		"0|10|ollama|1.0 GiB|40%|service ollama.service",
		"2|32|-|1.0 GiB|-|-",                             // nobody's process stays a row of its own
		"2|30|tritonserver|-|20%|pod inference/triton-0", // unknown memory stays unknown, not 0
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("grouped rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := pids(Build(node(), View{Group: true, Filter: "ml"}).Rows); got != "2 procs" {
		t.Errorf("grouped and filtered: %q", got)
	}
}

// One pod on two GPUs is one row when grouped, with both GPUs named.
func TestGroupAcrossGPUs(t *testing.T) {
	rd := node()
	rd.Result.Owners[20] = pod("ml", "train-0", "trainer", "python3")
	s := Build(rd, View{Group: true, Filter: "train-0"})
	if len(s.Rows) != 1 || s.Rows[0].GPU != "0,1" || s.Rows[0].PID != "3 procs" || s.Rows[0].Memory.V != 20*gib {
		t.Errorf("rows: %+v", s.Rows)
	}
}
