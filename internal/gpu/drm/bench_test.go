package drm

import (
	"errors"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
)

// BenchmarkSnapshot reads an 8-GPU MI300X node with 512 ROCm processes (a render node open among six other files,
// a DRM client and KFD's VRAM each) and 256 processes of no GPU with 24 files each: the source's own cost per
// reading, on a fake tree (a real procfs's fd links cost less to stat than the fake's symlinks).
func BenchmarkSnapshot(b *testing.B) {
	mi := drmfake.NewMI300X()
	node := mi.Node(false)
	node.Processes = nil
	for i := range 512 {
		g := mi.GPUs[i%8]
		c := drmfake.AMDGPUClient{PDev: g.PCI, ID: uint64(10000 + i), VRAM: 258 << 20, GTT: 8 << 20}
		node.Processes = append(node.Processes, drmfake.Process{PID: uint32(100000 + i), Other: 6,
			DRM: []drmfake.File{{Minor: g.Render, FDInfo: c.FDInfo()}}, KFD: map[uint64]uint64{g.KFDGPUID: 256 << 20}})
	}
	for i := range 256 {
		node.Processes = append(node.Processes, drmfake.Process{PID: uint32(2000 + i), Other: 24})
	}
	sysfs, procfs, err := node.Write(b.TempDir())
	if errors.Is(err, drmfake.ErrNeedsRoot) {
		b.Skip(err)
	}
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{SysFS: sysfs, ProcFS: procfs})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Snapshot(b.Context()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		snap, err := s.Snapshot(b.Context())
		if err != nil || len(snap.Devices[0].Processes) != 64 {
			b.Fatal(err)
		}
	}
}
