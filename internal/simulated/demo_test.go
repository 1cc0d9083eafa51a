package simulated

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/allocation"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// A demo node by name is its own node, the same at every start: no GPU UUID, PID, pod or pod UID of the built-in
// demo, its faults on other GPUs; the built-in demo is node-a; the vendor presets' names are kept for them.
func TestDemoNamed(t *testing.T) {
	base, err := DemoNamed(DemoNode)
	if err != nil {
		t.Fatal(err)
	}
	b1, err := DemoNamed("node-b")
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := DemoNamed("node-b")
	c, _ := DemoNamed("node-c")
	if !reflect.DeepEqual(b1.cfg, b2.cfg) {
		t.Error("node-b differs from one start to the next")
	}
	seen := func(s *Source) (ids []string) {
		for _, g := range s.cfg.GPUs {
			ids = append(ids, g.UUID)
			for _, m := range g.MIGInstances {
				ids = append(ids, m.UUID)
			}
			for _, p := range g.Processes {
				ids = append(ids, fmt.Sprint("pid ", p.PID))
				if p.Identity != nil && p.Identity.Pod != "" {
					ids = append(ids, "pod "+p.Identity.Pod, "uid "+p.Identity.PodUID, "container "+p.Identity.ContainerID)
				}
				if p.Identity != nil && p.Identity.SlurmJobID != "" {
					ids = append(ids, "job "+p.Identity.SlurmJobID)
				}
			}
		}
		return ids
	}
	for _, other := range []*Source{b1, c} {
		for _, id := range seen(other) {
			if slices.Contains(seen(base), id) {
				t.Errorf("a derived node shares %s with the demo", id)
			}
		}
	}
	faulty := func(s *Source) int {
		for i, g := range s.cfg.GPUs {
			if g.RecoveryAction != nil && *g.RecoveryAction != 0 {
				return i
			}
		}
		return -1
	}
	if faulty(base) != 6 || faulty(b1) < 0 || faulty(b1) == 6 && faulty(c) == 6 {
		t.Errorf("the GPU that needs a reset: demo %d, node-b %d, node-c %d", faulty(base), faulty(b1), faulty(c))
	}
	// It still reads: its allocations name its own devices.
	snap, err := b1.Snapshot(t.Context())
	if err != nil || len(snap.Devices) != 8 {
		t.Fatalf("node-b: %v", err)
	}
	allocs, ok := b1.Allocations()
	if !ok || len(allocs.Items) == 0 {
		t.Fatal("node-b has no allocations")
	}
	if j := allocation.Join(allocs, &reading.Reading{Snapshot: snap}); j.Unmapped != 0 || len(j.Allocations) == 0 {
		t.Errorf("node-b's allocations: %d name no device of it, %d do", j.Unmapped, len(j.Allocations))
	}
	for _, name := range []string{"Node_B", "-x", strings.Repeat("a", 64)} {
		if _, err := DemoNamed(name); err == nil {
			t.Errorf("--demo=%s: no error", name)
		}
	}
	// The presets' names are theirs, not derived nodes.
	for _, name := range []string{"amd", "mixed"} {
		s, err := DemoNamed(name)
		if err != nil {
			t.Fatalf("--demo=%s: %v", name, err)
		}
		p, _ := Preset(name)
		if !reflect.DeepEqual(s.cfg, p.cfg) {
			t.Errorf("--demo=%s is not the %s preset", name, name)
		}
	}
}
