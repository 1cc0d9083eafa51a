package collector

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// readings is a source that returns its snapshots one after the other, the last one again once they are used up.
type readings struct {
	mu    sync.Mutex
	snaps []*gpu.Snapshot
}

func (s *readings) Name() string { return "readings" }
func (s *readings) Close() error { return nil }
func (s *readings) Snapshot(context.Context) (*gpu.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := s.snaps[0]
	if len(s.snaps) > 1 {
		s.snaps = s.snaps[1:]
	}
	return snap, nil
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// nvlinkAt is a one-GPU reading at t0+seconds whose NVLink counters stand at tx and rx bytes.
func nvlinkAt(seconds float64, tx, rx gpu.Value) *gpu.Snapshot {
	return &gpu.Snapshot{Time: t0.Add(time.Duration(seconds * float64(time.Second))), Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-a", Vendor: gpu.VendorNVIDIA, NVLink: gpu.NVLink{TXBytes: tx, RXBytes: rx}},
	}}
}

// DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is DCGM's rate, not a counter: the NVLink data sent and received between two
// readings, in KiB per second / 1000. The first reading has none (absent, not DCGM's 0), nor does a reading after
// the counters went back (a driver reload); the native family stays the byte counter.
func TestCompatDCGMNVLinkBandwidthIsARate(t *testing.T) {
	const kib = 1024
	src := &readings{snaps: []*gpu.Snapshot{
		nvlinkAt(0, gpu.Known(1000*kib), gpu.Known(3000*kib)),
		nvlinkAt(10, gpu.Known(51000*kib), gpu.Known(83000*kib)), // +130000 KiB in 10 s
		nvlinkAt(20, gpu.Known(10*kib), gpu.Known(10*kib)),       // the driver reloaded
		nvlinkAt(25, gpu.Known(5010*kib), gpu.Known(10*kib)),     // +5000 KiB in 5 s
	}}
	reg := registry(t, src, fixedOwners{}, Options{Compat: []string{CompatDCGM}})
	for i, want := range []map[dcgmKey]float64{{}, {{gpu: "0"}: 13}, {}, {{gpu: "0"}: 1}} {
		got := dcgmValues(t, reg)
		if bw := got["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]; !maps.Equal(bw, want) && !(len(bw) == 0 && len(want) == 0) {
			t.Errorf("reading %d: NVLINK_BANDWIDTH_TOTAL = %v, want %v", i, bw, want)
		}
	}
	if got := gpuFamilies(t, reg); !strings.Contains(got, `gpu_nvlink_bytes_total{direction="transmit",gpu="0",uuid="GPU-a"} 5.13024e+06`) {
		t.Errorf("the native family is not the transmit counter in bytes:\n%s", got)
	}
}

// The performance monitor's fields appear under DCGM's names only where the GPU has a reading (Hopper and newer,
// from the second reading on): a GPU without one has none of them, never 0. In MIG mode each GPU instance has its
// own; a ratio on the GPU's own series is the GPU's (instances' ratios are not parts of it), a rate there is what
// no GPU instance has, so that the series of a GPU add up to its traffic.
func TestCompatDCGMProfiling(t *testing.T) {
	prof := func(ratio, pcieTX float64) *gpu.Profiling {
		return &gpu.Profiling{GraphicsEngineActive: gpu.Known(ratio), TensorActive: gpu.Known(ratio / 2), DRAMActive: gpu.Known(ratio / 4),
			PCIeTXBytesPerSecond: gpu.Known(pcieTX), PCIeRXBytesPerSecond: gpu.Known(2 * pcieTX)}
	}
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-h100", Vendor: gpu.VendorNVIDIA, Profiling: prof(0.8, 1e9), PerformanceMonitor: gpu.Known(1)},
		{Index: 1, UUID: "GPU-a100", Vendor: gpu.VendorNVIDIA, UtilizationRatio: gpu.Known(0.9), PerformanceMonitor: gpu.Known(0)},
		{Index: 2, UUID: "GPU-mig", Vendor: gpu.VendorNVIDIA, MIGMode: gpu.MIGEnabled, Profiling: prof(0.5, 6e8), MIG: []gpu.MIGInstance{
			{UUID: "MIG-1", GPUInstance: 1, ComputeInstance: 0, Profile: "3g.40gb", Profiling: prof(0.9, 4e8)},
			{UUID: "MIG-1b", GPUInstance: 1, ComputeInstance: 1, Profile: "3g.40gb"}, // the GPU instance's, once
			{UUID: "MIG-5", GPUInstance: 5, ComputeInstance: 0, Profile: "2g.20gb", Profiling: prof(0.1, 1e8)},
		}},
	}}
	got := dcgmValues(t, registry(t, fixedSource{snap}, fixedOwners{}, Options{Compat: []string{CompatDCGM}}))
	for name, want := range map[string]map[dcgmKey]float64{
		"DCGM_FI_PROF_GR_ENGINE_ACTIVE":   {{gpu: "0"}: 0.8, {gpu: "2"}: 0.5, {gpu: "2", instance: "1"}: 0.9, {gpu: "2", instance: "5"}: 0.1},
		"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": {{gpu: "0"}: 0.4, {gpu: "2"}: 0.25, {gpu: "2", instance: "1"}: 0.45, {gpu: "2", instance: "5"}: 0.05},
		"DCGM_FI_PROF_DRAM_ACTIVE":        {{gpu: "0"}: 0.2, {gpu: "2"}: 0.125, {gpu: "2", instance: "1"}: 0.225, {gpu: "2", instance: "5"}: 0.025},
		// Bytes per second; the GPU's series of GPU 2 keeps the 1e8 B/s no GPU instance has.
		"DCGM_FI_PROF_PCIE_TX_BYTES": {{gpu: "0"}: 1e9, {gpu: "2"}: 1e8, {gpu: "2", instance: "1"}: 4e8, {gpu: "2", instance: "5"}: 1e8},
		"DCGM_FI_PROF_PCIE_RX_BYTES": {{gpu: "0"}: 2e9, {gpu: "2"}: 2e8, {gpu: "2", instance: "1"}: 8e8, {gpu: "2", instance: "5"}: 2e8},
		// Fields the monitor did not give are absent everywhere.
		"DCGM_FI_PROF_SM_ACTIVE": nil, "DCGM_FI_PROF_NVLINK_TX_BYTES": nil,
	} {
		if !approxEqual(got[name], want) {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	if v := got["DCGM_FI_DEV_GPU_UTIL"][dcgmKey{gpu: "1"}]; v != 90 {
		t.Errorf("GPU 1's GPU_UTIL = %v, want 90: its device fields are there", v)
	}
}

// The health fields under DCGM's names and units: violation times in ns, the clock event reasons as NVML's bit mask,
// NVLink error totals over the links (absent when one link's count is unknown: a total without it would be too
// low), remapped rows and the vGPU licence as read (0 on bare metal).
func TestCompatDCGMHealth(t *testing.T) {
	link := func(n int, crc float64) gpu.NVLinkLink {
		return gpu.NVLinkLink{Link: n, Active: gpu.Known(1), CRCFlitErrors: gpu.Known(crc), CRCDataErrors: gpu.Known(1),
			ReplayErrors: gpu.Known(2), RecoveryErrors: gpu.Value{}}
	}
	snap := &gpu.Snapshot{Devices: []gpu.Device{{
		Index: 0, UUID: "GPU-a", Vendor: gpu.VendorNVIDIA, VGPULicensed: gpu.Known(0), MemoryTemperatureCelsius: gpu.Known(61),
		PowerLimitWatts: gpu.Known(600), PowerManagementLimitWatts: gpu.Known(615),
		PCIe:   gpu.PCIe{Replays: gpu.Known(41), Generation: gpu.Known(4), MaxGeneration: gpu.Known(5), Width: gpu.Known(8), MaxWidth: gpu.Known(16)},
		NVLink: gpu.NVLink{Links: []gpu.NVLinkLink{link(0, 3), link(1, 4)}},
		Health: gpu.Health{
			CorrectableRemappedRows: gpu.Known(2), UncorrectableRemappedRows: gpu.Known(1), RemapPending: gpu.Known(1), RemapFailure: gpu.Known(0),
			RecoveryAction: gpu.Known(1),
			ClockEvents:    []gpu.ClockEvent{{Reason: "gpu_idle"}, {Reason: "sw_power_cap", Active: true}, {Reason: "hw_thermal_slowdown", Active: true}},
			Violations:     []gpu.Violation{{Policy: "power", Seconds: 1.5}, {Policy: "thermal", Seconds: 0}},
		},
	}}}
	got := dcgmValues(t, registry(t, fixedSource{snap}, fixedOwners{}, Options{Compat: []string{CompatDCGM}}))
	for name, want := range map[string]float64{
		"DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0, "DCGM_FI_DEV_MEMORY_TEMP": 61, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 41,
		"DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 600, "DCGM_FI_DEV_POWER_MGMT_LIMIT": 615,
		"DCGM_FI_DEV_PCIE_LINK_GEN": 4, "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 5, "DCGM_FI_DEV_PCIE_LINK_WIDTH": 8, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16,
		"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 1,
		"DCGM_FI_DEV_ROW_REMAP_PENDING": 1, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0, "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": 1,
		"DCGM_FI_DEV_POWER_VIOLATION": 1.5e9, "DCGM_FI_DEV_THERMAL_VIOLATION": 0,
		"DCGM_FI_DEV_CLOCKS_EVENT_REASONS":              0x4 | 0x40,
		"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 7, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 2,
		"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 4,
	} {
		if v, ok := got[name][dcgmKey{gpu: "0"}]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
	for _, name := range []string{"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
		"DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"} {
		if v, ok := got[name]; ok {
			t.Errorf("%s = %v, want it absent: the snapshot does not have it", name, v)
		}
	}
}

func approxEqual(got, want map[dcgmKey]float64) bool {
	if len(got) != len(want) {
		return false
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || abs(g-w) > 1e-9*max(1, abs(w)) {
			return false
		}
	}
	return true
}
