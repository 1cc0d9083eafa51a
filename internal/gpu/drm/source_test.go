package drm

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
)

// writeNode writes a fake node, skipping where device nodes cannot be made.
func writeNode(t *testing.T, n *drmfake.Node) (dir, sysfs, procfs string) {
	t.Helper()
	dir = t.TempDir()
	sysfs, procfs, err := n.Write(dir)
	if errors.Is(err, drmfake.ErrNeedsRoot) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir, sysfs, procfs
}

// clock is a source's clock that the test moves.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newClock() *clock { return &clock{t: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)} }

// openSource opens the source on a written node, read at c's time, and closes it when the test ends.
func openSource(t *testing.T, sysfs, procfs string, c *clock) *Source {
	t.Helper()
	s, err := New(Config{SysFS: sysfs, ProcFS: procfs, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func process(t *testing.T, d gpu.Device, pid uint32) gpu.Process {
	t.Helper()
	for _, p := range d.Processes {
		if p.PID == pid {
			return p
		}
	}
	t.Fatalf("GPU %d: no process %d in %+v", d.Index, pid, d.Processes)
	return gpu.Process{}
}

func value(t *testing.T, what string, got gpu.Value, want float64) {
	t.Helper()
	if !got.Valid || got.V != want {
		t.Errorf("%s = %+v, want %v", what, got, want)
	}
}

func absentValue(t *testing.T, what string, got gpu.Value) {
	t.Helper()
	if got.Valid {
		t.Errorf("%s = %v, want absent", what, got.V)
	}
}

// The MI300X node's devices read as its files say: every reading amdgpu publishes, and absent what it does not.
func TestMI300XDevices(t *testing.T) {
	mi := drmfake.NewMI300X()
	_, sysfs, procfs := writeNode(t, mi.Node(false))
	c := newClock()
	s := openSource(t, sysfs, procfs, c)
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Errors) != 0 {
		t.Errorf("errors: %v", snap.Errors)
	}
	if len(snap.Devices) != 8 {
		t.Fatalf("%d devices, want the 8 MI300X (not the BMC's ast card): %+v", len(snap.Devices), snap.Devices)
	}
	if snap.DriverVersion != drmfake.MI300XDriver {
		t.Errorf("driver version %q, want the module's %q", snap.DriverVersion, drmfake.MI300XDriver)
	}
	for i, g := range mi.GPUs {
		d := snap.Devices[i]
		if d.Index != i || d.UUID != g.UUID || d.PCIBusID != g.PCI || d.Name != drmfake.MI300XName ||
			d.Vendor != gpu.VendorAMD || d.DRMCard != "card"+itoa(g.Card) || d.DriverVersion != drmfake.MI300XDriver {
			t.Errorf("GPU %d identity: %+v", i, d)
		}
		value(t, "utilization", d.UtilizationRatio, float64(g.Busy)/100)
		value(t, "memory utilization", d.MemoryUtilizationRatio, float64(g.MemBusy)/100)
		value(t, "memory total", d.MemoryTotalBytes, drmfake.MI300XVRAMTotal)
		value(t, "memory used", d.MemoryUsedBytes, float64(g.VRAMUsed))
		value(t, "memory free", d.MemoryFreeBytes, drmfake.MI300XVRAMTotal-float64(g.VRAMUsed))
		value(t, "temperature", d.TemperatureCelsius, g.JunctionC)
		value(t, "memory temperature", d.MemoryTemperatureCelsius, g.MemC)
		value(t, "power", d.PowerUsageWatts, g.PowerW)
		value(t, "power limit", d.PowerLimitWatts, drmfake.MI300XPowerCapW)
		value(t, "power management limit", d.PowerManagementLimitWatts, drmfake.MI300XPowerCapW)
		value(t, "PCIe generation", d.PCIe.Generation, 5)
		value(t, "PCIe max generation", d.PCIe.MaxGeneration, 5)
		value(t, "PCIe width", d.PCIe.Width, 16)
		value(t, "PCIe replays", d.PCIe.Replays, 0)
		want := []gpu.Clock{{Name: "graphics", Hertz: float64(g.SclkMHz) * 1e6}, {Name: "memory", Hertz: float64(g.MclkMHz) * 1e6}}
		if len(d.Clocks) != 2 || d.Clocks[0] != want[0] || d.Clocks[1] != want[1] {
			t.Errorf("GPU %d clocks %+v, want %+v", i, d.Clocks, want)
		}
		// amdgpu has no energy counter in hwmon, and the Instinct boards no fan.
		absentValue(t, "energy", d.EnergyJoules)
		absentValue(t, "fan", d.FanSpeedRatio)
		absentValue(t, "encoder", d.EncoderUtilizationRatio)
		if !d.ProcessesListed {
			t.Errorf("GPU %d: processes not listed", i)
		}
	}
}

// The MI300X node's processes: KFD's compute processes with their VRAM (the larger of KFD's count and their DRM
// file's), a DRM client counted once although two processes hold it, engine use only from the second reading.
func TestMI300XProcesses(t *testing.T) {
	mi := drmfake.NewMI300X()
	dir, sysfs, procfs := writeNode(t, mi.Node(false))
	c := newClock()
	s := openSource(t, sysfs, procfs, c)
	first, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range mi.Processes {
		if p.SharesWith != 0 {
			for _, d := range first.Devices {
				for _, q := range d.Processes {
					if q.PID == p.PID {
						t.Errorf("PID %d holds only PID %d's DRM client, which is counted for %d once: listed on GPU %d",
							p.PID, p.SharesWith, p.SharesWith, d.Index)
					}
				}
			}
			continue
		}
		got := process(t, first.Devices[p.GPU], p.PID)
		value(t, "memory of "+itoa(int(p.PID)), got.UsedMemoryBytes, float64(p.Memory))
		wantType := gpu.ProcessCompute
		if p.KFDVRAM == 0 {
			wantType = gpu.ProcessGraphics
		}
		if got.Type != wantType {
			t.Errorf("PID %d type %q, want %q", p.PID, got.Type, wantType)
		}
		absentValue(t, "first reading's decoder use", got.DecoderUtilizationRatio)
		absentValue(t, "first reading's SM use", got.SMUtilizationRatio)
	}
	if n := len(first.Devices[5].Processes); n != 0 {
		t.Errorf("idle GPU 5 has %d processes", n)
	}

	if err := mi.Node(true).RewriteFDInfo(procfs); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(4 * time.Second)
	second, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	_ = dir
	for _, p := range mi.Processes {
		if p.SharesWith != 0 {
			continue
		}
		got := process(t, second.Devices[p.GPU], p.PID)
		if p.KFDVRAM > 0 {
			// ROCm's compute work does not show in the DRM file's engine times: unknown, not 0.
			absentValue(t, "KFD process's SM use", got.SMUtilizationRatio)
		} else {
			value(t, "video client's SM use (amdgpu prints no idle engine)", got.SMUtilizationRatio, 0)
		}
		value(t, "decoder use of "+itoa(int(p.PID)), got.DecoderUtilizationRatio, float64(p.DecStepNS)/4e9)
		value(t, "encoder use of "+itoa(int(p.PID)), got.EncoderUtilizationRatio, 0)
	}
}

// A fd that is not a DRM device is never read, whatever its fdinfo says; nor is a DRM device of a driver the
// source does not read (nvidia-drm), nor a client of a GPU it does not know.
func TestOnlyDRMFilesOfKnownGPUsAreRead(t *testing.T) {
	mi := drmfake.NewMI300X()
	node := mi.Node(false)
	g := mi.GPUs[0]
	forged := drmfake.AMDGPUClient{PDev: g.PCI, ID: 9999, VRAM: 7 << 30}.FDInfo()
	node.OtherCards[9] = [2]string{"nvidia", "0000:c1:00.0"}
	node.Processes = append(node.Processes,
		// Its fd 0 is /dev/null (not DRM) with a DRM client's fdinfo: must not be read.
		drmfake.Process{PID: 7001, Other: 1},
		// nvidia-drm's card9, whose fdinfo names an amdgpu client: the minor is no GPU of this source.
		drmfake.Process{PID: 7002, DRM: []drmfake.File{{Minor: 9, FDInfo: forged}}},
		// A render node of an amdgpu GPU whose client names a PCI address that is no GPU of the node.
		drmfake.Process{PID: 7003, DRM: []drmfake.File{{Minor: g.Render,
			FDInfo: drmfake.AMDGPUClient{PDev: "0000:99:00.0", ID: 9998, VRAM: 5 << 30}.FDInfo()}}},
	)
	_, sysfs, procfs := writeNode(t, node)
	if err := os.WriteFile(filepath.Join(procfs, "7001", "fdinfo", "0"), []byte(forged), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{SysFS: sysfs, ProcFS: procfs})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if p.PID >= 7001 {
				t.Errorf("GPU %d lists PID %d: %+v", d.Index, p.PID, p)
			}
		}
	}
}

// The bounds on open files looked at: past the per-reading bound the process lists are not complete, which the
// devices say (no "idle" from a list that was cut) and an error names; past the per-process bound, an error.
func TestFDBounds(t *testing.T) {
	mi := drmfake.NewMI300X()
	_, sysfs, procfs := writeNode(t, mi.Node(false))
	s, err := New(Config{SysFS: sysfs, ProcFS: procfs, MaxFDsPerReading: 10})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Devices[0].ProcessesListed {
		t.Error("processes listed after the scan stopped at its bound")
	}
	if !hasError(snap, gpu.OpProcesses, "stopped looking at processes' open files after 10") {
		t.Errorf("errors %v", snap.Errors)
	}

	s, err = New(Config{SysFS: sysfs, ProcFS: procfs, MaxFDsPerProcess: 2})
	if err != nil {
		t.Fatal(err)
	}
	if snap, err = s.Snapshot(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !snap.Devices[0].ProcessesListed {
		t.Error("a process with many files made the whole list unlisted")
	}
	if !hasError(snap, gpu.OpProcesses, "more than 2 open files") {
		t.Errorf("errors %v", snap.Errors)
	}
}

func hasError(snap *gpu.Snapshot, op gpu.Operation, text string) bool {
	for _, e := range snap.Errors {
		if e.Operation == op && strings.Contains(e.Err.Error(), text) {
			return true
		}
	}
	return false
}

func itoa(i int) string { return strconv.Itoa(i) }
