//go:build linux && cgo

package stubnvml

import (
	"slices"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The stub serves a benchmark's node: STUB_NVML_GPUS GPUs, each with its own identity, and with STUB_NVML_SPREAD
// the STUB_NVML_PROCESSES processes dealt round robin over them, as go-nvml reads them through the real dlopen path.
// Without them it is the tests' two GPUs, GPU 0 holding every process. It loads the library into this process,
// which no other test of the package does (go-nvml binds NVML once per process).
func TestStubServesABenchmarkNode(t *testing.T) {
	lib := gonvml.New(gonvml.WithLibraryPath(H100R580.Build(t)))
	t.Setenv("STUB_NVML_PROCESSES", "20")
	for _, c := range []struct {
		name   string
		gpus   string
		spread bool
		want   [][]uint32 // compute PIDs of each GPU
	}{
		{name: "default", want: [][]uint32{pids(1001, 20, 1), nil}},
		{name: "eight GPUs, spread", gpus: "8", spread: true, want: [][]uint32{
			pids(1001, 3, 8), pids(1002, 3, 8), pids(1003, 3, 8), pids(1004, 3, 8),
			pids(1005, 2, 8), pids(1006, 2, 8), pids(1007, 2, 8), pids(1008, 2, 8)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("STUB_NVML_GPUS", c.gpus)
			if c.spread {
				t.Setenv("STUB_NVML_SPREAD", "1")
			}
			if ret := lib.Init(); ret != gonvml.SUCCESS {
				t.Fatalf("nvmlInit: %v", ret)
			}
			defer lib.Shutdown()
			n, ret := lib.DeviceGetCount()
			if ret != gonvml.SUCCESS || n != len(c.want) {
				t.Fatalf("%d GPUs (%v), want %d", n, ret, len(c.want))
			}
			uuids := map[string]bool{}
			for i, want := range c.want {
				d, ret := lib.DeviceGetHandleByIndex(i)
				if ret != gonvml.SUCCESS {
					t.Fatalf("GPU %d: %v", i, ret)
				}
				uuid, _ := d.GetUUID()
				pci, _ := d.GetPciInfo()
				uuids[uuid] = true
				procs, ret := d.GetComputeRunningProcesses()
				if ret != gonvml.SUCCESS {
					t.Fatalf("GPU %d's processes: %v", i, ret)
				}
				var got []uint32
				for _, p := range procs {
					got = append(got, p.Pid)
				}
				if !slices.Equal(got, want) {
					t.Errorf("GPU %d (%s, bus %v): processes %v, want %v", i, uuid, pci.BusId[:12], got, want)
				}
				samples, ret := d.GetProcessUtilization(0)
				got = got[:0]
				for _, s := range samples {
					got = append(got, s.Pid)
				}
				if len(want) > 0 && (ret != gonvml.SUCCESS || !slices.Equal(got, want)) {
					t.Errorf("GPU %d: utilization samples of %v (%v), want %v", i, got, ret, want)
				}
				graphics, _ := d.GetGraphicsRunningProcesses()
				if c.spread && len(graphics) > 0 {
					t.Errorf("GPU %d: %d drawing processes, want none", i, len(graphics))
				}
			}
			if len(uuids) != len(c.want) {
				t.Errorf("%d UUIDs for %d GPUs", len(uuids), len(c.want))
			}
		})
	}
}

// pids are count PIDs from first, step apart.
func pids(first uint32, count int, step uint32) []uint32 {
	var out []uint32
	for i := range count {
		out = append(out, first+uint32(i)*step)
	}
	return out
}
