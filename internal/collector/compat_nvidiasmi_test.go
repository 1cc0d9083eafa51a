package collector

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/golden"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

const gib = 1 << 30

// compatNode is a small node for the compatibility outputs: GPU 0 shared by two pods and a process outside
// Kubernetes, GPU 1 used by one pod with a process of unknown memory, GPU 2 in MIG mode with one PID on two compute
// instances of one GPU instance and an idle instance, GPU 3 idle with most values unknown.
func compatNode() (*gpu.Snapshot, fixedOwners) {
	pod := func(ns, name, container string) attribution.Identity {
		return attribution.Identity{Namespace: ns, Pod: name, Container: container, PodUID: "uid-" + name}
	}
	owners := fixedOwners{
		100: {Name: "python3", Identity: pod("ml", "train-0", "trainer")},
		101: {Name: "tritonserver", Identity: pod("serve", "triton-0", "triton")},
		102: {Name: "ollama", Identity: attribution.Identity{SystemdUnit: "ollama.service"}},
		200: {Name: "python", Identity: pod("ml", "solo-0", "main")},
		201: {Name: "python", Identity: pod("ml", "solo-0", "main")},
		300: {Name: "python3", Identity: pod("vision", "mig-0", "app")},
	}
	clocks := []gpu.Clock{{Name: "graphics", Hertz: 1755e6}, {Name: "sm", Hertz: 1755e6}, {Name: "memory", Hertz: 2619e6}}
	snap := &gpu.Snapshot{DriverVersion: "580.95.05", CUDAVersion: "13.0", Devices: []gpu.Device{
		{
			Index: 0, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000", Vendor: gpu.VendorNVIDIA, Name: "NVIDIA H100 80GB HBM3",
			PCIBusID: "00000000:18:00.0", MIGMode: "disabled",
			MemoryTotalBytes: gpu.Known(80 * gib), MemoryUsedBytes: gpu.Known(10 * gib), MemoryFreeBytes: gpu.Known(70 * gib),
			UtilizationRatio: gpu.Known(0.8), MemoryUtilizationRatio: gpu.Known(0.3),
			EncoderUtilizationRatio: gpu.Known(0), DecoderUtilizationRatio: gpu.Known(0.05),
			TemperatureCelsius: gpu.Known(50), PowerUsageWatts: gpu.Known(300.5), EnergyJoules: gpu.Known(1000.25),
			Clocks: clocks, ProcessesListed: true,
			Processes: []gpu.Process{
				{PID: 100, Name: "/usr/bin/python3", Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(4 * gib), SMUtilizationRatio: gpu.Known(0.5)},
				{PID: 101, Name: "tritonserver", Type: gpu.ProcessMPS, UsedMemoryBytes: gpu.Known(2 * gib), SMUtilizationRatio: gpu.Known(0.2)},
				{PID: 102, Name: "ollama", Type: gpu.ProcessComputeAndGraphics, UsedMemoryBytes: gpu.Known(1 * gib), SMUtilizationRatio: gpu.Known(0.05)},
			},
		},
		{
			Index: 1, UUID: "GPU-bbbbbbbb-0000-0000-0000-000000000000", Vendor: gpu.VendorNVIDIA, Name: "NVIDIA H100 80GB HBM3",
			PCIBusID: "00000000:2A:00.0", MIGMode: "disabled",
			MemoryUsedBytes: gpu.Known(8 * gib), MemoryFreeBytes: gpu.Known(72 * gib), PowerUsageWatts: gpu.Known(200),
			XIDErrors: []gpu.XIDCount{{XID: 13, Count: 2}, {XID: 79, Count: 1}}, ProcessesListed: true,
			Processes: []gpu.Process{
				{PID: 200, Name: "python", Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(6 * gib)},
				{PID: 201, Name: "", Type: gpu.ProcessGraphics},
			},
		},
		{
			Index: 2, UUID: "GPU-cccccccc-0000-0000-0000-000000000000", Vendor: gpu.VendorNVIDIA, Name: "NVIDIA A100-SXM4-40GB",
			PCIBusID: "00000000:3A:00.0", MIGMode: "enabled",
			MemoryUsedBytes: gpu.Known(4 * gib), TemperatureCelsius: gpu.Known(40), ProcessesListed: true,
			MIG: []gpu.MIGInstance{
				{UUID: "MIG-1", GPUInstance: 1, ComputeInstance: 0, Profile: "2g.10gb", MemoryTotalBytes: gpu.Known(10 * gib), MemoryUsedBytes: gpu.Known(3 * gib)},
				{UUID: "MIG-2", GPUInstance: 1, ComputeInstance: 1, Profile: "2g.10gb", MemoryTotalBytes: gpu.Known(10 * gib), MemoryUsedBytes: gpu.Known(3 * gib)},
				{UUID: "MIG-3", GPUInstance: 9, ComputeInstance: 0, Profile: "1g.5gb", MemoryTotalBytes: gpu.Known(5 * gib), MemoryUsedBytes: gpu.Known(0.0125 * gib)},
			},
			Processes: []gpu.Process{
				{PID: 300, Name: "python3", Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(1 * gib), MIG: true, GPUInstance: 1, ComputeInstance: 0},
				{PID: 300, Name: "python3", Type: gpu.ProcessCompute, UsedMemoryBytes: gpu.Known(2 * gib), MIG: true, GPUInstance: 1, ComputeInstance: 1},
			},
		},
		{
			Index: 3, UUID: "GPU-dddddddd-0000-0000-0000-000000000000", Vendor: gpu.VendorNVIDIA, Name: "NVIDIA H100 80GB HBM3",
			PCIBusID: "00000000:5D:00.0", MemoryUsedBytes: gpu.Known(0.5 * gib), ProcessesListed: true,
		},
	}}
	return snap, owners
}

// compatExposition is the exposition of the families whose names start with prefix.
func compatExposition(t *testing.T, reg prometheus.Gatherer, prefix string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), prefix) {
			if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	return buf.String()
}

// lint fails the test on promlint problems, except those that exempt says are inherent in a compatibility output.
func lint(t *testing.T, reg prometheus.Gatherer, exempt func(metric, text string) bool) {
	t.Helper()
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if exempt == nil || !exempt(p.Metric, p.Text) {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

func TestCompatNvidiasmiExposition(t *testing.T) {
	snap, owners := compatNode()
	reg := registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatNvidiasmi}})
	golden.Check(t, "testdata/compat_nvidiasmi.prom", compatExposition(t, reg, "nvidiasmi_"))
	lint(t, reg, nil)
}

// The quoted panel query sums by pod_name over one GPU, chosen by its UUID with the GPU- prefix as nvidia-smi
// writes it.
func TestCompatNvidiasmiPanelQuery(t *testing.T) {
	snap, owners := compatNode()
	reg := registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatNvidiasmi}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byPod := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "nvidiasmi_process_used_memory_bytes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["uuid"] == "GPU-"+"aaaaaaaa-0000-0000-0000-000000000000" {
				byPod[labels["pod_name"]] += m.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{"train-0": 4 * gib, "triton-0": 2 * gib, "": 1 * gib}
	if len(byPod) != len(want) {
		t.Fatalf("sum by (pod_name) = %v, want %v", byPod, want)
	}
	for pod, v := range want {
		if byPod[pod] != v {
			t.Errorf("pod_name=%q: %v bytes, want %v", pod, byPod[pod], v)
		}
	}
}

func TestCompatIsOffByDefault(t *testing.T) {
	snap, owners := compatNode()
	reg := registry(t, fixedSource{snap}, owners, Options{Processes: true})
	if got := compatExposition(t, reg, "nvidiasmi_") + compatExposition(t, reg, "DCGM_"); got != "" {
		t.Errorf("compatibility output without --compat:\n%s", got)
	}
}

func TestValidateCompat(t *testing.T) {
	if err := ValidateCompat([]string{"nvidiasmi", "dcgm"}); err != nil {
		t.Error(err)
	}
	if err := ValidateCompat([]string{"dcgm", "nvidia-smi"}); err == nil || !strings.Contains(err.Error(), `"nvidia-smi"`) {
		t.Errorf("ValidateCompat(nvidia-smi) = %v, want an error naming it", err)
	}
}
