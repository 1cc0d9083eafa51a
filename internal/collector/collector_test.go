package collector

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/golden"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
)

type fixedSource struct{ snap *gpu.Snapshot }

func (s fixedSource) Name() string { return "fixed" }
func (s fixedSource) Close() error { return nil }
func (s fixedSource) Snapshot(context.Context) (*gpu.Snapshot, error) {
	return s.snap, nil
}

type fixedOwners map[uint32]attribution.Owner

func (o fixedOwners) Attribute(context.Context, *gpu.Snapshot) map[uint32]attribution.Owner { return o }

// registry is the collector behind prometheus.Gatherers, which checks every series the way a registry does:
// valid names and UTF-8, sorted label pairs, no series twice.
func registry(t testing.TB, src gpu.Source, owners reading.Attributor, opts Options) prometheus.Gatherer {
	t.Helper()
	return prometheus.Gatherers{New(reading.New(src, owners, time.Minute, slog.New(slog.DiscardHandler)), opts)}
}

// gpuFamilies is the exposition without the exporter's self-metrics, whose values vary from run to run.
func gpuFamilies(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "gpu_pod_exporter_") {
			continue
		}
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			t.Fatal(err)
		}
	}
	return buf.String()
}

// The demo node's exposition, reviewed by hand in testdata/demo.prom.
func TestDemoExposition(t *testing.T) {
	demo := simulated.Demo()
	reg := registry(t, demo, attribution.New(attribution.Config{Preset: demo}), Options{Processes: true, PodLabels: []string{"team"}})
	got := gpuFamilies(t, reg)
	// Energy, link traffic and the time a reason holds the clocks grow with time on the demo node; mask them.
	var lines []string
	for _, l := range strings.Split(got, "\n") {
		for _, growing := range []string{"gpu_energy_consumption_joules_total", "gpu_pcie_bytes_total",
			"gpu_nvlink_bytes_total", "gpu_clock_violation_seconds_total"} {
			if strings.HasPrefix(l, growing+"{") {
				l = l[:strings.LastIndex(l, " ")] + " <growing>"
			}
		}
		lines = append(lines, l)
	}
	got = strings.Join(lines, "\n")
	golden.Check(t, "testdata/demo.prom", got)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestUnknownValuesAreAbsentNotZero(t *testing.T) {
	snap := &gpu.Snapshot{Devices: []gpu.Device{{
		Index: 0, UUID: "GPU-a", MemoryTotalBytes: gpu.Known(100), ProcessesListed: false,
		Processes: []gpu.Process{{PID: 1, Type: gpu.ProcessCompute}},
	}}}
	reg := registry(t, fixedSource{snap}, fixedOwners{}, Options{Processes: true})
	for name, want := range map[string]int{
		"gpu_memory_total_bytes": 1, "gpu_memory_used_bytes": 0, "gpu_utilization_ratio": 0, "gpu_fan_speed_ratio": 0,
		"gpu_temperature_celsius": 0, "gpu_energy_consumption_joules_total": 0,
		// The process list failed, so there is no count that would say "idle".
		"gpu_processes": 0,
		// A process with unknown memory has no memory series, but its workload still counts it.
		"gpu_process_memory_used_bytes": 0, "gpu_workload_processes": 1, "gpu_workload_memory_used_bytes": 0,
	} {
		if got, err := testutil.GatherAndCount(reg, name); err != nil || got != want {
			t.Errorf("%s: %d series (err %v), want %d", name, got, err, want)
		}
	}
}

func TestWorkloadsSumProcessesOfOneIdentity(t *testing.T) {
	pod := attribution.Identity{Namespace: "ml", Pod: "train-0", Container: "main", PodUID: "u1", ContainerID: "c1",
		PodLabels: map[string]string{"app.kubernetes.io/name": "trainer", "secret": "x"}}
	snap := &gpu.Snapshot{Devices: []gpu.Device{{
		Index: 0, UUID: "GPU-a", ProcessesListed: true,
		Processes: []gpu.Process{
			{PID: 10, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(100), SMUtilizationRatio: gpu.Known(0.25)},
			{PID: 11, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(50)},
			{PID: 12, Type: gpu.ProcessGraphics, UsedMemoryBytes: gpu.Known(7), SMUtilizationRatio: gpu.Known(0.1)},
		},
	}}}
	owners := fixedOwners{10: {Name: "python", Identity: pod}, 11: {Name: "python", Identity: pod}, 12: {Name: "Xorg"}}
	reg := registry(t, fixedSource{snap}, owners, Options{Processes: false, PodLabels: []string{"app.kubernetes.io/name"}})
	want := `
# HELP gpu_workload_memory_used_bytes GPU memory used on this GPU by all processes of the workload (pod container, container, Slurm job or service).
# TYPE gpu_workload_memory_used_bytes gauge
gpu_workload_memory_used_bytes{container="",gpu="0",label_app_kubernetes_io_name="",namespace="",pod="",pod_uid="",slurm_job_id="",systemd_unit="",uuid="GPU-a"} 7
gpu_workload_memory_used_bytes{container="main",gpu="0",label_app_kubernetes_io_name="trainer",namespace="ml",pod="train-0",pod_uid="u1",slurm_job_id="",systemd_unit="",uuid="GPU-a"} 150
# HELP gpu_workload_processes Processes of the workload on this GPU.
# TYPE gpu_workload_processes gauge
gpu_workload_processes{container="",gpu="0",label_app_kubernetes_io_name="",namespace="",pod="",pod_uid="",slurm_job_id="",systemd_unit="",uuid="GPU-a"} 1
gpu_workload_processes{container="main",gpu="0",label_app_kubernetes_io_name="trainer",namespace="ml",pod="train-0",pod_uid="u1",slurm_job_id="",systemd_unit="",uuid="GPU-a"} 2
# HELP gpu_workload_sm_utilization_ratio Sum of the SM utilization of the workload's processes on this GPU.
# TYPE gpu_workload_sm_utilization_ratio gauge
gpu_workload_sm_utilization_ratio{container="",gpu="0",label_app_kubernetes_io_name="",namespace="",pod="",pod_uid="",slurm_job_id="",systemd_unit="",uuid="GPU-a"} 0.1
gpu_workload_sm_utilization_ratio{container="main",gpu="0",label_app_kubernetes_io_name="trainer",namespace="ml",pod="train-0",pod_uid="u1",slurm_job_id="",systemd_unit="",uuid="GPU-a"} 0.25
# HELP gpu_processes Processes running on the GPU, by type.
# TYPE gpu_processes gauge
gpu_processes{gpu="0",type="compute",uuid="GPU-a"} 2
gpu_processes{gpu="0",type="compute+graphics",uuid="GPU-a"} 0
gpu_processes{gpu="0",type="graphics",uuid="GPU-a"} 1
gpu_processes{gpu="0",type="mps",uuid="GPU-a"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_workload_memory_used_bytes",
		"gpu_workload_processes", "gpu_workload_sm_utilization_ratio", "gpu_processes"); err != nil {
		t.Error(err)
	}
	if n, _ := testutil.GatherAndCount(reg, "gpu_process_memory_used_bytes"); n != 0 {
		t.Errorf("--no-collector.processes still wrote %d process series", n)
	}
}

// Workload series have no container_id: a container restarted in its pod (a new container ID, the same names)
// continues its workload's series, and a pod whose containers no runtime could name has one series per pod_uid,
// the sum over its containers. Process series keep container_id.
func TestWorkloadSeriesOutliveContainerRestarts(t *testing.T) {
	named := attribution.Identity{Namespace: "ml", Pod: "train-0", Container: "main", PodUID: "u1"}
	before, after := named, named
	before.ContainerID, after.ContainerID = "c-before-restart", "c-after-restart"
	unnamedA := attribution.Identity{PodUID: "u2", ContainerID: "c-a"}
	unnamedB := attribution.Identity{PodUID: "u2", ContainerID: "c-b"}
	snap := &gpu.Snapshot{Devices: []gpu.Device{{
		Index: 0, UUID: "GPU-a", ProcessesListed: true,
		Processes: []gpu.Process{
			// The old container's last process is still listed while the new one's first appears.
			{PID: 10, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(100)},
			{PID: 11, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(50)},
			{PID: 20, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(7)},
			{PID: 21, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(3)},
		},
	}}}
	owners := fixedOwners{10: {Name: "python", Identity: before}, 11: {Name: "python", Identity: after},
		20: {Name: "a", Identity: unnamedA}, 21: {Name: "b", Identity: unnamedB}}
	reg := registry(t, fixedSource{snap}, owners, Options{Processes: true})
	want := `
# HELP gpu_workload_memory_used_bytes GPU memory used on this GPU by all processes of the workload (pod container, container, Slurm job or service).
# TYPE gpu_workload_memory_used_bytes gauge
gpu_workload_memory_used_bytes{container="",gpu="0",namespace="",pod="",pod_uid="u2",slurm_job_id="",systemd_unit="",uuid="GPU-a"} 10
gpu_workload_memory_used_bytes{container="main",gpu="0",namespace="ml",pod="train-0",pod_uid="u1",slurm_job_id="",systemd_unit="",uuid="GPU-a"} 150
# HELP gpu_workloads Distinct workloads (pod container, container, Slurm job or service; one identity of gpu_workload_processes) with processes on the GPU, MIG instances included. Absent when the process list could not be read.
# TYPE gpu_workloads gauge
gpu_workloads{gpu="0",uuid="GPU-a"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_workload_memory_used_bytes", "gpu_workloads"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "container_id" {
					if !strings.HasPrefix(mf.GetName(), "gpu_process_") {
						t.Errorf("%s has a container_id label", mf.GetName())
					}
					ids[l.GetValue()] = true
				}
			}
		}
	}
	for _, id := range []string{"c-before-restart", "c-after-restart", "c-a", "c-b"} {
		if !ids[id] {
			t.Errorf("no process series with container_id %q", id)
		}
	}
}

// A failed reading leaves out every GPU series and says so in the self-metrics.
func TestFailedReadingServesSelfMetricsOnly(t *testing.T) {
	reg := registry(t, failingSource{}, fixedOwners{}, Options{Processes: true})
	if n, _ := testutil.GatherAndCount(reg, "gpu_info"); n != 0 {
		t.Errorf("gpu_info written after a failed reading")
	}
	want := "# HELP gpu_pod_exporter_source_up 1 if the last reading of the GPU source succeeded, 0 if it failed or timed out.\n" +
		"# TYPE gpu_pod_exporter_source_up gauge\ngpu_pod_exporter_source_up{source=\"failing\"} 0\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_pod_exporter_source_up"); err != nil {
		t.Error(err)
	}
}

type failingSource struct{}

func (failingSource) Name() string { return "failing" }
func (failingSource) Close() error { return nil }
func (failingSource) Snapshot(context.Context) (*gpu.Snapshot, error) {
	return nil, fmt.Errorf("driver not loaded")
}

func TestPodLabelNames(t *testing.T) {
	pl := newPodLabels([]string{"app", "app.kubernetes.io/name", "app_kubernetes_io_name", "", "team"}, false)
	if got := strings.Join(pl.names, ","); got != "label_app,label_app_kubernetes_io_name,label_team" {
		t.Errorf("label names = %s", got)
	}
}

// A process name cut by the kernel in the middle of a UTF-8 character still gives a series, and every other series
// of the scrape is served.
func TestInvalidUTF8ProcessName(t *testing.T) {
	snap := &gpu.Snapshot{Devices: []gpu.Device{{Index: 0, UUID: "GPU-a", ProcessesListed: true, Processes: []gpu.Process{
		{PID: 1, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(1)},
		{PID: 2, Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(2)},
	}}}}
	owners := fixedOwners{1: {Name: "ab\xe8\xae"}, 2: {Name: "python3"}}
	reg := registry(t, fixedSource{snap}, owners, Options{Processes: true})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "gpu_process_memory_used_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "process_name" {
					names[l.GetValue()] = true
				}
			}
		}
	}
	if !names["ab\uFFFD"] || !names["python3"] {
		t.Errorf("process names = %v, want the invalid one repaired and the other kept", names)
	}
}

// The driver's reservation is its own family: used + free + reserved = total, as NVML's v2 memory reports it;
// absent where the source does not know it.
func TestReservedMemoryFamily(t *testing.T) {
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-a", MemoryTotalBytes: gpu.Known(100), MemoryUsedBytes: gpu.Known(30),
			MemoryFreeBytes: gpu.Known(65), MemoryReservedBytes: gpu.Known(5)},
		{Index: 1, UUID: "GPU-b", MemoryTotalBytes: gpu.Known(100), MemoryUsedBytes: gpu.Known(35), MemoryFreeBytes: gpu.Known(65)},
	}}
	reg := registry(t, fixedSource{snap}, fixedOwners{}, Options{})
	want := `# HELP gpu_memory_reserved_bytes Framebuffer memory the driver and firmware reserve for themselves; used + free + reserved = total. Absent with drivers before R510.
# TYPE gpu_memory_reserved_bytes gauge
gpu_memory_reserved_bytes{gpu="0",uuid="GPU-a"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_memory_reserved_bytes"); err != nil {
		t.Error(err)
	}
}
