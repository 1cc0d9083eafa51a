package simulated

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/configfile"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

func TestOpenReadsReferenceExample(t *testing.T) {
	s, err := Open("testdata/node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Simulated || snap.DriverVersion != "580.95.05" || len(snap.Devices) != 2 {
		t.Fatalf("snapshot = %+v", snap)
	}
	d := snap.Devices[0]
	if d.Index != 0 || d.UtilizationRatio != gpu.Known(0.42) || d.TemperatureCelsius != gpu.Known(41) {
		t.Errorf("device 0 readings = %+v", d)
	}
	if d.FanSpeedRatio.Valid || d.MemoryUtilizationRatio.Valid {
		t.Errorf("readings absent from the file must be unknown, not 0: fan %+v mem util %+v", d.FanSpeedRatio, d.MemoryUtilizationRatio)
	}
	if d.MemoryUsedBytes != gpu.Known(3<<30) || d.MemoryFreeBytes != gpu.Known(85520809984-3<<30) {
		t.Errorf("used/free memory without memory_used_bytes = %+v / %+v, want the processes' sum", d.MemoryUsedBytes, d.MemoryFreeBytes)
	}
	if len(d.Processes) != 2 || d.Processes[1].Type != gpu.ProcessMPS || d.Processes[1].SMUtilizationRatio.Valid {
		t.Errorf("processes = %+v", d.Processes)
	}
	mig := snap.Devices[1]
	if mig.MIGMode != "enabled" || len(mig.MIG) != 1 || mig.MIG[0].Profile != "3g.40gb" || mig.MIG[0].MemoryUsedBytes.Valid {
		t.Errorf("MIG device = %+v", mig)
	}
	if p := mig.Processes[0]; !p.MIG || p.GPUInstance != 1 || p.ComputeInstance != 0 || p.UsedMemoryBytes.Valid {
		t.Errorf("MIG process = %+v", p)
	}
}

func TestParseRejectsWithKeyAndLine(t *testing.T) {
	base := "gpus:\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60\n    memory_total_bytes: 1000\n"
	proc := base + "    processes:\n      - pid: 7\n"
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown top-level key", "gpu:\n  - {}\n", `line 1: unknown key "gpu"`},
		{"unknown GPU key", base + "    temprature_celsius: 40\n", `line 4: unknown key "temprature_celsius"`},
		{"unknown process key", proc + "        type: compute\n        memory: 5\n", `line 7: unknown key "memory"`},
		{"ratio above 1", base + "    utilization_ratio: 42\n", "line 4: ratio 42 is outside 0..1"},
		{"not a number", base + "    temperature_celsius: hot\n", "line 4: want a number, got the text hot"},
		{"negative bytes", proc + "        type: compute\n        used_memory_bytes: -1\n", `line 7: "-1" is not a byte count`},
		{"bad process type", proc + "        type: cuda\n", `line 6: process type "cuda"`},
		{"missing type", proc, "processes[0].type is required"},
		{"allocatable without allocations", base + "allocatable: {nvidia.com/gpu: 1}\n", "allocatable: needs allocations"},
		{"negative allocatable", base + "allocatable: {nvidia.com/gpu: -1}\nallocations: []\n", "allocatable: nvidia.com/gpu has -1 devices"},
		{"bad age", proc + "        type: compute\n        age: 3 hours\n", `line 7: age "3 hours" must be a duration`},
		{"negative age", proc + "        type: compute\n        age: -1h\n", `line 7: age "-1h" must be a duration`},
		{"age as a number", proc + "        type: compute\n        age: 60\n", `line 7: age "60" must be a duration`},
		{"bad uuid", "gpus:\n  - uuid: 0\n    memory_total_bytes: 1\n", "gpus[0].uuid"},
		{"no GPUs", "driver_version: x\n", "at least one GPU"},
		{"empty", "", "empty"},
		{"MIG process on unknown instance", proc + "        type: compute\n        gpu_instance: 1\n        compute_instance: 0\n", "no mig_instances entry"},
		{"repeated MIG instance", base + "    mig_mode: enabled\n    mig_instances:\n      - {gpu_instance: 1, compute_instance: 0}\n" +
			"      - {gpu_instance: 1, compute_instance: 0}\n", "mig_instances[1]: gpu_instance 1, compute_instance 0 appears twice"},
		{"bad pstate", base + "    performance_state: 16\n", "line 4: performance_state"},
		{"unknown clock", base + "    clocks_hertz: {shader: 1}\n", `unknown clock "shader"`},
		{"minor number twice", base + "    minor_number: 1\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f61\n    memory_total_bytes: 1\n",
			"gpus[1].minor_number: 1 is negative or another GPU's"},
		{"bad placement", base + "    mig_mode: enabled\n    mig_instances:\n      - {gpu_instance: 1, compute_instance: 0, placement: {profile_id: 19, start: 0, size: 0}}\n",
			"mig_instances[0].placement"},
		{"claim without name", base + "allocations: [{namespace: n, pod: p, container: c, claim: {pool: x}, device_ids: [gpu-0]}]\n",
			"allocations[0]: claim.name is required"},
		{"claim of another driver", base + "allocations: [{namespace: n, pod: p, container: c, resource: dra.net, claim: {name: x}, device_ids: [gpu-0]}]\n",
			`allocations[0]: resource "dra.net"`},
		{"claim with a device plugin ID", base + "allocations: [{namespace: n, pod: p, container: c, claim: {name: x}, device_ids: [GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60]}]\n",
			`is not a gpu.nvidia.com GPU device name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parse error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestReloadsWhenTheFileChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	write := func(body string, mtime time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	one := "gpus:\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60\n    memory_total_bytes: 1000\n"
	t0 := time.Now().Add(-time.Hour)
	write(one, t0)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	devices := func() (int, []gpu.DeviceError) {
		snap, err := s.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return len(snap.Devices), snap.Errors
	}

	two := one + "  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f61\n    memory_total_bytes: 1000\n"
	write(two, t0.Add(time.Second))
	if n, errs := devices(); n != 2 || len(errs) != 0 {
		t.Fatalf("after adding a GPU: %d devices, errors %v", n, errs)
	}

	write(two+"    bogus: 1\n", t0.Add(2*time.Second))
	n, errs := devices()
	if n != 2 || len(errs) != 1 || !strings.Contains(errs[0].Error(), `unknown key "bogus"`) {
		t.Fatalf("after a bad edit: %d devices (want the last good 2), errors %v", n, errs)
	}

	write(one, t0.Add(3*time.Second))
	if n, errs := devices(); n != 1 || len(errs) != 0 {
		t.Fatalf("after fixing the file: %d devices, errors %v", n, errs)
	}
}

func TestOpenFailsOnBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte("gpus: [{uuid: x}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open = %v, want an error naming the file", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("Open of a missing file succeeded")
	}
}

// TestOpenRefusesOversizedFile: a file over MaxFileBytes is refused without being read whole or parsed, even when
// it is valid YAML (here a valid node followed by a long comment).
func TestOpenRefusesOversizedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	node := "gpus:\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60\n    memory_total_bytes: 1000\n"
	for _, tc := range []struct {
		size int
		ok   bool
	}{{MaxFileBytes, true}, {MaxFileBytes + 1, false}} {
		pad := "#" + strings.Repeat("x", tc.size-len(node)-2) + "\n"
		if err := os.WriteFile(path, []byte(node+pad), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(path)
		if tc.ok && err != nil {
			t.Errorf("Open of a %d-byte file: %v", tc.size, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "larger than 4194304 bytes") || !strings.Contains(err.Error(), path)) {
			t.Errorf("Open of a %d-byte file = %v, want an error naming the file and the cap", tc.size, err)
		}
	}
}

// A node file that is a FIFO or a device is refused at once: neither blocks the reading nor is read without end.
func TestOpenRefusesWhatIsNotARegularFile(t *testing.T) {
	pipe := filepath.Join(t.TempDir(), "node.yaml")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{pipe, "/dev/zero"} {
		if err := testkit.Within(t, 5*time.Second, path, func() error { _, err := Open(path); return err }); !errors.Is(err, configfile.ErrNotRegular) {
			t.Errorf("Open(%s) = %v, want a refusal", path, err)
		}
	}
}

// TestOpenRefusesAliasExpansion: YAML aliases let a file within MaxFileBytes stand for gigabytes (GPUs that alias
// one long name); a file whose values, aliases expanded, pass MaxExpandedBytes is refused, naming the reason. Aliases
// that share a little (one GPU's health readings for all) are fine.
func TestOpenRefusesAliasExpansion(t *testing.T) {
	node := func(gpus int, name string) string {
		var b strings.Builder
		b.WriteString("gpus:\n")
		for i := range gpus {
			fmt.Fprintf(&b, "  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-%012d\n    memory_total_bytes: 1000\n", i)
			if i == 0 {
				fmt.Fprintf(&b, "    name: &name %q\n    pcie: &pcie {generation: 5, width: 16}\n", name)
			} else {
				b.WriteString("    name: *name\n    pcie: *pcie\n")
			}
		}
		return b.String()
	}
	path := filepath.Join(t.TempDir(), "node.yaml")
	for _, tc := range []struct {
		what string
		data string
		ok   bool
	}{
		{"1,000 GPUs sharing a short name and PCIe readings", node(1000, "NVIDIA H100 80GB HBM3"), true},
		{"200 GPUs aliasing a 64 KiB name (12.8 MiB expanded)", node(200, strings.Repeat("n", 64<<10)), false},
		{"1,000 GPUs aliasing a 3 MiB name (3 GiB expanded)", node(1000, strings.Repeat("n", 3<<20)), false},
	} {
		if len(tc.data) > MaxFileBytes {
			t.Fatalf("%s: the file is %d bytes, over MaxFileBytes", tc.what, len(tc.data))
		}
		if err := os.WriteFile(path, []byte(tc.data), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.what, err)
		case tc.ok:
			if snap, err := s.Snapshot(t.Context()); err != nil || len(snap.Devices) != 1000 {
				t.Errorf("%s: snapshot error %v", tc.what, err)
			}
		case err == nil || !strings.Contains(err.Error(), "YAML aliases expanded") || !strings.Contains(err.Error(), path):
			t.Errorf("%s: Open = %v, want an error naming the file and the expansion", tc.what, err)
		}
	}
}

func TestEnergyGrowsWithPower(t *testing.T) {
	s, err := Open("testdata/node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	start := s.loaded
	s.now = func() time.Time { return start.Add(10 * time.Second) }
	snap, _ := s.Snapshot(context.Background())
	if e := snap.Devices[0].EnergyJoules; !e.Valid || e.V != 3105 {
		t.Errorf("energy after 10 s at 310.5 W = %+v, want 3105 J", e)
	}
	if snap.Devices[1].EnergyJoules.Valid {
		t.Error("a GPU with neither power nor energy configured must have no energy reading")
	}
}

// The demo node must show every shape docs/reference.md and the demo promise: time-slicing, MPS, MIG, a Slurm job, a service,
// a plain container and idle GPUs, all with names and no runtime present.
func TestDemoNode(t *testing.T) {
	demo := Demo()
	snap, err := demo.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	owners := demo.PresetOwners()
	if len(snap.Devices) != 8 || !snap.Simulated {
		t.Fatalf("demo has %d GPUs, simulated=%v", len(snap.Devices), snap.Simulated)
	}
	var mps, mig, slurm, unit, plain, idle int
	pods := map[int]map[string]bool{}
	procsOfPod := map[string]int{}
	started := demo.PresetStarted()
	for _, d := range snap.Devices {
		if len(d.Processes) == 0 {
			idle++
		}
		if d.MIGMode == "enabled" && len(d.MIG) > 0 {
			mig++
		}
		pods[d.Index] = map[string]bool{}
		for _, p := range d.Processes {
			id, ok := owners[p.PID]
			if !ok {
				t.Fatalf("demo process %d has no preset identity", p.PID)
			}
			switch {
			case id.Pod != "":
				if id.Namespace == "" || id.Container == "" || id.PodUID == "" || len(id.ContainerID) != 64 {
					t.Errorf("demo pod process %d lacks names: %+v", p.PID, id)
				}
				pods[d.Index][id.Pod] = true
				procsOfPod[id.Namespace+"/"+id.Pod]++
			case id.SlurmJobID != "":
				slurm++
			case id.SystemdUnit != "":
				unit++
			case id.Container != "":
				plain++
			}
			if p.Type == gpu.ProcessMPS {
				mps++
			}
			if _, ok := started[p.PID]; !ok {
				t.Errorf("demo process %d has no age", p.PID)
			}
		}
	}
	shared := 0
	for _, p := range pods {
		if len(p) >= 3 {
			shared++
		}
	}
	several := 0
	for _, n := range procsOfPod {
		if n > 1 {
			several++
		}
	}
	if several == 0 {
		t.Error("no demo pod has several processes, so that grouping by workload shows nothing")
	}
	if shared == 0 || mps == 0 || mig == 0 || slurm == 0 || unit == 0 || plain == 0 || idle < 2 {
		t.Errorf("demo shapes: time-sliced=%d mps=%d mig=%d slurm=%d unit=%d plain=%d idle=%d", shared, mps, mig, slurm, unit, plain, idle)
	}
}

func TestAllocations(t *testing.T) {
	demo := Demo()
	allocs, ok := demo.Allocations()
	if !ok || !demo.HasAllocations() || len(allocs.Items) != 12 {
		t.Fatalf("demo allocations: ok %v, %d items", ok, len(allocs.Items))
	}
	mig := allocs.Items[6]
	if mig.Resource != "nvidia.com/mig-3g.40gb" || mig.Device.UUID != "MIG-66c3976f-b4d6-8b32-2487-28a5bd3f9378" {
		t.Errorf("MIG allocation = %+v", mig)
	}
	if shared := allocs.Items[0]; shared.Resource != "nvidia.com/gpu" || shared.Device.UUID != "GPU-f5217cdd-1115-1734-2ef5-22684bb654d2" {
		t.Errorf("time-sliced replica allocation = %+v", shared)
	}
	// DRA claims of NVIDIA's driver: a MIG device placed by its name, and a whole GPU by its minor number.
	if m := allocs.Items[10]; m.Resource != "gpu.nvidia.com" || m.DeviceID != "gpu-2-mig-1g10gb-19-6" || m.Device.Minor != 2 ||
		m.Device.MIG == nil || *m.Device.MIG != (kubelet.MIGPlacement{Profile: "1g10gb", ProfileID: 19, Start: 6}) ||
		m.Claim == nil || *m.Claim != (kubelet.Claim{Name: "embedder-0-mig-8xk2q", Namespace: "vision", Pool: "demo-node"}) {
		t.Errorf("DRA MIG allocation = %+v (claim %+v, MIG %+v)", m, m.Claim, m.Device.MIG)
	}
	if g := allocs.Items[11]; g.Device.Minor != 7 || g.Device.MIG != nil || g.Claim == nil || g.Claim.Namespace != "search" {
		t.Errorf("DRA GPU allocation = %+v (claim %+v)", g, g.Claim)
	}
	s, err := Open("testdata/node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Allocations(); ok || s.HasAllocations() {
		t.Error("a node file without allocations: must say allocations are unknown, not empty")
	}
	if _, err := parse([]byte("gpus: [{uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60, memory_total_bytes: 1}]\nallocations: [{pod: p}]\n")); err == nil ||
		!strings.Contains(err.Error(), "allocations[0]") {
		t.Errorf("incomplete allocation: %v", err)
	}
}

// FuzzParse: any file either fails with an error or gives a snapshot whose readings are in range.
func FuzzParse(f *testing.F) {
	for _, path := range []string{"testdata/node.yaml", "demo.yaml"} {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("gpus: [{uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60, memory_total_bytes: 1, processes: [{pid: 1, type: mps}]}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parse(data)
		if err != nil {
			return
		}
		snap := cfg.snapshot(1)
		for _, d := range snap.Devices {
			for _, v := range []gpu.Value{d.UtilizationRatio, d.MemoryUtilizationRatio, d.FanSpeedRatio} {
				if v.Valid && !(v.V >= 0 && v.V <= 1) {
					t.Fatalf("ratio %v out of range", v.V)
				}
			}
			if !d.MemoryFreeBytes.Valid || d.MemoryFreeBytes.V < 0 {
				t.Fatalf("free memory %+v", d.MemoryFreeBytes)
			}
			checkHealth(t, d)
			for _, p := range d.Processes {
				if p.PID == 0 || p.Type == "" {
					t.Fatalf("process %+v passed validation", p)
				}
			}
		}
		if cfg.Allocations != nil {
			cfg.allocations()
		}
	})
}

// A process's age in the node file dates its start from when the file was opened, so that it keeps ageing.
func TestProcessAge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	yaml := "gpus:\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60\n    memory_total_bytes: 1000\n    processes:\n" +
		"      - {pid: 7, type: compute, age: 3h20m}\n      - {pid: 8, type: compute}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	started := s.PresetStarted()
	if got, ok := started[7]; !ok || got.Before(before.Add(-200*time.Minute)) || got.After(after.Add(-200*time.Minute)) {
		t.Errorf("PID 7 started %v, want 3h20m before the file was opened (%v)", got, before)
	}
	if got, ok := started[8]; ok {
		t.Errorf("PID 8 has no age, but started %v", got)
	}
}
