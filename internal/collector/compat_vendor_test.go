package collector

import (
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
)

// dcgm-exporter and the nvidia-smi exporter serve NVIDIA's GPUs only, so their names carry nothing else: on the
// mixed demo node (two H100s, an MI300X, an Intel Flex 170) both outputs have the two H100s alone, each as DCGM
// numbers it (gpu and device nvidiaN by NVML's index, which the NVIDIA GPUs keep on a mixed node) with NVIDIA's
// driver version, and no AMD or Intel GPU's process.
func TestCompatOutputsServeNVIDIAGPUsOnly(t *testing.T) {
	src, err := simulated.Preset("mixed")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := src.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	nvidia := map[string]string{} // UUID → index
	for _, d := range snap.Devices {
		if d.Vendor == gpu.VendorNVIDIA {
			nvidia[d.UUID] = itoa(d.Index)
		}
	}
	if len(nvidia) != 2 || len(snap.Devices) != 4 {
		t.Fatalf("the mixed demo node has %d GPUs, %d of them NVIDIA's; the test expects 4 and 2", len(snap.Devices), len(nvidia))
	}
	reg := registry(t, src, attribution.New(attribution.Config{Preset: src}),
		Options{Compat: []string{CompatDCGM, CompatNvidiasmi}, CompatHostname: "mixed-node"})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	smiPIDs := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "DCGM_") && !strings.HasPrefix(name, "nvidiasmi_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			uuid := l["UUID"] + l["uuid"]
			index, ok := nvidia[uuid]
			if !ok {
				t.Errorf("%s has a series of GPU %s (%s), which is not NVIDIA's", name, uuid, l["modelName"]+l["name"])
				continue
			}
			seen[uuid] = true
			if strings.HasPrefix(name, "nvidiasmi_") {
				smiPIDs[l["process_pid"]] = true
				continue
			}
			if l["gpu"] != index || l["device"] != "nvidia"+index || l["DCGM_FI_DRIVER_VERSION"] != "580.95.05" {
				t.Errorf("%s of GPU %s: gpu=%q device=%q driver %q, want %s, nvidia%s and NVIDIA's 580.95.05", name, uuid,
					l["gpu"], l["device"], l["DCGM_FI_DRIVER_VERSION"], index, index)
			}
		}
	}
	if len(seen) != len(nvidia) {
		t.Errorf("series of %d NVIDIA GPUs, want both", len(seen))
	}
	if len(smiPIDs) != 1 || !smiPIDs["6101"] {
		t.Errorf("nvidiasmi_process_used_memory_bytes has the processes %v, want the H100's trainer (6101) alone", smiPIDs)
	}
}
