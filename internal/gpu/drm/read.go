package drm

import (
	"path/filepath"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// deviceReader reads one device's attributes into a gpu.Device, and each failure but an absent value into its
// errors. testdata/SOURCES.md cites each file.
type deviceReader struct {
	f    *files
	d    *device
	out  *gpu.Device
	errs []gpu.DeviceError
}

func (r *deviceReader) fail(op gpu.Operation, err error) {
	r.errs = append(r.errs, gpu.DeviceError{Index: r.out.Index, UUID: r.out.UUID, Operation: op, Err: err})
}

// uint reads an unsigned attribute in the unit of the snapshot: times mul where mul > 0, else divided by -mul
// (a division by a power of ten is exact where the result is, a multiplication by its inverse not); absent when
// the kernel does not publish it.
func (r *deviceReader) uint(op gpu.Operation, path string, mul float64) gpu.Value {
	if path == "" {
		return gpu.Value{}
	}
	n, err := r.f.uint(path)
	if err != nil {
		if !absent(err) {
			r.fail(op, err)
		}
		return gpu.Value{}
	}
	if mul < 0 {
		return gpu.Known(float64(n) / -mul)
	}
	return gpu.Known(float64(n) * mul)
}

// Units of the attributes, as uint's mul.
const (
	percent = -100
	micro   = -1e6
	mega    = 1e6
)

// energy is a counter read at one reading, to compute power from between two.
type energy struct {
	joules float64
	at     time.Time
}

// readDevice reads a device's readings. last is the device's energy counter at the previous reading (the zero
// value before the first); it returns the counter at this one.
func readDevice(f *files, d *device, out *gpu.Device, last energy, now time.Time) ([]gpu.DeviceError, energy) {
	r := &deviceReader{f: f, d: d, out: out}
	r.memory()
	if d.driver == "amdgpu" {
		// amdgpu_pm.c: gpu_busy_percent and mem_busy_percent, percent of the time the GPU and its memory were busy
		// over the SMU's last sample.
		out.UtilizationRatio = r.uint(gpu.OpUtilization, d.path(d.dir, "gpu_busy_percent"), percent)
		out.MemoryUtilizationRatio = r.uint(gpu.OpUtilization, d.path(d.dir, "mem_busy_percent"), percent)
		out.PCIe.Replays = r.uint(gpu.OpPCIe, d.path(d.dir, "pcie_replay_count"), 1)
	}
	r.clocks()
	r.pcie()
	now0 := r.hwmon(last, now)
	return r.errs, now0
}

// memory reads the device memory: amdgpu's VRAM total and use (amdgpu_vram_mgr.c); xe's VRAM size per tile
// (xe_tile_sysfs.c, physical_vram_size_bytes). Neither Intel driver publishes the memory in use.
func (r *deviceReader) memory() {
	d, out := r.d, r.out
	switch d.driver {
	case "amdgpu":
		out.MemoryTotalBytes = r.uint(gpu.OpMemory, d.path(d.dir, "mem_info_vram_total"), 1)
		out.MemoryUsedBytes = r.uint(gpu.OpMemory, d.path(d.dir, "mem_info_vram_used"), 1)
		if out.MemoryTotalBytes.Valid && out.MemoryUsedBytes.Valid {
			out.MemoryFreeBytes = gpu.Known(max(out.MemoryTotalBytes.V-out.MemoryUsedBytes.V, 0))
		}
	case "xe":
		tiles, _, _ := dirNames(d.dir, 256)
		var total gpu.Value
		for _, t := range tiles {
			if _, ok := numbered(t, "tile"); !ok {
				continue
			}
			if v := r.uint(gpu.OpMemory, filepath.Join(d.dir, t, "physical_vram_size_bytes"), 1); v.Valid {
				total = gpu.Known(total.V + v.V)
			}
		}
		out.MemoryTotalBytes = total
	}
}

// clocks reads the graphics clock, and amdgpu's memory clock: amdgpu's hwmon freq1_input (sclk) and freq2_input
// (mclk) in Hz; xe's tile0/gt0/freq0/act_freq and i915's gt_act_freq_mhz, the actual frequency in MHz.
func (r *deviceReader) clocks() {
	d := r.d
	add := func(name string, v gpu.Value) {
		if v.Valid {
			r.out.Clocks = append(r.out.Clocks, gpu.Clock{Name: name, Hertz: v.V})
		}
	}
	switch d.driver {
	case "amdgpu":
		if d.hwmon != "" {
			add("graphics", r.uint(gpu.OpClocks, d.path(d.hwmon, "freq1_input"), 1))
			add("memory", r.uint(gpu.OpClocks, d.path(d.hwmon, "freq2_input"), 1))
		}
	case "xe":
		add("graphics", r.uint(gpu.OpClocks, d.path(d.dir, "tile0/gt0/freq0/act_freq"), mega))
	case "i915":
		add("graphics", r.uint(gpu.OpClocks, d.path(d.cardDir, "gt_act_freq_mhz"), mega))
	}
}

// pcieSpeeds maps the PCI core's link speeds (drivers/pci/pci-sysfs.c, current_link_speed and max_link_speed:
// "32.0 GT/s PCIe") to PCIe generations.
var pcieSpeeds = map[string]float64{"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6, "128.0": 7}

// pcie reads the link's generation and width now and at most, from the PCI core's attributes of the device.
func (r *deviceReader) pcie() {
	d, p := r.d, &r.out.PCIe
	p.Width = r.uint(gpu.OpPCIe, d.path(d.dir, "current_link_width"), 1)
	p.MaxWidth = r.uint(gpu.OpPCIe, d.path(d.dir, "max_link_width"), 1)
	p.Generation = r.speed(d.path(d.dir, "current_link_speed"))
	p.MaxGeneration = r.speed(d.path(d.dir, "max_link_speed"))
}

func (r *deviceReader) speed(path string) gpu.Value {
	s, err := r.f.text(path)
	if err != nil {
		if !absent(err) {
			r.fail(gpu.OpPCIe, err)
		}
		return gpu.Value{}
	}
	num, _, _ := strings.Cut(s, " ")
	if gen, ok := pcieSpeeds[num]; ok {
		return gpu.Known(gen)
	}
	return gpu.Value{} // "Unknown", or a speed newer than the table: not a generation to guess
}

// temperatureLabels say what each labelled hwmon temperature is: amdgpu's edge, junction (hotspot) and mem
// (amdgpu_pm.c; MI300's gc 9.4.3 has no edge sensor, so its junction is its core temperature), xe's pkg and vram
// (xe_hwmon.c).
var temperatureLabels = map[string]struct {
	memory bool
	rank   int // of the core temperatures, the lowest rank present is the GPU's
}{
	"edge": {rank: 0}, "junction": {rank: 1}, "pkg": {rank: 2}, "mem": {memory: true}, "vram": {memory: true},
}

// The hwmon temperature channels read, 1 to 8, and their labels.
var (
	tempInputs = [8]string{"temp1_input", "temp2_input", "temp3_input", "temp4_input", "temp5_input", "temp6_input",
		"temp7_input", "temp8_input"}
	tempLabels = [8]string{"temp1_label", "temp2_label", "temp3_label", "temp4_label", "temp5_label", "temp6_label",
		"temp7_label", "temp8_label"}
)

// hwmon reads the device's hardware monitor (Documentation/hwmon/sysfs-interface.rst units: millidegrees,
// microwatts, microjoules): temperatures, power, power limit, energy and fan.
func (r *deviceReader) hwmon(last energy, now time.Time) energy {
	d, out := r.d, r.out
	if d.hwmon == "" {
		return energy{}
	}
	core := 99
	for ch := range tempInputs {
		input := d.path(d.hwmon, tempInputs[ch])
		label, err := r.f.read(d.path(d.hwmon, tempLabels[ch]))
		if err != nil {
			label = nil
			if ch != 0 {
				continue // an unlabelled temperature other than the first is not one this reader knows
			}
		}
		label = trimSpace(label)
		kind, known := temperatureLabels[string(label)]
		if len(label) > 0 && !known {
			continue
		}
		switch {
		case kind.memory:
			out.MemoryTemperatureCelsius = r.temperature(gpu.OpMemoryTemperature, input)
		case kind.rank < core:
			if v := r.temperature(gpu.OpTemperature, input); v.Valid {
				out.TemperatureCelsius, core = v, kind.rank
			}
		}
	}
	// Power drawn: amdgpu's power1_average, else power1_input (not every product has both). Intel's drivers publish
	// no power reading, but an energy counter: the power between two readings is the counter's rate.
	out.PowerUsageWatts = r.uint(gpu.OpPowerUsage, d.path(d.hwmon, "power1_average"), micro)
	if !out.PowerUsageWatts.Valid {
		out.PowerUsageWatts = r.uint(gpu.OpPowerUsage, d.path(d.hwmon, "power1_input"), micro)
	}
	// The power limit: amdgpu's power1_cap, the one limit it has, set by the administrator or its default; Intel's
	// power1_max, the card's sustained limit (PL1), where 0 means no limit.
	if d.driver == "amdgpu" {
		out.PowerLimitWatts = r.uint(gpu.OpPowerLimit, d.path(d.hwmon, "power1_cap"), micro)
		out.PowerManagementLimitWatts = out.PowerLimitWatts
	} else {
		// The card's limit, else the package's (Ponte Vecchio has only the package's, power2_max).
		for _, name := range []string{"power1_max", "power2_max"} {
			if v := r.uint(gpu.OpPowerLimit, d.path(d.hwmon, name), micro); v.Valid && v.V > 0 {
				out.PowerLimitWatts = v
				break
			}
		}
	}
	// Energy: the card's counter (label "card", energy1 on xe and i915), else the package's (energy2).
	var e energy
	for _, name := range []string{"energy1_input", "energy2_input"} {
		if v := r.uint(gpu.OpEnergy, d.path(d.hwmon, name), micro); v.Valid {
			out.EnergyJoules, e = v, energy{joules: v.V, at: now}
			break
		}
	}
	if !out.PowerUsageWatts.Valid && out.EnergyJoules.Valid && !last.at.IsZero() && now.After(last.at) && e.joules >= last.joules {
		out.PowerUsageWatts = gpu.Known((e.joules - last.joules) / now.Sub(last.at).Seconds())
	}
	// amdgpu's pwm1, the fan's duty cycle 0-255; Instinct boards have no fan of their own.
	if v := r.uint(gpu.OpFanSpeed, d.path(d.hwmon, "pwm1"), -255); v.Valid {
		out.FanSpeedRatio = gpu.Known(min(v.V, 1))
	}
	return e
}

func (r *deviceReader) temperature(op gpu.Operation, path string) gpu.Value {
	n, err := r.f.int(path)
	if err != nil {
		if !absent(err) {
			r.fail(op, err)
		}
		return gpu.Value{}
	}
	return gpu.Known(float64(n) / 1000)
}
