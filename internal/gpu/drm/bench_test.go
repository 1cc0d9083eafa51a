package drm

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
)

// BenchmarkSnapshot reads an 8-GPU MI300X node with 512 or 2048 ROCm processes (a render node open among six other
// files, a DRM client and KFD's VRAM each) and 256 processes of no GPU with 24 files each: the source's own cost per
// reading, on a fake tree (a real procfs's fd links cost less to stat than the fake's symlinks). Read back to back,
// as the end-to-end benchmark scrapes, a process's look at all its open files, once a minute, weighs next to
// nothing; read every 15 seconds of the source's clock, as Prometheus scrapes, a quarter of the processes is
// looked at in full at each reading.
func BenchmarkSnapshot(b *testing.B) {
	for _, n := range []int{512, 2048} {
		b.Run(strconv.Itoa(n), func(b *testing.B) { benchmarkSnapshot(b, n, 0) })
	}
	b.Run("2048-every-15s", func(b *testing.B) { benchmarkSnapshot(b, 2048, 15*time.Second) })
}

// benchmarkSnapshot reads the node of procs processes, with readings every on the source's clock apart (0: the
// real clock).
func benchmarkSnapshot(b *testing.B, procs int, every time.Duration) {
	sysfs, procfs, err := computeNode(procs, 256).Write(b.TempDir())
	if errors.Is(err, drmfake.ErrNeedsRoot) {
		b.Skip(err)
	}
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{SysFS: sysfs, ProcFS: procfs}
	c := newClock()
	if every > 0 {
		cfg.Now = c.now
	}
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Snapshot(b.Context()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		c.t = c.t.Add(every)
		snap, err := s.Snapshot(b.Context())
		if err != nil || len(snap.Devices[0].Processes) != procs/8 {
			b.Fatal(err)
		}
	}
}

// computeNode is the MI300X node with procs ROCm processes spread over its GPUs (a render node open among six other
// files, a DRM client and KFD's VRAM each) and others processes of no GPU with 24 open files each.
func computeNode(procs, others int) *drmfake.Node {
	mi := drmfake.NewMI300X()
	node := mi.Node(false)
	node.Processes = nil
	for i := range procs {
		g := mi.GPUs[i%8]
		c := drmfake.AMDGPUClient{PDev: g.PCI, ID: uint64(10000 + i), VRAM: 258 << 20, GTT: 8 << 20}
		node.Processes = append(node.Processes, drmfake.Process{PID: uint32(100000 + i), Other: 6,
			DRM: []drmfake.File{{Minor: g.Render, FDInfo: c.FDInfo()}}, KFD: map[uint64]uint64{g.KFDGPUID: 256 << 20}})
	}
	for i := range others {
		node.Processes = append(node.Processes, drmfake.Process{PID: uint32(2000 + i), Other: 24})
	}
	return node
}

// BenchmarkParseFDInfo parses an amdgpu client's fdinfo of a 6.12 kernel, 29 lines, 18 of them memory keys: anew
// (ParseFDInfo), and again into the client of the last parse, as a reading does.
func BenchmarkParseFDInfo(b *testing.B) {
	in := readCorpus(b, "amdgpu-6.12.txt")
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParseFDInfo(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("again", func(b *testing.B) {
		var c Client
		b.ReportAllocs()
		for b.Loop() {
			if err := c.parse(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A reading's allocations do not grow with the processes: per reading there are a few dozen (directory listings,
// the snapshot's lists), and per process only those of its look at its open files, once a minute, none per
// fdinfo or KFD file read. The readings are a second apart, so that a third of the processes is looked at in full
// over them, as their looks are spread over a minute.
func TestSnapshotAllocations(t *testing.T) {
	for _, procs := range []int{64, 512} {
		t.Run(strconv.Itoa(procs), func(t *testing.T) {
			_, sysfs, procfs := writeNode(t, computeNode(procs, 0))
			c := newClock()
			s, err := New(Config{SysFS: sysfs, ProcFS: procfs, Now: c.now})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			snapshot(t, s)
			// 92 and 185 now: an allocation per process at every reading would take either over.
			budget := 100 + procs/4
			allocs := testing.AllocsPerRun(20, func() {
				c.t = c.t.Add(time.Second)
				if _, err := s.Snapshot(t.Context()); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("%.0f allocations per reading of 8 GPUs and %d processes", allocs, procs)
			if allocs > float64(budget) {
				t.Errorf("%.0f allocations per reading, over the budget of %d", allocs, budget)
			}
		})
	}
}
