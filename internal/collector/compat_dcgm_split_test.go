package collector

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// openCostUsage is OpenCost's GPU usage query (pkg/costmodel/allocation.go, queryFmtGPUsUsageAvg) over one
// scrape: avg(DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""}) by (container, pod, namespace), keyed by pod.
func openCostUsage(got map[string]map[dcgmKey]float64) map[string]float64 {
	sum, n := map[string]float64{}, map[string]int{}
	for k, v := range got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] {
		if k.pod != "" {
			sum[k.pod] += v
			n[k.pod]++
		}
	}
	for pod := range sum {
		sum[pod] /= float64(n[pod])
	}
	return sum
}

// On a shared GPU with a performance monitor (Hopper), the engine and SM activity are split by the pods' shares of
// the GPU's busy time, as GPU_UTIL is: each pod's part is the GPU's value times its SM utilization over the GPU's
// utilization (the processes' samples, 75 %, are below the GPU's 80 %), the series without a pod keeps the rest
// (ollama's part and what no process accounts for), and they add up to the GPU's value. What does not measure time
// (occupancy, the pipes, DRAM) stays once on the GPU's series.
func TestCompatDCGMProfilingSplitBySMShare(t *testing.T) {
	snap, owners := compatNode()
	snap.Devices[0].Profiling = &gpu.Profiling{GraphicsEngineActive: gpu.Known(0.6), SMActive: gpu.Known(0.4),
		SMOccupancy: gpu.Known(0.2), TensorActive: gpu.Known(0.1)}
	got := dcgmValues(t, registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}}))
	for name, whole := range map[string]float64{"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.6, "DCGM_FI_PROF_SM_ACTIVE": 0.4} {
		want := map[string]float64{"train-0": whole * 0.5 / 0.8, "triton-0": whole * 0.2 / 0.8, "": whole * 0.1 / 0.8}
		sum := 0.0
		for k, v := range got[name] {
			if k.gpu != "0" {
				continue
			}
			sum += v
			if w, ok := want[k.pod]; !ok || abs(v-w) > 1e-12 {
				t.Errorf("%s on GPU 0, pod %q = %v, want %v", name, k.pod, v, w)
			}
		}
		if len(got[name]) != 3 || abs(sum-whole) > 1e-12 {
			t.Errorf("%s: %d series adding up to %v, want 3 adding up to the GPU's %v", name, len(got[name]), sum, whole)
		}
	}
	for _, name := range []string{"DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} {
		if len(got[name]) != 1 {
			t.Errorf("%s has %v, want one series, the GPU's", name, got[name])
		}
	}
	usage := openCostUsage(got)
	if len(usage) != 2 || abs(usage["train-0"]-0.375) > 1e-12 || abs(usage["triton-0"]-0.15) > 1e-12 {
		t.Errorf("OpenCost's usage by pod = %v, want train-0 0.375 and triton-0 0.15", usage)
	}
}

// Without a performance monitor (before Hopper) DCGM_FI_PROF_GR_ENGINE_ACTIVE is absent unless the estimate is
// asked for; with it, the GPU's utilization stands in, split the same way, and the help says it is an estimate. A
// GPU with a monitor keeps the monitor's value; a GPU instance, which has no utilization of its own, has none.
func TestCompatDCGMGREngineEstimate(t *testing.T) {
	snap, owners := compatNode()
	snap.Devices[0].PerformanceMonitor = gpu.Known(0)
	snap.Devices[3].PerformanceMonitor = gpu.Known(1)
	snap.Devices[3].Profiling = &gpu.Profiling{GraphicsEngineActive: gpu.Known(0.25)} // idle but for the monitor
	const name = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
	got := dcgmValues(t, registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}}))
	if len(got[name]) != 1 || got[name][dcgmKey{"3", "", ""}] != 0.25 {
		t.Errorf("without the estimate, %s = %v; want GPU 3's monitor reading alone", name, got[name])
	}

	reg := registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}, CompatDCGM: DCGMOptions{EstimateGREngineActive: true}})
	got = dcgmValues(t, reg)
	want := map[dcgmKey]float64{
		{"0", "", "train-0"}: 0.5, {"0", "", "triton-0"}: 0.2, {"0", "", ""}: 0.1, // GPU 0's utilization, 0.8, split
		{"3", "", ""}: 0.25, // the monitor's reading, not the (absent) utilization
	}
	if len(got[name]) != len(want) {
		t.Errorf("with the estimate, %s = %v, want %v (nothing for GPU 1, whose utilization is unknown, or MIG GPU 2)", name, got[name], want)
	}
	for k, w := range want {
		if v, ok := got[name][k]; !ok || abs(v-w) > 1e-12 {
			t.Errorf("with the estimate, %s%v = %v (present %v), want %v", name, k, v, ok, w)
		}
	}
	if usage := openCostUsage(got); abs(usage["train-0"]-0.5) > 1e-12 || abs(usage["triton-0"]-0.2) > 1e-12 {
		t.Errorf("OpenCost's usage by pod = %v, want train-0 0.5 and triton-0 0.2", usage)
	}
	if help := helpOf(t, reg, name); !strings.Contains(help, "estimate") {
		t.Errorf("%s's help %q does not say that it is an estimate", name, help)
	}
}

// A GPU with a performance monitor has no profiling on its first reading (no earlier sample to measure from) nor
// on one where the monitor failed: its DCGM_FI_PROF_GR_ENGINE_ACTIVE is then absent, even with the estimate on, so
// that its series never switches between the monitor's value and the estimate. So is a GPU whose source could not
// tell whether it has a monitor.
func TestCompatDCGMGREngineEstimateNotOnAGPUWithAMonitor(t *testing.T) {
	snap, owners := compatNode()
	snap.Devices[0].PerformanceMonitor = gpu.Known(1) // a Hopper GPU on its first reading: busy, no profiling yet
	snap.Devices[3].UtilizationRatio = gpu.Known(0.3) // the source could not say whether it has a monitor
	got := dcgmValues(t, registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM},
		CompatDCGM: DCGMOptions{EstimateGREngineActive: true}}))
	if v := got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]; len(v) != 0 {
		t.Errorf("DCGM_FI_PROF_GR_ENGINE_ACTIVE = %v, want none: neither GPU is known to lack a monitor", v)
	}
}

func helpOf(t *testing.T, reg prometheus.Gatherer, name string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetHelp()
		}
	}
	t.Fatalf("no %s", name)
	return ""
}

// A GPU instance used by one pod carries that pod's labels, and its engine activity (the monitor's, per GPU
// instance) is the pod's whole.
func TestCompatDCGMMIGInstanceKeepsItsPod(t *testing.T) {
	snap, owners := compatNode()
	snap.Devices[2].MIG[0].Profiling = &gpu.Profiling{GraphicsEngineActive: gpu.Known(0.9)}
	got := dcgmValues(t, registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}}))
	if v, ok := got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][dcgmKey{"2", "1", "mig-0"}]; !ok || v != 0.9 {
		t.Errorf("GPU instance 1's engine activity on pod mig-0 = %v (present %v), want 0.9; all of %v", v, ok, got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"])
	}
}
