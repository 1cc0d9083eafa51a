package drm

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
)

// An i915 discrete GPU (an Arc A770, DG2): the graphics clock from the card's gt_act_freq_mhz, power as the hwmon
// energy counter's rate and the limit from power1_max (Documentation/ABI/testing/sysfs-driver-intel-i915-hwmon,
// which has no temperature), memory per process from the local0 region, and engine use as busy nanoseconds over
// the wall time between readings over the class's capacity. Every value is made up within the files' units.
func TestI915Node(t *testing.T) {
	const (
		pci      = "0000:03:00.0"
		pid      = 6001
		energyJ  = 52_000
		powerW   = 110
		limitW   = 190
		freqMHz  = 2400
		interval = 4.0
	)
	client := func(renderNS, videoNS uint64) string {
		return drmfake.I915Client{PDev: pci, ID: 77, Local: 2 << 30,
			EnginesNS: map[string]uint64{"render": renderNS, "video": videoNS},
			Capacity:  map[string]int{"video": 2, "video-enhance": 2}}.FDInfo()
	}
	node := &drmfake.Node{KernelRelease: "6.8.0-51-generic", GPUs: []drmfake.GPU{{
		Card: 1, Render: 128, PCI: pci, Driver: "i915",
		Attrs:     map[string]string{"vendor": "0x8086", "device": "0x56a0"},
		CardAttrs: map[string]string{"gt_act_freq_mhz": strconv.Itoa(freqMHz)},
		Hwmon: map[string]string{"name": "i915", "energy1_input": strconv.Itoa(energyJ * 1e6),
			"power1_max": strconv.Itoa(limitW * 1e6), "power1_rated_max": "225000000"},
	}}, Processes: []drmfake.Process{{PID: pid, Other: 3,
		DRM: []drmfake.File{{Minor: 128, FDInfo: client(5_000_000_000, 1_000_000_000)}}}}}
	_, sysfs, procfs := writeNode(t, node)
	c := newClock()
	s := openSource(t, sysfs, procfs, c)
	first := snapshot(t, s)
	if len(first.Errors) != 0 {
		t.Errorf("errors: %v", first.Errors)
	}
	d := first.Devices[0]
	if d.Vendor != gpu.VendorIntel || d.Name != "Intel GPU 8086:56a0" || d.UUID != "PCI-"+pci || d.DRMCard != "card1" ||
		d.DriverVersion != "6.8.0-51-generic" {
		t.Errorf("identity: %+v", d)
	}
	absentValue(t, "memory total (i915 publishes none in mainline sysfs)", d.MemoryTotalBytes)
	absentValue(t, "memory used", d.MemoryUsedBytes)
	absentValue(t, "temperature (i915's hwmon has none)", d.TemperatureCelsius)
	value(t, "energy", d.EnergyJoules, energyJ)
	absentValue(t, "first reading's power", d.PowerUsageWatts)
	value(t, "power limit", d.PowerLimitWatts, limitW)
	if len(d.Clocks) != 1 || d.Clocks[0] != (gpu.Clock{Name: "graphics", Hertz: freqMHz * 1e6}) {
		t.Errorf("clocks %+v", d.Clocks)
	}
	p := process(t, d, pid)
	value(t, "process memory (local0)", p.UsedMemoryBytes, 2<<30)
	absentValue(t, "first reading's SM use", p.SMUtilizationRatio)

	// Four seconds later: 2 s more on render, 1 s more on the two video engines, 440 J more.
	if err := os.WriteFile(filepath.Join(procfs, strconv.Itoa(pid), "fdinfo", "3"),
		[]byte(client(7_000_000_000, 2_000_000_000)), 0o644); err != nil {
		t.Fatal(err)
	}
	hwmon, err := filepath.Glob(filepath.Join(sysfs, "class", "drm", "card1", "device", "hwmon", "hwmon*"))
	if err != nil || len(hwmon) != 1 {
		t.Fatalf("hwmon: %v, %v", hwmon, err)
	}
	if err := os.WriteFile(filepath.Join(hwmon[0], "energy1_input"),
		[]byte(strconv.Itoa((energyJ+powerW*interval)*1e6)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(interval * time.Second)
	d = snapshot(t, s).Devices[0]
	value(t, "power from the energy counter", d.PowerUsageWatts, powerW)
	p = process(t, d, pid)
	value(t, "SM use (render)", p.SMUtilizationRatio, 0.5)
	value(t, "decoder use (video, capacity 2)", p.DecoderUtilizationRatio, 0.125)
	value(t, "encoder use (the same engine)", p.EncoderUtilizationRatio, 0.125)
	if p.Type != gpu.ProcessGraphics {
		t.Errorf("type %q, want graphics", p.Type)
	}
}
