//go:build linux && cgo

package nvml

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvml/stubnvml"
)

// BenchmarkSnapshotStub reads the stub library's two H100s on R580 through go-nvml's real bindings, each reading
// one second after the last on the source's clock so that every one computes GPM profiling: the source's own cost
// per reading (the stub's functions cost next to nothing, a driver's ioctls more), and nvml-calls/op, the NVML
// calls per reading, which is what a real driver's cost grows with. It loads the stub into this process: go-nvml
// binds NVML once per process, so no other test or benchmark here may load a library in-process.
func BenchmarkSnapshotStub(b *testing.B) {
	report := filepath.Join(b.TempDir(), "report")
	b.Setenv("STUB_NVML_REPORT", report)
	now := time.Now()
	s, err := New(Config{Library: gonvml.New(gonvml.WithLibraryPath(stubnvml.H100R580.Build(b))),
		Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	snap, err := s.Snapshot(b.Context()) // the first reading keeps the GPM baseline
	if err != nil || len(snap.Errors) != 0 {
		b.Fatal(err, snap.Errors)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		now = now.Add(time.Second)
		if snap, err = s.Snapshot(b.Context()); err != nil || snap.Devices[0].Profiling == nil {
			b.Fatal(err, snap.Errors)
		}
	}
	b.StopTimer()
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	out, err := os.ReadFile(report)
	if err != nil {
		b.Fatal(err)
	}
	calls, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(string(out)), "calls="), " ")
	n, err := strconv.Atoi(calls)
	if err != nil {
		b.Fatalf("stub report %q: %v", out, err)
	}
	b.ReportMetric(float64(n)/float64(b.N+1), "nvml-calls/op")
}
