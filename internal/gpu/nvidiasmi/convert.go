package nvidiasmi

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

func convertGPU(index int, x xmlGPU) (*gpu.Device, []gpu.DeviceError) {
	uuid := text(x.UUID)
	if uuid == "" {
		// Every series is labelled with the UUID; a device without one cannot be exported.
		return nil, []gpu.DeviceError{{Index: index, Operation: gpu.OpDevice, Err: fmt.Errorf("GPU %s has no UUID (%q)",
			cmp.Or(text(x.PCI.BusID), text(x.ID), "at position "+strconv.Itoa(index)), strings.TrimSpace(x.UUID))}}
	}
	d := &gpu.Device{
		Index:    index,
		UUID:     uuid,
		Name:     text(x.ProductName),
		PCIBusID: cmp.Or(text(x.PCI.BusID), text(x.ID)),
		Vendor:   gpu.VendorNVIDIA,
		MIGMode:  migMode(x.CurrentMIG),

		MinorNumber: minorNumber(x.MinorNumber),

		MemoryTotalBytes: bytesValue(x.FBMemory.Total),
		MemoryUsedBytes:  bytesValue(x.FBMemory.Used),
		MemoryFreeBytes:  bytesValue(x.FBMemory.Free),

		UtilizationRatio:        utilization(x.Utilization.GPU),
		MemoryUtilizationRatio:  utilization(x.Utilization.Memory),
		EncoderUtilizationRatio: utilization(x.Utilization.Encoder),
		DecoderUtilizationRatio: utilization(x.Utilization.Decoder),

		TemperatureCelsius: quantity(x.GPUTemp, celsius, true),
		PowerUsageWatts: firstValid(
			quantity(x.GPUPowerReadings.AveragePowerDraw, watts, false),
			quantity(x.GPUPowerReadings.InstantPowerDraw, watts, false),
			quantity(x.GPUPowerReadings.PowerDraw, watts, false),
			quantity(x.PowerReadings.AveragePowerDraw, watts, false),
			quantity(x.PowerReadings.InstantPowerDraw, watts, false),
			quantity(x.PowerReadings.PowerDraw, watts, false),
		),
		PowerLimitWatts: firstValid(
			quantity(x.GPUPowerReadings.CurrentPowerLimit, watts, false),
			quantity(x.GPUPowerReadings.EnforcedPowerLimit, watts, false),
			quantity(x.PowerReadings.CurrentPowerLimit, watts, false),
			quantity(x.PowerReadings.EnforcedPowerLimit, watts, false),
		),
		EnergyJoules: firstValid(
			quantity(x.GPUPowerReadings.TotalEnergy, joules, false),
			quantity(x.PowerReadings.TotalEnergy, joules, false),
			quantity(x.TotalEnergy, joules, false),
		),
		FanSpeedRatio:    quantity(x.FanSpeed, percent, false),
		PerformanceState: pstate(x.PerformanceState),
		// nvidia-smi -q shows no performance monitor readings.
		PerformanceMonitor: gpu.Known(0),
	}
	readHealth(d, x)

	for _, c := range []struct{ name, v string }{
		{"graphics", x.Clocks.Graphics}, {"sm", x.Clocks.SM}, {"memory", x.Clocks.Memory}, {"video", x.Clocks.Video},
	} {
		if v := quantity(c.v, hertz, false); v.Valid {
			d.Clocks = append(d.Clocks, gpu.Clock{Name: c.name, Hertz: v.V})
		}
	}

	e := x.ECCAggregate
	if v := firstValid(count(e.SingleBitTotal), sum(count(e.SRAMCorrectable), count(e.DRAMCorrectable))); v.Valid {
		d.ECCErrors = append(d.ECCErrors, gpu.ECCCount{Type: "corrected", Count: v.V})
	}
	if v := firstValid(count(e.DoubleBitTotal), sum(count(e.SRAMUncorrectable), count(e.SRAMUncorrectableParity),
		count(e.SRAMUncorrectableSECDED), count(e.DRAMUncorrectable))); v.Valid {
		d.ECCErrors = append(d.ECCErrors, gpu.ECCCount{Type: "uncorrected", Count: v.V})
	}

	var errs []gpu.DeviceError
	for _, m := range x.MIGDevices {
		gi, gok := instanceID(m.GPUInstanceID)
		ci, cok := instanceID(m.ComputeInstanceID)
		if !gok || !cok {
			errs = append(errs, gpu.DeviceError{Index: index, UUID: uuid, Operation: gpu.OpMIG,
				Err: fmt.Errorf("MIG device with unreadable instance ids (gpu_instance_id %q, compute_instance_id %q)",
					strings.TrimSpace(m.GPUInstanceID), strings.TrimSpace(m.ComputeInstanceID))})
			continue
		}
		mem := m.FBMemory
		if mem == (xmlMemory{}) {
			mem = m.SharedFBMemory
		}
		d.MIG = append(d.MIG, gpu.MIGInstance{
			UUID:             text(m.UUID),
			GPUInstance:      gi,
			ComputeInstance:  ci,
			MemoryTotalBytes: bytesValue(mem.Total),
			MemoryUsedBytes:  bytesValue(mem.Used),
		})
	}

	// <processes> present means nvidia-smi could list them, even when the list is empty; absent, or holding only a
	// marker such as N/A, means we do not know.
	if p := x.Processes; p != nil && (len(p.Processes) > 0 || strings.TrimSpace(p.Text) == "" ||
		strings.EqualFold(strings.TrimSpace(p.Text), "None")) {
		d.ProcessesListed = true
		for _, xp := range p.Processes {
			proc, err := convertProcess(xp)
			if err != nil {
				errs = append(errs, gpu.DeviceError{Index: index, UUID: uuid, Operation: gpu.OpProcesses, Err: err})
				continue
			}
			d.Processes = addProcess(d.Processes, proc)
		}
	}
	return d, errs
}

// addProcess adds a process, merging it with an entry for the same PID on the same GPU or MIG instance: nvidia-smi
// lists a process once per kind of context it has (a C and a G entry), as NVML's separate compute and graphics
// lists do. Like the NVML source, the merged entry takes the combined type and the larger memory reading.
func addProcess(procs []gpu.Process, p gpu.Process) []gpu.Process {
	for i := range procs {
		q := &procs[i]
		if q.PID != p.PID || q.MIG != p.MIG || q.GPUInstance != p.GPUInstance || q.ComputeInstance != p.ComputeInstance {
			continue
		}
		q.Type = mergeTypes(q.Type, p.Type)
		if p.UsedMemoryBytes.Valid && (!q.UsedMemoryBytes.Valid || p.UsedMemoryBytes.V > q.UsedMemoryBytes.V) {
			q.UsedMemoryBytes = p.UsedMemoryBytes
		}
		if q.Name == "" {
			q.Name = p.Name
		}
		return procs
	}
	return append(procs, p)
}

func mergeTypes(a, b string) string {
	switch {
	case a == b || b == "":
		return a
	case a == "":
		return b
	case a == gpu.ProcessMPS || b == gpu.ProcessMPS:
		return gpu.ProcessMPS
	}
	return gpu.ProcessComputeAndGraphics
}

func convertProcess(x xmlProcess) (gpu.Process, error) {
	pid, err := strconv.ParseUint(strings.TrimSpace(x.PID), 10, 32)
	if err != nil || pid == 0 {
		return gpu.Process{}, fmt.Errorf("process with unreadable pid %q", strings.TrimSpace(x.PID))
	}
	p := gpu.Process{
		PID:             uint32(pid),
		Name:            strings.TrimSpace(x.Name),
		Type:            processType(x.Type),
		UsedMemoryBytes: bytesValue(x.UsedMemory),
	}
	// Outside MIG both ids are N/A. A process on a MIG device has both; one without the other is not a placement we
	// can name, so it is reported as a whole-GPU process.
	gi, gok := instanceID(x.GPUInstanceID)
	ci, cok := instanceID(x.ComputeInstanceID)
	if gok && cok {
		p.MIG, p.GPUInstance, p.ComputeInstance = true, gi, ci
	}
	return p, nil
}

// processType maps nvidia-smi's process type letters to the names of docs/reference.md. nvidia-smi documents C (compute), G
// (graphics), M (MPS compute) and the combinations C+G and M+C.
func processType(s string) string {
	var c, g, m bool
	for _, part := range strings.Split(strings.ToUpper(strings.TrimSpace(s)), "+") {
		switch strings.TrimSpace(part) {
		case "C":
			c = true
		case "G":
			g = true
		case "M":
			m = true
		default:
			return ""
		}
	}
	switch {
	case m:
		return gpu.ProcessMPS
	case c && g:
		return gpu.ProcessComputeAndGraphics
	case c:
		return gpu.ProcessCompute
	case g:
		return gpu.ProcessGraphics
	}
	return ""
}

func migMode(s string) gpu.MIGMode {
	switch m := gpu.MIGMode(strings.ToLower(text(s))); m {
	case gpu.MIGEnabled, gpu.MIGDisabled:
		return m
	}
	return gpu.MIGUnsupported
}
