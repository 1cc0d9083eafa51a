package collector

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/golden"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

func TestCompatDCGMExposition(t *testing.T) {
	snap, owners := compatNode()
	reg := registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}, CompatHostname: "gpu-node-1"})
	golden.Check(t, "testdata/compat_dcgm.prom", compatExposition(t, reg, "DCGM_"))
	lint(t, reg, dcgmLintExempt)
}

// dcgmLintExempt tells whether a promlint problem is inherent in writing dcgm-exporter's names: its label names
// modelName, UUID and Hostname are camelCase, its counters have no _total, and one has its type in its name
// (DCGM_FI_DEV_PCIE_REPLAY_COUNTER). Nothing else is let through.
func dcgmLintExempt(metric, text string) bool {
	return strings.HasPrefix(metric, "DCGM_FI_") && (strings.Contains(text, "snake_case") ||
		strings.Contains(text, `"_total" suffix`) || strings.Contains(text, "should not include type"))
}

// dcgmValues gathers the --compat=dcgm series as name → (gpu, GPU_I_ID, pod) → value.
type dcgmKey struct{ gpu, instance, pod string }

func dcgmValues(t *testing.T, reg prometheus.Gatherer) map[string]map[dcgmKey]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[dcgmKey]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "DCGM_") {
			continue
		}
		got[mf.GetName()] = map[dcgmKey]float64{}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			got[mf.GetName()][dcgmKey{l["gpu"], l["GPU_I_ID"], l["pod"]}] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return got
}

// The series of a GPU tell the GPU's truth when added up, as dashboards do (sum, avg by GPU): a shared GPU's pods
// get their own share of what adds up (memory, utilization, power) and the series without a pod the rest; what does
// not add up (temperature, clocks, XID) and the counters (energy) appear once per GPU. A GPU with one pod gives it
// all; an idle GPU has one series without pod labels. In MIG mode the GPU's own series has the per-GPU fields and
// each GPU instance its memory.
func TestCompatDCGMSharesAddUpToTheGPU(t *testing.T) {
	snap, owners := compatNode()
	reg := registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}})
	got := dcgmValues(t, reg)
	const used, util, power = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"
	for k, want := range map[[2]string]float64{
		// GPU 0: train-0, triton-0 and a service outside Kubernetes (ollama, 1 GiB, 5 % SM).
		{used, "0//train-0"}: 4096, {used, "0//triton-0"}: 2048, {used, "0//"}: 4096, // the rest: ollama and the driver
		{util, "0//train-0"}: 50, {util, "0//triton-0"}: 20, {util, "0//"}: 10,
		{power, "0//train-0"}: 0.5 * 300.5, {power, "0//triton-0"}: 0.2 * 300.5, {power, "0//"}: 0.3 * 300.5,
		{"DCGM_FI_DEV_FB_FREE", "0//"}: 71680, {"DCGM_FI_DEV_GPU_TEMP", "0//"}: 50,
		{"DCGM_FI_DEV_MEM_COPY_UTIL", "0//"}: 30, {"DCGM_FI_DEV_DEC_UTIL", "0//"}: 5,
		{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0//"}: 1000250,
		{"DCGM_FI_DEV_SM_CLOCK", "0//"}:                 1755, {"DCGM_FI_DEV_MEM_CLOCK", "0//"}: 2619,
		// GPU 1: one pod has it all, though one of its processes has unknown memory.
		{used, "1//solo-0"}: 8192, {power, "1//solo-0"}: 200, {"DCGM_FI_DEV_XID_ERRORS", "1//solo-0"}: 79,
		// GPU 2, MIG: the GPU's series, and the GPU instance's memory once for its two compute instances.
		{"DCGM_FI_DEV_GPU_TEMP", "2//"}: 40, {used, "2//"}: 4096 - 3072 - 12.8, // the memory outside its GPU instances
		{used, "2/1/mig-0"}: 3072, {"DCGM_FI_DEV_FB_FREE", "2/1/mig-0"}: 7168, {used, "2/9/"}: 12.8,
		// GPU 3: idle.
		{used, "3//"}: 512,
	} {
		parts := strings.SplitN(k[1], "/", 3)
		v, ok := got[k[0]][dcgmKey{parts[0], parts[1], parts[2]}]
		if !ok || abs(v-want) > 1e-9 {
			t.Errorf("%s%v = %v (present %v), want %v", k[0], parts, v, ok, want)
		}
	}
	// Per GPU: fields that add up sum to the GPU's value (in MIG mode too); the others are written once.
	migUsed := 0.0
	for k, v := range got[used] {
		if k.gpu == "2" {
			migUsed += v
		}
	}
	if abs(migUsed-4096) > 1e-9 {
		t.Errorf("the FB_USED series of MIG GPU 2 add up to %v MiB, want its 4096", migUsed)
	}
	d0 := snap.Devices[0]
	for name, whole := range map[string]float64{used: d0.MemoryUsedBytes.V / mib, util: 100 * d0.UtilizationRatio.V,
		power: d0.PowerUsageWatts.V, "DCGM_FI_DEV_FB_FREE": d0.MemoryFreeBytes.V / mib,
		"DCGM_FI_DEV_MEM_COPY_UTIL": 100 * d0.MemoryUtilizationRatio.V, "DCGM_FI_DEV_ENC_UTIL": 0,
		"DCGM_FI_DEV_DEC_UTIL": 100 * d0.DecoderUtilizationRatio.V, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1000 * d0.EnergyJoules.V} {
		sum := 0.0
		for k, v := range got[name] {
			if k.gpu == "0" {
				sum += v
			}
		}
		if abs(sum-whole) > 1e-9 {
			t.Errorf("the series of shared GPU 0 add up to %s = %v, want the GPU's %v", name, sum, whole)
		}
	}
	for name := range got {
		n := map[string]int{}
		for k := range got[name] {
			n[k.gpu]++
		}
		switch name {
		case used, util, power, "DCGM_FI_DEV_FB_FREE":
			continue
		}
		for g, c := range n {
			if c != 1 {
				t.Errorf("%s has %d series on GPU %s, want 1", name, c, g)
			}
		}
	}
	for _, k := range []struct {
		name string
		key  dcgmKey
	}{
		{util, dcgmKey{"1", "", "solo-0"}}, {"DCGM_FI_DEV_GPU_TEMP", dcgmKey{"1", "", "solo-0"}}, // unknown on the GPU
		{util, dcgmKey{"2", "1", "mig-0"}},                                    // no utilization of a GPU instance
		{"DCGM_FI_DEV_GPU_TEMP", dcgmKey{"2", "1", "mig-0"}},                  // once per GPU, not per instance
		{used, dcgmKey{"1", "", ""}},                                          // no rest series when one pod has the GPU
		{"DCGM_FI_DEV_XID_ERRORS", dcgmKey{"0", "", ""}},                      // no XID seen: absent, not a made-up 0
		{"DCGM_FI_DEV_MEM_COPY_UTIL", dcgmKey{"0", "", "train-0"}},            // no per-process value: not split
		{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", dcgmKey{"0", "", "train-0"}}, // a counter is not split
		{"DCGM_FI_DEV_FB_FREE", dcgmKey{"0", "", "train-0"}},                  // free memory is the GPU's
		{"DCGM_FI_DEV_SM_CLOCK", dcgmKey{"0", "", "triton-0"}},                // once per GPU
	} {
		if _, ok := got[k.name][k.key]; ok {
			t.Errorf("%s%v is present, want it absent", k.name, k.key)
		}
	}
	if n, _ := testutil.GatherAndCount(reg, used); n != 8 {
		t.Errorf("%s has %d series, want 8: 3 on GPU 0, 1 on GPU 1, GPU 2 and its 2 GPU instances, 1 on GPU 3", used, n)
	}
}

// A field whose share is unknown for one pod is not split: the GPU's series keeps all of it, so that the sum is
// still the GPU's.
func TestCompatDCGMUnknownShareIsNotSplit(t *testing.T) {
	snap, owners := compatNode()
	snap.Devices[0].Processes[1].SMUtilizationRatio.Valid = false // triton-0
	got := dcgmValues(t, registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}}))
	for name, whole := range map[string]float64{"DCGM_FI_DEV_GPU_UTIL": 80, "DCGM_FI_DEV_POWER_USAGE": 300.5} {
		if v, ok := got[name][dcgmKey{"0", "", ""}]; !ok || v != whole {
			t.Errorf("%s on GPU 0's series without a pod = %v (present %v), want %v", name, v, ok, whole)
		}
		for k, v := range got[name] {
			if k.gpu == "0" && (k != dcgmKey{"0", "", ""} || v != whole) {
				t.Errorf("%s%v = %v, want only GPU 0's whole %v on its series without a pod", name, k, v, whole)
			}
		}
	}
	if v := got["DCGM_FI_DEV_FB_USED"][dcgmKey{"0", "", "triton-0"}]; v != 2048 {
		t.Errorf("triton-0's memory = %v, want its own 2048 MiB: memory is still split", v)
	}
}

// Samples that add up to more than the GPU's value (per-process and per-GPU samples differ, MPS) share what the GPU
// measured in proportion; the process outside Kubernetes keeps its part on the series without a pod.
func TestCompatDCGMSharesScaledToTheWhole(t *testing.T) {
	snap, owners := compatNode()
	snap.Devices[0].UtilizationRatio = gpu.Known(0.35) // below 50 % + 20 % + 5 % (ollama, outside Kubernetes)
	got := dcgmValues(t, registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}}))
	u := got["DCGM_FI_DEV_GPU_UTIL"]
	if a, b, rest := u[dcgmKey{"0", "", "train-0"}], u[dcgmKey{"0", "", "triton-0"}], u[dcgmKey{"0", "", ""}]; abs(a-35*0.5/0.75) > 1e-9 ||
		abs(b-35*0.2/0.75) > 1e-9 || abs(rest-35*0.05/0.75) > 1e-9 {
		t.Errorf("GPU_UTIL train-0 %v, triton-0 %v, rest %v; want 35 %% split 50:20:5", a, b, rest)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
