package collector

import (
	"fmt"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
)

// The signals are the allocation series of TestAllocationsAndSignals, as values.
func TestReadAllocationSignals(t *testing.T) {
	snap, owners, allocs := allocationNode()
	r := &reading.Reading{Snapshot: snap, Owners: owners}

	s := ReadAllocationSignals(fixedAllocations{allocs, true}, r)
	if !s.Known {
		t.Fatal("known allocations read as unknown")
	}
	got := map[string]int{}
	for _, a := range s.Allocations {
		got[fmt.Sprintf("%d/%d/%d %s/%s/%s %s", a.GPU, a.GPUInstance, a.ComputeInstance, a.Namespace, a.Pod, a.Container, a.Resource)] = a.Processes
	}
	want := map[string]int{
		"1/-1/-1 ml/idx/c nvidia.com/gpu":              1,
		"2/-1/-1 ml/idle/c nvidia.com/gpu":             0,
		"4/-1/-1 ml/blind/c nvidia.com/gpu":            -1, // process list not read
		"0/-1/-1 ml/share/s nvidia.com/gpu":            0,
		"0/-1/-1 ml/train/trainer nvidia.com/gpu":      1,
		"3/1/0 ml/infer/server nvidia.com/mig-1g.10gb": 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("allocations:\n got %v\nwant %v", got, want)
	}
	var unrequested []string
	for _, u := range s.Unrequested {
		unrequested = append(unrequested, fmt.Sprintf("%d/%d/%d %s/%s/%s", u.GPU, u.GPUInstance, u.ComputeInstance, u.Namespace, u.Pod, u.Container))
	}
	if fmt.Sprint(unrequested) != "[1/-1/-1 ml/train/trainer 3/2/0 ml/infer/server]" {
		t.Errorf("unrequested use: %v", unrequested)
	}

	if s := ReadAllocationSignals(fixedAllocations{allocs, false}, r); s.Known || len(s.Allocations)+len(s.Unrequested) > 0 {
		t.Errorf("kubelet down: %+v", s)
	}
	if s := ReadAllocationSignals(fixedAllocations{nil, true}, r); !s.Known || len(s.Allocations) != 0 || len(s.Unrequested) != 5 {
		t.Errorf("no allocations: %+v", s)
	}
}
