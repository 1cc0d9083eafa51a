package view

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

func TestHealth(t *testing.T) {
	link := func(n int, up float64) gpu.NVLinkLink { return gpu.NVLinkLink{Link: n, Active: gpu.Known(up)} }
	pcie := func(gen, maxGen, width, maxWidth float64) gpu.PCIe {
		return gpu.PCIe{Generation: gpu.Known(gen), MaxGeneration: gpu.Known(maxGen), Width: gpu.Known(width), MaxWidth: gpu.Known(maxWidth)}
	}
	for _, c := range []struct {
		what string
		d    gpu.Device
		want []string
		sev  Severity
	}{
		{"nothing known", gpu.Device{}, nil, Healthy},
		{"healthy, with every reading", gpu.Device{
			UtilizationRatio: gpu.Known(0.9), PCIe: pcie(5, 5, 16, 16), NVLink: gpu.NVLink{Links: []gpu.NVLinkLink{link(0, 1)}},
			XIDErrors: []gpu.XIDCount{{XID: 13, Count: 4}}, // an application fault
			Health: gpu.Health{RecoveryAction: gpu.Known(0), RemapPending: gpu.Known(0), RemapFailure: gpu.Known(0),
				FabricState: gpu.Known(3), FabricHealthy: gpu.Known(1),
				ClockEvents: []gpu.ClockEvent{{Reason: "gpu_idle", Active: true}, {Reason: "sw_power_cap"}}},
		}, nil, Healthy},
		{"an idle GPU lowers its link generation", gpu.Device{UtilizationRatio: gpu.Known(0), PCIe: pcie(1, 5, 16, 16)}, nil, Healthy},
		{"a busy one does not", gpu.Device{UtilizationRatio: gpu.Known(0.7), PCIe: pcie(3, 5, 16, 16)}, []string{"PCIe gen 3 of 5"}, Degraded},
		{"half width", gpu.Device{PCIe: pcie(5, 5, 8, 16)}, []string{"PCIe x8 of x16"}, Degraded},
		{"the demo's GPU 6, most serious first", gpu.Device{
			XIDErrors: []gpu.XIDCount{{XID: 63, Count: 1}, {XID: 13, Count: 2}, {XID: 48, Count: 1}},
			Health:    gpu.Health{RecoveryAction: gpu.Known(1), RemapPending: gpu.Known(1)},
		}, []string{"needs GPU reset", "row remap pending", "XID 48, 63"}, Fault},
		{"memory beyond repair", gpu.Device{Health: gpu.Health{RemapFailure: gpu.Known(1), RecoveryAction: gpu.Known(2)}},
			[]string{"needs node reboot", "row remap failed"}, Fault},
		{"before Ampere", gpu.Device{Health: gpu.Health{RetirementPending: gpu.Known(1)}}, []string{"page retirement pending"}, Degraded},
		{"XIDs sort as numbers", gpu.Device{XIDErrors: []gpu.XIDCount{{XID: 79, Count: 1}, {XID: 74, Count: 3}}}, []string{"XID 74, 79"}, Fault},
		{"slowdowns", gpu.Device{Health: gpu.Health{ClockEvents: []gpu.ClockEvent{
			{Reason: "sw_power_cap", Active: true}, {Reason: "hw_thermal_slowdown", Active: true}, {Reason: "hw_slowdown", Active: true},
			{Reason: "hw_power_brake_slowdown", Active: true}}}},
			[]string{"thermal slowdown", "power brake", "at power cap"}, Degraded},
		// Prometheus has the links' counts, not their numbers: both views count them.
		{"links and fabric", gpu.Device{NVLink: gpu.NVLink{Links: []gpu.NVLinkLink{link(0, 1), link(3, 0), link(7, 0)}},
			Health: gpu.Health{FabricState: gpu.Known(2), FabricHealthy: gpu.Known(0)}},
			[]string{"2 of 3 NVLinks down", "fabric not ready"}, Degraded},
		{"a registered fabric with degraded bandwidth", gpu.Device{Health: gpu.Health{FabricState: gpu.Known(3), FabricHealthy: gpu.Known(0)}},
			[]string{"fabric degraded"}, Degraded},
	} {
		h := HealthOf(&c.d)
		if got, sev := h.Problems(); !slices.Equal(got, c.want) || sev != c.sev {
			t.Errorf("%s: Problems = %q, %d; want %q, %d", c.what, got, sev, c.want, c.sev)
		}
	}
}

func demo(t *testing.T) *Reading {
	t.Helper()
	src := simulated.Demo()
	snap, err := src.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	a := attribution.New(attribution.Config{Preset: src, Users: presetUsers{}})
	r := &reading.Reading{Snapshot: snap, Owners: a.Attribute(t.Context(), snap)}
	allocs, _ := src.Allocations()
	return FromNode(r, allocation.Join(allocs, r))
}

// presetUsers turns users on: the demo node presets its processes' users.
type presetUsers struct{}

func (presetUsers) User(uint32) (string, error) { return "", errors.New("not on this host") }

// The demo node's signals, the most severe first: the GPU that needs a reset, the pod using a GPU it never asked
// for, the GPUs held down, then the allocations left idle.
func TestSignalsBySeverity(t *testing.T) {
	var got []string
	for _, s := range demo(t).Signals {
		got = append(got, s.String())
	}
	want := []string{
		"GPU 6: needs GPU reset, row remap pending, XID 48, 63",
		"unrequested use: data-science/jupyter-bob-0/notebook on GPU 3",
		"GPU 3: PCIe x8 of x16",
		"GPU 4: at power cap",
		"idle allocation: ml-research/hparam-sweep-3/worker holds GPU 6",
		"idle allocation: search/rag-index-0/indexer holds GPU 7",
	}
	if !slices.Equal(got, want) {
		t.Errorf("signals:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// fixed is a GPU source of one snapshot.
type fixed struct{ snap *gpu.Snapshot }

func (f fixed) Name() string                                    { return "simulated" }
func (f fixed) Close() error                                    { return nil }
func (f fixed) Snapshot(context.Context) (*gpu.Snapshot, error) { return f.snap, nil }

type owners map[uint32]attribution.Owner

func (o owners) Attribute(context.Context, *gpu.Snapshot) map[uint32]attribution.Owner { return o }

// A workload is counted once, as gpu_workloads counts it: two processes nobody could name on one GPU are one
// workload (the empty identity), and a pod's two containers are two.
func TestWorkloadsAreTheMetricsWorkloads(t *testing.T) {
	pod := func(ctr string) attribution.Owner {
		return attribution.Owner{Name: "python", Identity: attribution.Identity{Namespace: "ml", Pod: "p", Container: ctr, PodUID: "u"}}
	}
	proc := func(pid uint32) gpu.Process {
		return gpu.Process{PID: pid, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(1 << 30)}
	}
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-0", ProcessesListed: true, Processes: []gpu.Process{proc(10), proc(11)}},
		{Index: 1, UUID: "GPU-1", ProcessesListed: true, Processes: []gpu.Process{proc(20), proc(21), proc(22)}},
	}}
	own := owners{20: pod("a"), 21: pod("b"), 22: pod("b")}
	reader := reading.New(fixed{snap}, own, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	g := collector.New(reader, collector.Options{Processes: true})
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	metric := testkit.ExpositionText(t, mfs)
	r, err := reader.Read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	v := FromNode(r, allocation.Signals{})
	for _, g := range v.GPUs {
		line := fmt.Sprintf(`gpu_workloads{gpu="%d",uuid="%s"} %d`, g.Index, g.UUID, g.Workloads)
		if !strings.Contains(metric, line+"\n") {
			t.Errorf("GPU %d: %d workloads, which the metric does not say (%s):\n%s", g.Index, g.Workloads, line, metric)
		}
	}
	if got := v.GPUs[0].Mode() + ", " + v.GPUs[1].Mode(); got != "1 workload, shared ×2" {
		t.Errorf("modes: %s", got)
	}
	// The grouped rows are those workloads: the unnamed processes one row, the pod's containers one each.
	ws := Group(v.Processes, Workloads)
	var got []string
	for _, w := range ws {
		got = append(got, fmt.Sprintf("%s %d", w.Owner, w.Processes))
	}
	if want := "[- 2 pod ml/p/a 1 pod ml/p/b 2]"; fmt.Sprint(got) != want {
		t.Errorf("workloads %v, want %s", got, want)
	}
}

// A filter finds what the row shows: any text of it, or one field.
func TestFilter(t *testing.T) {
	r := demo(t)
	pids := func(f string) string {
		var out []string
		for _, p := range r.Filtered(ParseFilter(f)).Processes {
			out = append(out, fmt.Sprint(p.PID))
		}
		return strings.Join(out, " ")
	}
	for filter, want := range map[string]string{
		"":                        "29876 31337 31412 2811 40211 40297 40388 45102 45590 45377 51234 61001 1422 73310 80412",
		"jdoe":                    "61001",                                                       // a user
		"python":                  "29876 31337 31412 40297 45102 45590 45377 51234 61001 73310", // python3, triton_python_b too
		"user:triton":             "40211 40297 40388",
		"USER:Triton gpu:1":       "40211 40297 40388",
		"gpu:2":                   "45102 45590 45377", // and its MIG devices
		"gpu:2:1/0":               "45102",
		"gpu:0,5":                 "29876 31337 31412 1422 73310 80412",
		"ns:vision":               "45102 45590 45377",
		"ns:visio":                "", // a namespace is whole
		"pid:1422":                "1422",
		"owner:slurm":             "61001",
		"88231":                   "61001", // the job, as the OWNER column shows it
		"2:13/0":                  "45590", // the GPU column
		"stable-diffusion":        "73310",
		"ollama.service user:x":   "",
		"http://example.com/path": "",
	} {
		if got := pids(filter); got != want {
			t.Errorf("filter %q: %s, want %s", filter, got, want)
		}
	}
}

// Memory fits its 8 columns at any size, from a MiB to PiBs.
func TestMemoryFits(t *testing.T) {
	for _, c := range []struct {
		bytes float64
		want  string
	}{
		{0, "0 MiB"}, {512 << 20, "512 MiB"}, {(1 << 30) - 1, "1023 MiB"}, {22.5 * (1 << 30), "22.5 GiB"},
		{99.9 * (1 << 30), "99.9 GiB"}, {581.1 * (1 << 30), "581 GiB"}, {999 * (1 << 30), "999 GiB"},
		{1023 * (1 << 30), "1.0 TiB"}, {1.2 * (1 << 40), "1.2 TiB"}, {128 * (1 << 40), "128 TiB"}, {1 << 60, "9999 TiB"},
	} {
		got := Memory(gpu.Known(c.bytes))
		if got != c.want || len(got) > 8 {
			t.Errorf("Memory(%v) = %q, want %q in 8 columns", c.bytes, got, c.want)
		}
	}
	if Memory(gpu.Value{}) != "-" || Percent(gpu.Value{}) != "-" || Percent(gpu.Known(7.6)) != "760%" {
		t.Error("unknown memory or SM is not -, or summed SM is not a percentage")
	}
}

// A node's history is the mean of each 10 s of readings, the latest last; a GPU gone for the whole span is
// forgotten.
func TestRecorder(t *testing.T) {
	rec := NewRecorder()
	start := time.Unix(1_800_000_000, 0)
	read := func(at time.Duration, util float64, gpus ...string) *Reading {
		r := &Reading{Time: start.Add(at)}
		for _, u := range gpus {
			r.GPUs = append(r.GPUs, GPU{UUID: u, Utilization: gpu.Known(util), MemoryUsed: gpu.Known(1), MemoryTotal: gpu.Known(4)})
		}
		rec.Record(r)
		return r
	}
	read(0, 0.2, "GPU-a")
	read(2*time.Second, 0.4, "GPU-a")
	r := read(10*time.Second, 0.9, "GPU-a", "GPU-b")
	h := r.History.GPUs[GPUKey("", "GPU-a")]
	n := HistoryPoints
	if !approx(h.Utilization[n-2], 0.3) || h.Utilization[n-1] != 0.9 || !math.IsNaN(h.Utilization[n-3]) || h.Memory[n-1] != 0.25 {
		t.Errorf("GPU-a's history ends %v, want … NaN 0.3 0.9", h.Utilization[n-3:])
	}
	r = read(HistorySpan+20*time.Second, 0.5, "GPU-b")
	if _, ok := r.History.GPUs[GPUKey("", "GPU-a")]; ok || len(r.History.GPUs) != 1 {
		t.Errorf("a GPU gone for the whole span is kept: %v", r.History.GPUs)
	}
}

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// The lines to copy quote what a shell would read, and put the names after "--", where a name that starts with "-"
// is not an option.
func TestCommands(t *testing.T) {
	for _, c := range []struct {
		id   attribution.Identity
		want []string
	}{
		{attribution.Identity{Namespace: "ml", Pod: "train-0", Container: "main"},
			[]string{"kubectl -n ml describe pod -- train-0", "kubectl -n ml logs -c main -- train-0"}},
		{attribution.Identity{Namespace: "-A", Pod: "--all-namespaces", Container: "-p"},
			[]string{"kubectl -n -A describe pod -- --all-namespaces", "kubectl -n -A logs -c -p -- --all-namespaces"}},
		{attribution.Identity{SlurmJobID: "4711"}, []string{"scontrol show job -- 4711"}},
		{attribution.Identity{SlurmJobID: "--all"}, []string{"scontrol show job -- --all"}},
		{attribution.Identity{SystemdUnit: "run-$(reboot)'.scope"},
			[]string{`systemctl status -- 'run-$(reboot)'\''.scope'`, `journalctl -u 'run-$(reboot)'\''.scope'`}},
		// A delegated cgroup's unit, named by its user.
		{attribution.Identity{SystemdUnit: "--host=x.service"},
			[]string{"systemctl status -- --host=x.service", "journalctl -u --host=x.service"}},
		{attribution.Identity{Container: "--privileged", Runtime: "docker"},
			[]string{"docker inspect -- --privileged", "docker logs -- --privileged"}},
		{attribution.Identity{ContainerID: "-v", Runtime: "containerd"}, []string{"crictl inspect -- -v"}},
	} {
		if got := Commands(&Process{Identity: c.id}); !slices.Equal(got, c.want) {
			t.Errorf("%+v:\n got %q\nwant %q", c.id, got, c.want)
		}
	}
}

// Sorting in place moves each process to where a stable sort of its key puts it.
func TestSortProcessesInPlace(t *testing.T) {
	var ps []Process
	for i := range 300 {
		ps = append(ps, Process{Node: fmt.Sprint("n", i%7), GPU: i % 5, PID: uint32(i * 7919 % 1000), Memory: gpu.Known(float64(i % 13)),
			SM: gpu.Value{V: float64(i % 11), Valid: i%3 != 0}, Name: fmt.Sprint("p", i)})
	}
	for _, s := range []Sort{ByGPU, ByMemory, BySM, ByPID, ByOwner} {
		got := slices.Clone(ps)
		SortProcesses(got, s)
		want := slices.Clone(ps)
		slices.SortStableFunc(want, func(a, b Process) int { ka, kb := a.sortKey(s), b.sortKey(s); return s.compare(&ka, &kb) })
		for i := range want {
			if got[i].Name != want[i].Name {
				t.Fatalf("sort %v: row %d is %s, want %s", s, i, got[i].Name, want[i].Name)
			}
		}
	}
}

// A GPU whose driver answers "not available" with NVML_VALUE_NOT_AVAILABLE (0xFFFFFFFF, 2^64-1, as the source scales
// them) shows nothing for those values, as the exporter writes no series of them and the cluster's view shows
// none: no utilization of 4294967295%, no 4.29e9 °C, no health line "PCIe x16 of x4294967295", no history point.
func TestSentinelsAreUnknown(t *testing.T) {
	const u32, u64 = math.MaxUint32, math.MaxUint64
	d := gpu.Device{UUID: "GPU-f1", Name: "NVIDIA H100 80GB HBM3", ProcessesListed: true,
		UtilizationRatio: gpu.Known(u32 / 100.0), TemperatureCelsius: gpu.Known(u32), PowerUsageWatts: gpu.Known(u32 / 1000.0),
		MemoryUsedBytes: gpu.Known(u64), MemoryTotalBytes: gpu.Known(85520809984),
		PCIe:      gpu.PCIe{Width: gpu.Known(16), MaxWidth: gpu.Known(u32), Generation: gpu.Known(u32), MaxGeneration: gpu.Known(5)},
		Health:    gpu.Health{RecoveryAction: gpu.Known(u32), RemapPending: gpu.Known(u32), FabricState: gpu.Known(u32)},
		Processes: []gpu.Process{{PID: 7, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(u64), SMUtilizationRatio: gpu.Known(371)}},
	}
	r := FromNode(&reading.Reading{Snapshot: &gpu.Snapshot{Time: time.Unix(1765000000, 0), Devices: []gpu.Device{d}}}, allocation.Signals{})
	g := r.GPUs[0]
	if g.Utilization.Valid || g.Temperature.Valid || g.Power.Valid || g.MemoryUsed.Valid || !g.MemoryTotal.Valid {
		t.Errorf("GPU line %+v: want utilization, temperature, power and used memory unknown, total known", g)
	}
	if len(g.Health) > 0 || len(r.Signals) > 0 {
		t.Errorf("health %q, signals %v from sentinels", g.Health, r.Signals)
	}
	if p := r.Processes[0]; p.Memory.Valid || p.SM.Valid {
		t.Errorf("process memory %+v, SM %+v from sentinels", p.Memory, p.SM)
	}
	rec := NewRecorder()
	rec.Record(r)
	if h := r.History.GPUs[GPUKey("", "GPU-f1")]; !empty(h.Utilization) || !empty(h.Memory) {
		t.Errorf("history from sentinels: %v, %v", h.Utilization, h.Memory)
	}
}
