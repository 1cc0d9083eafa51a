package top

import (
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// A GPU with a health problem is marked in its line, and one line under the GPUs names every such GPU's problems;
// a node without problems has neither.
func TestRenderMarksUnhealthyGPUs(t *testing.T) {
	at := time.Date(2026, 11, 30, 23, 40, 1, 0, time.UTC)
	render := func(rd Reading) []string {
		return strings.Split(Render(Frame{Screen: Build(rd, View{}), Time: at, Width: 132, Height: 30}, Styles{}), "\n")
	}
	healthy := render(node())
	for _, l := range healthy {
		if strings.Contains(l, "✗") {
			t.Errorf("a healthy node has a health mark: %q", l)
		}
	}

	rd := node()
	d := &rd.Result.Snapshot.Devices[0] // GPU 1
	d.Health.RecoveryAction, d.Health.RemapPending = gpu.Known(1), gpu.Known(1)
	rd.Result.Snapshot.Devices[4].PCIe = gpu.PCIe{Width: gpu.Known(8), MaxWidth: gpu.Known(16)} // GPU 4
	lines := render(rd)
	for i, want := range map[int]string{3: "✗ 1 A100-SXM4-80GB", 6: "✗ 4 L4", 2: "  0 H100 80GB HBM3"} {
		if !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d = %q, want it to start %q", i, lines[i], want)
		}
	}
	if want := "✗ GPU 1: needs GPU reset, row remap pending · GPU 4: PCIe x8 of x16"; lines[7] != want {
		t.Errorf("line 7 = %q, want %q", lines[7], want)
	}
}
