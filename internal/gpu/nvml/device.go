//go:build linux && cgo

package nvml

import (
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// deviceReader reads one GPU and collects what failed. Once the GPU is lost every further read is skipped, because
// each would fail the same way and could take the driver's timeout to do so.
type deviceReader struct {
	s     *Source
	index int
	uuid  string
	errs  []gpu.DeviceError
	lost  error
}

// ok reports whether ret is SUCCESS. Unsupported values are quietly absent; GPU_IS_LOST marks the device lost; any
// other failure is recorded under op.
func (r *deviceReader) ok(op gpu.Operation, ret gonvml.Return) bool {
	switch {
	case ret == gonvml.SUCCESS:
		return true
	case r.lost != nil, unsupported(ret):
		return false
	case ret == gonvml.ERROR_GPU_IS_LOST:
		r.lost = fmt.Errorf("reading %s of GPU %d: %w", op, r.index, ret)
		return false
	default:
		r.errs = append(r.errs, r.s.fail(r.index, r.uuid, op, fmt.Errorf("reading %s of GPU %d: %w", op, r.index, ret)))
		return false
	}
}

// number is what NVML's scalar getters return.
type number interface {
	~uint32 | ~uint64 | ~int | ~int32
}

// readValue calls one NVML getter and scales its result into base units; a failed or skipped read is an invalid
// Value, never 0.
func readValue[T number](r *deviceReader, op gpu.Operation, scale float64, call func() (T, gonvml.Return)) gpu.Value {
	if r.lost != nil {
		return gpu.Value{}
	}
	v, ret := call()
	if !r.ok(op, ret) {
		return gpu.Value{}
	}
	return gpu.Known(float64(v) * scale)
}

// readDevice reads GPU i. It returns nil when the GPU cannot be read at all (no handle, no UUID, or lost), with the
// reason in the errors; otherwise the device, possibly with some fields absent, and the fields that failed.
func (s *Source) readDevice(i int, names map[uint32]string) (*gpu.Device, []gpu.DeviceError) {
	h, ret := s.lib.DeviceGetHandleByIndex(i)
	if ret != gonvml.SUCCESS {
		return nil, []gpu.DeviceError{s.fail(i, "", gpu.OpDevice, fmt.Errorf("getting handle of GPU %d: %w", i, ret))}
	}
	uuid, ret := h.GetUUID()
	if ret != gonvml.SUCCESS {
		// Without a UUID none of the device's series could be labelled. A lost GPU's UUID may still be known from
		// its XID registration, which keeps it in the snapshot with its XID counts.
		return nil, []gpu.DeviceError{s.fail(i, s.xid.uuidOf(i), gpu.OpDevice, fmt.Errorf("reading UUID of GPU %d: %w", i, ret))}
	}
	r := &deviceReader{s: s, index: i, uuid: uuid}
	d := &gpu.Device{Index: i, UUID: uuid, Vendor: gpu.VendorNVIDIA}

	r.readIdentity(h, d)
	mem := r.readMemory(h, gpu.OpMemory)
	d.MemoryTotalBytes, d.MemoryUsedBytes, d.MemoryFreeBytes, d.MemoryReservedBytes = mem.total, mem.used, mem.free, mem.reserved
	r.readUtilization(h, d)
	r.readPowerAndThermal(h, d)
	d.Clocks = r.readClocks(h)
	d.ECCErrors = r.readECC(h)
	r.readHealth(h, d)

	migEnabled := d.MIGMode == gpu.MIGEnabled
	var migs []migDevice
	migComplete := false
	if migEnabled {
		d.MIG, migs, migComplete = r.readMIG(h)
	}
	r.readProfiling(h, d)
	d.Processes, d.ProcessesListed = r.readProcesses(h, migEnabled, migs, migComplete, names)

	if r.lost != nil {
		return nil, []gpu.DeviceError{s.fail(i, uuid, gpu.OpDevice, r.lost)}
	}
	return d, r.errs
}

func (r *deviceReader) readIdentity(h gonvml.Device, d *gpu.Device) {
	if name, ret := h.GetName(); r.ok(gpu.OpName, ret) {
		d.Name = name
	}
	if pci, ret := h.GetPciInfo(); r.ok(gpu.OpPCI, ret) {
		d.PCIBusID = cString(pci.BusId[:])
	}
	if r.lost != nil {
		return
	}
	d.MinorNumber = readValue(r, gpu.OpMinorNumber, 1, h.GetMinorNumber) // older than MIG: every driver has it
	if !r.s.syms.mig {
		return
	}
	// NOT_SUPPORTED (GPUs before Ampere) leaves MIGMode empty, which docs/reference.md reads as "no MIG".
	if current, _, ret := h.GetMigMode(); r.ok(gpu.OpMIGMode, ret) {
		d.MIGMode = gpu.MIGDisabled
		if current == gonvml.DEVICE_MIG_ENABLE {
			d.MIGMode = gpu.MIGEnabled
		}
	}
}

// memoryInfo is one reading of a GPU's or MIG device's framebuffer.
type memoryInfo struct {
	total, used, free, reserved gpu.Value
}

// readMemory prefers the v2 call, whose "used" leaves out the memory the driver reserves for itself (reported
// apart as reserved), and calls v1, whose "used" includes it, only where the driver has no v2 (before R510) or the
// device does not support it. A v2 that fails otherwise is reported rather than replaced by v1, so that "used"
// never steps by the reservation from one scrape to the next.
func (r *deviceReader) readMemory(h gonvml.Device, op gpu.Operation) (m memoryInfo) {
	if r.lost != nil {
		return m
	}
	if r.s.syms.memoryInfoV2 {
		v2, ret := h.GetMemoryInfo_v2()
		if ret == gonvml.SUCCESS {
			return memoryInfo{gpu.Known(float64(v2.Total)), gpu.Known(float64(v2.Used)), gpu.Known(float64(v2.Free)),
				gpu.Known(float64(v2.Reserved))}
		}
		if !unsupported(ret) {
			r.ok(op, ret)
			return m
		}
	}
	v1, ret := h.GetMemoryInfo()
	if !r.ok(op, ret) {
		return m
	}
	return memoryInfo{total: gpu.Known(float64(v1.Total)), used: gpu.Known(float64(v1.Used)), free: gpu.Known(float64(v1.Free))}
}

// readUtilization reads the device-wide utilization, which NVML does not give for GPUs in MIG mode.
func (r *deviceReader) readUtilization(h gonvml.Device, d *gpu.Device) {
	if r.lost != nil {
		return
	}
	if u, ret := h.GetUtilizationRates(); r.ok(gpu.OpUtilization, ret) {
		d.UtilizationRatio = gpu.Known(float64(u.Gpu) / 100)
		d.MemoryUtilizationRatio = gpu.Known(float64(u.Memory) / 100)
	}
	d.EncoderUtilizationRatio = readValue(r, gpu.OpEncoderUtilization, 0.01, func() (uint32, gonvml.Return) {
		u, _, ret := h.GetEncoderUtilization()
		return u, ret
	})
	d.DecoderUtilizationRatio = readValue(r, gpu.OpDecoderUtilization, 0.01, func() (uint32, gonvml.Return) {
		u, _, ret := h.GetDecoderUtilization()
		return u, ret
	})
}

func (r *deviceReader) readPowerAndThermal(h gonvml.Device, d *gpu.Device) {
	d.TemperatureCelsius = readValue(r, gpu.OpTemperature, 1, func() (uint32, gonvml.Return) {
		return h.GetTemperature(gonvml.TEMPERATURE_GPU)
	})
	d.PowerUsageWatts = readValue(r, gpu.OpPowerUsage, 0.001, h.GetPowerUsage)         // mW
	d.PowerLimitWatts = readValue(r, gpu.OpPowerLimit, 0.001, h.GetEnforcedPowerLimit) // mW
	d.EnergyJoules = readValue(r, gpu.OpEnergy, 0.001, h.GetTotalEnergyConsumption)    // mJ
	// Datacenter GPUs without fans answer NOT_SUPPORTED, which leaves the series out.
	d.FanSpeedRatio = readValue(r, gpu.OpFanSpeed, 0.01, h.GetFanSpeed)
	pstate := readValue(r, gpu.OpPerformanceState, 1, h.GetPerformanceState)
	// PSTATE_UNKNOWN (32) is NVML's "N/A".
	if pstate.Valid && pstate.V <= 15 {
		d.PerformanceState = pstate
	}
}

func (r *deviceReader) readClocks(h gonvml.Device) []gpu.Clock {
	var clocks []gpu.Clock
	for _, c := range []struct {
		name string
		typ  gonvml.ClockType
	}{
		{"graphics", gonvml.CLOCK_GRAPHICS},
		{"sm", gonvml.CLOCK_SM},
		{"memory", gonvml.CLOCK_MEM},
		{"video", gonvml.CLOCK_VIDEO},
	} {
		v := readValue(r, gpu.OpClocks, 1e6, func() (uint32, gonvml.Return) { return h.GetClockInfo(c.typ) }) // MHz
		if v.Valid {
			clocks = append(clocks, gpu.Clock{Name: c.name, Hertz: v.V})
		}
	}
	return clocks
}

// readECC reads the aggregate (lifetime, kept in the InfoROM across driver reloads and reboots) counts rather than
// the volatile ones that reset with the driver, because the metric is a counter of the GPU's history. GPUs without
// ECC, or with ECC disabled, answer NOT_SUPPORTED and get no series.
func (r *deviceReader) readECC(h gonvml.Device) []gpu.ECCCount {
	var counts []gpu.ECCCount
	for _, e := range []struct {
		name string
		typ  gonvml.MemoryErrorType
	}{
		{"corrected", gonvml.MEMORY_ERROR_TYPE_CORRECTED},
		{"uncorrected", gonvml.MEMORY_ERROR_TYPE_UNCORRECTED},
	} {
		v := readValue(r, gpu.OpECC, 1, func() (uint64, gonvml.Return) {
			return h.GetTotalEccErrors(e.typ, gonvml.AGGREGATE_ECC)
		})
		if v.Valid {
			counts = append(counts, gpu.ECCCount{Type: e.name, Count: v.V})
		}
	}
	return counts
}

// cString turns NVML's NUL-terminated char array into a string.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
