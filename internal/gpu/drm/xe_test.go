package drm

import (
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
)

// The xe node: device readings from sysfs and hwmon, power as the energy counter's rate between two readings,
// engine use as busy cycles over total cycles (the GPU's own clock) over the class's capacity, and a client that
// two processes hold counted for the first.
func TestXeNode(t *testing.T) {
	xe := drmfake.NewXe()
	const interval = 5.0
	_, sysfs, procfs := writeNode(t, xe.Node(false, interval))
	c := newClock()
	s := openSource(t, sysfs, procfs, c)
	first, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Errors) != 0 {
		t.Errorf("errors: %v", first.Errors)
	}
	if first.DriverVersion != drmfake.XeKernel {
		t.Errorf("driver version %q, want the kernel's %q (xe is in the kernel)", first.DriverVersion, drmfake.XeKernel)
	}
	for i, g := range xe.GPUs {
		d := first.Devices[i]
		if d.UUID != g.UUID || d.Vendor != gpu.VendorIntel || d.Name != "Intel GPU 8086:e20b" || d.DRMCard != "card"+itoa(g.Card) {
			t.Errorf("GPU %d identity: %+v", i, d)
		}
		value(t, "memory total", d.MemoryTotalBytes, drmfake.XeVRAMTotal)
		absentValue(t, "memory used (xe publishes none)", d.MemoryUsedBytes)
		absentValue(t, "utilization (xe publishes none)", d.UtilizationRatio)
		value(t, "temperature", d.TemperatureCelsius, g.PkgC)
		value(t, "memory temperature", d.MemoryTemperatureCelsius, g.VRAMC)
		value(t, "energy", d.EnergyJoules, float64(g.EnergyJ))
		absentValue(t, "first reading's power", d.PowerUsageWatts)
		value(t, "power limit", d.PowerLimitWatts, g.PowerLimitW)
		value(t, "PCIe generation", d.PCIe.Generation, 4)
		value(t, "PCIe width", d.PCIe.Width, 8)
		if len(d.Clocks) != 1 || d.Clocks[0] != (gpu.Clock{Name: "graphics", Hertz: float64(g.FreqMHz) * 1e6}) {
			t.Errorf("GPU %d clocks %+v", i, d.Clocks)
		}
	}
	second := xe.Node(true, interval)
	if err := second.RewriteFDInfo(procfs); err != nil {
		t.Fatal(err)
	}
	if err := second.RewriteHwmon(sysfs); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(interval * time.Second)
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range xe.GPUs {
		value(t, "power from the energy counter", snap.Devices[i].PowerUsageWatts, g.PowerW)
	}
	for _, p := range xe.Processes {
		got := process(t, snap.Devices[p.GPU], p.PID)
		value(t, "memory", got.UsedMemoryBytes, float64(p.VRAM))
		value(t, "SM use of "+itoa(int(p.PID)), got.SMUtilizationRatio, float64(p.CCSStep)/drmfake.XeTotalStep)
		video := float64(p.VCSStep) / drmfake.XeTotalStep / drmfake.XeVCSCap
		value(t, "encoder use", got.EncoderUtilizationRatio, video)
		value(t, "decoder use", got.DecoderUtilizationRatio, video)
		want := gpu.ProcessGraphics
		if p.CCSStep > 0 {
			want = gpu.ProcessCompute
		}
		if got.Type != want {
			t.Errorf("PID %d type %q, want %q", p.PID, got.Type, want)
		}
	}
	if n := len(snap.Devices[1].Processes); n != 3 {
		t.Errorf("GPU 1 has %d processes, want 3: %+v", n, snap.Devices[1].Processes)
	}
}
