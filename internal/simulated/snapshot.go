package simulated

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// snapshot turns the configuration into the readings it describes. Energy grows with power draw since the file
// was loaded, so that rate() over the counter shows the configured power.
func (cfg *nodeConfig) snapshot(elapsedSeconds float64) *gpu.Snapshot {
	snap := &gpu.Snapshot{
		DriverVersion: cfg.DriverVersion,
		CUDAVersion:   cfg.CUDAVersion,
		Simulated:     true,
		Devices:       make([]gpu.Device, 0, len(cfg.GPUs)),
	}
	for i, g := range cfg.GPUs {
		d := gpu.Device{
			Index:                   i,
			UUID:                    g.UUID,
			Name:                    g.Name,
			Vendor:                  cmp.Or(string(g.Vendor), gpu.VendorNVIDIA),
			DriverVersion:           g.DriverVersion,
			DRMCard:                 g.DRMCard,
			PCIBusID:                g.PCIBusID,
			MinorNumber:             gpu.Known(float64(i)),
			MIGMode:                 gpu.MIGMode(g.MIGMode),
			MemoryTotalBytes:        gpu.Known(float64(*g.MemoryTotalBytes)),
			UtilizationRatio:        opt(g.UtilizationRatio),
			MemoryUtilizationRatio:  opt(g.MemoryUtilizationRatio),
			EncoderUtilizationRatio: opt(g.EncoderUtilizationRatio),
			DecoderUtilizationRatio: opt(g.DecoderUtilizationRatio),
			TemperatureCelsius:      opt(g.TemperatureCelsius),
			PowerUsageWatts:         opt(g.PowerUsageWatts),
			PowerLimitWatts:         opt(g.PowerLimitWatts),
			FanSpeedRatio:           opt(g.FanSpeedRatio),
			ProcessesListed:         true,
		}
		if g.MinorNumber != nil {
			d.MinorNumber = gpu.Known(float64(*g.MinorNumber))
		}
		if d.PCIBusID == "" {
			d.PCIBusID = fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10)
		}
		if g.PerformanceState != nil {
			d.PerformanceState = gpu.Known(float64(*g.PerformanceState))
		}
		if g.EnergyJoules != nil || g.PowerUsageWatts != nil {
			var base, watts float64
			if g.EnergyJoules != nil {
				base = float64(*g.EnergyJoules)
			}
			if g.PowerUsageWatts != nil {
				watts = float64(*g.PowerUsageWatts)
			}
			d.EnergyJoules = gpu.Known(base + watts*elapsedSeconds)
		}
		for _, name := range slices.Sorted(maps.Keys(g.ClocksHertz)) {
			d.Clocks = append(d.Clocks, gpu.Clock{Name: name, Hertz: float64(g.ClocksHertz[name])})
		}
		for _, typ := range slices.Sorted(maps.Keys(g.ECCErrors)) {
			d.ECCErrors = append(d.ECCErrors, gpu.ECCCount{Type: typ, Count: float64(g.ECCErrors[typ])})
		}
		for _, xid := range slices.Sorted(maps.Keys(g.XIDErrors)) {
			d.XIDErrors = append(d.XIDErrors, gpu.XIDCount{XID: xid, Count: g.XIDErrors[xid]})
		}
		for _, m := range g.MIGInstances {
			inst := gpu.MIGInstance{
				UUID:             m.UUID,
				GPUInstance:      m.GPUInstance,
				ComputeInstance:  m.ComputeInstance,
				Profile:          m.Profile,
				MemoryTotalBytes: opt(m.MemoryTotalBytes),
				MemoryUsedBytes:  opt(m.MemoryUsedBytes),
			}
			if p := m.Placement; p != nil {
				inst.Placement = &gpu.MIGPlacement{ProfileID: p.ProfileID, Start: p.Start, Size: p.Size}
			}
			inst.Profiling = m.Profiling.profiling()
			d.MIG = append(d.MIG, inst)
		}
		var processMemory float64
		for _, p := range g.Processes {
			proc := gpu.Process{
				PID:                     p.PID,
				Name:                    p.Name,
				Type:                    string(p.Type),
				UsedMemoryBytes:         opt(p.UsedMemoryBytes),
				SMUtilizationRatio:      opt(p.SMUtilizationRatio),
				MemoryUtilizationRatio:  opt(p.MemoryUtilizationRatio),
				EncoderUtilizationRatio: opt(p.EncoderUtilizationRatio),
				DecoderUtilizationRatio: opt(p.DecoderUtilizationRatio),
			}
			if p.GPUInstance != nil {
				proc.MIG, proc.GPUInstance, proc.ComputeInstance = true, *p.GPUInstance, *p.ComputeInstance
			}
			processMemory += proc.UsedMemoryBytes.V
			d.Processes = append(d.Processes, proc)
		}
		used := processMemory
		if g.MemoryUsedBytes != nil {
			used = float64(*g.MemoryUsedBytes)
		}
		d.MemoryUsedBytes = gpu.Known(used)
		d.MemoryFreeBytes = gpu.Known(max(d.MemoryTotalBytes.V-used, 0))
		g.gpuHealthConfig.apply(&d, elapsedSeconds)
		if d.Vendor == gpu.VendorNVIDIA {
			d.PerformanceMonitor = performanceMonitor(&d)
		}
		snap.Devices = append(snap.Devices, d)
	}
	return snap
}

// performanceMonitor is 1 for a simulated GPU whose file gives its performance monitor's readings (its own or a GPU
// instance's), else 0.
func performanceMonitor(d *gpu.Device) gpu.Value {
	if d.Profiling != nil || slices.ContainsFunc(d.MIG, func(m gpu.MIGInstance) bool { return m.Profiling != nil }) {
		return gpu.Known(1)
	}
	return gpu.Known(0)
}

// opt turns an optional file value into a reading: absent in the file, absent in the metrics.
func opt[T ~float64 | ~uint64](p *T) gpu.Value {
	if p == nil {
		return gpu.Value{}
	}
	return gpu.Known(float64(*p))
}
