package collector

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/golden"
)

func TestCompatDCGMExposition(t *testing.T) {
	snap, owners := compatNode()
	reg := registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}, CompatHostname: "gpu-node-1"})
	golden.Check(t, "testdata/compat_dcgm.prom", compatExposition(t, reg, "DCGM_"))
	lint(t, reg, dcgmLintExempt)
}

// dcgmLintExempt tells whether a promlint problem is inherent in writing dcgm-exporter's names: its label names
// modelName, UUID and Hostname are camelCase, and its energy counter has no _total. Nothing else is let through.
func dcgmLintExempt(metric, text string) bool {
	return strings.HasPrefix(metric, "DCGM_FI_") &&
		(strings.Contains(text, "snake_case") || strings.Contains(text, `"_total" suffix`))
}

// The series of a GPU add up to the GPU: a shared GPU's pods get their own share and the series without a pod the
// rest; a GPU with one pod gives it the GPU's values; an idle GPU has one series without pod labels.
func TestCompatDCGMSharesAddUpToTheGPU(t *testing.T) {
	snap, owners := compatNode()
	reg := registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ name, gpu, instance, pod string }
	got := map[key]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			got[key{mf.GetName(), l["gpu"], l["GPU_I_ID"], l["pod"]}] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	const used, util = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"
	for k, want := range map[key]float64{
		{used, "0", "", "train-0"}: 4096, {used, "0", "", "triton-0"}: 2048, {used, "0", "", ""}: 4096,
		{util, "0", "", "train-0"}: 50, {util, "0", "", "triton-0"}: 20, {util, "0", "", ""}: 10,
		// One pod: the GPU's own values, though one of its processes has unknown memory.
		{used, "1", "", "solo-0"}: 8192,
		// MIG: the GPU instance's memory, once for its two compute instances.
		{used, "2", "1", "mig-0"}: 3072, {"DCGM_FI_DEV_FB_FREE", "2", "1", "mig-0"}: 7168, {used, "2", "9", ""}: 12.8,
		{used, "3", "", ""}:                                   512,
		{"DCGM_FI_DEV_XID_ERRORS", "1", "", "solo-0"}:         79,
		{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0", "", ""}: 1000250,
		{"DCGM_FI_DEV_SM_CLOCK", "0", "", "triton-0"}:         1755, {"DCGM_FI_DEV_MEM_CLOCK", "0", "", "train-0"}: 2619,
	} {
		v, ok := got[k]
		if !ok || abs(v-want) > 1e-9 {
			t.Errorf("%v = %v (present %v), want %v", k, v, ok, want)
		}
	}
	for _, k := range []key{
		{util, "1", "", "solo-0"}, {"DCGM_FI_DEV_GPU_TEMP", "1", "", "solo-0"}, // unknown on the GPU
		{util, "2", "1", "mig-0"},                // no utilization of a GPU instance
		{used, "1", "", ""}, {used, "2", "", ""}, // no rest series when one pod has the GPU; no whole-GPU series in MIG mode
		{"DCGM_FI_DEV_XID_ERRORS", "0", "", ""}, // no XID seen: absent, not a made-up 0
	} {
		if _, ok := got[k]; ok {
			t.Errorf("%v is present, want it absent", k)
		}
	}
	if n, _ := testutil.GatherAndCount(reg, used); n != 7 {
		t.Errorf("%s has %d series, want 7: 3 on GPU 0, 1 on GPU 1, 2 MIG instances, 1 on GPU 3", used, n)
	}
}

// The rest of a shared GPU is unknown when a pod's share is.
func TestCompatDCGMRestUnknownWhenAShareIs(t *testing.T) {
	snap, owners := compatNode()
	snap.Devices[0].Processes[1].SMUtilizationRatio.Valid = false
	reg := registry(t, fixedSource{snap}, owners, Options{Compat: []string{CompatDCGM}})
	// train-0 only: triton-0 has no known SM utilization, and so the rest is unknown too.
	if n, _ := testutil.GatherAndCount(reg, "DCGM_FI_DEV_GPU_UTIL"); n != 1 {
		t.Errorf("DCGM_FI_DEV_GPU_UTIL has %d series, want 1", n)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
