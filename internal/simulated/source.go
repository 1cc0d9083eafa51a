// Package simulated is a node without GPUs: a GPU source (gpu.Source) that reads the node it reports from a YAML
// file (docs/reference.md, "Simulated node file"), or from the built-in demo node, with the owners of its processes
// (attribution.Preset) and the kubelet's allocations (allocation.Source) that the file presets. It lets people
// without a GPU see real output, and lets end-to-end tests list real container PIDs as GPU processes.
package simulated

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/configfile"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
)

// The built-in nodes, each a file of its own.
var (
	//go:embed demo.yaml
	demoYAML []byte
	//go:embed amd.yaml
	amdYAML []byte
	//go:embed mixed.yaml
	mixedYAML []byte
)

// presets are the built-in nodes by the name --demo takes: "" for --demo alone.
var presets = map[string][]byte{"": demoYAML, "amd": amdYAML, "mixed": mixedYAML}

// Presets are the names of the built-in nodes, "" (--demo alone, the NVIDIA node) first.
func Presets() []string { return slices.Sorted(maps.Keys(presets)) }

// Preset returns a built-in node by name: "" is the demo node (Demo), "amd" eight AMD Instinct MI300X, "mixed"
// NVIDIA, AMD and Intel GPUs on one node.
func Preset(name string) (*Source, error) {
	data, ok := presets[name]
	if !ok {
		return nil, fmt.Errorf("no built-in node %q", name)
	}
	cfg, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("built-in node %q is invalid: %w", name, err)
	}
	now := time.Now()
	return &Source{cfg: cfg, now: time.Now, loaded: now, opened: now}, nil
}

// Source is a simulated node.
type Source struct {
	path string // empty for the demo node
	now  func() time.Time
	// opened is when the source was made, from which the processes' ages count.
	opened time.Time

	mu       sync.Mutex
	cfg      *nodeConfig
	loaded   time.Time // when cfg was read; energy counts from here
	modTime  time.Time
	size     int64
	failedAt time.Time // modTime of a file version that did not parse, so it is reported and not re-read
	lastErr  error
}

// Demo returns the built-in demo node: seven H100s and a workstation card, shared by pods, MPS, MIG, a Slurm job,
// a service and a plain container.
func Demo() *Source {
	s, err := Preset("")
	if err != nil {
		panic(err)
	}
	return s
}

// MaxFileBytes bounds a simulated node file. Parsing YAML costs several times the file's size in memory; the demo
// node, eight GPUs with all their processes, health readings and comments, takes 29 KB, so 4 MiB is room for a
// thousand GPUs.
const MaxFileBytes = 4 << 20

// Open reads a node file. The file is re-read when its modification time or size changes; a version that does
// not parse is reported in each snapshot's Errors while the last good version stays in use.
func Open(path string) (*Source, error) {
	s := &Source{path: path, now: time.Now, opened: time.Now()}
	if err := s.reload(); err != nil {
		return nil, err
	}
	if s.lastErr != nil {
		return nil, s.lastErr
	}
	return s, nil
}

// Name implements gpu.Source.
func (s *Source) Name() string { return "simulated" }

// Close implements gpu.Source.
func (s *Source) Close() error { return nil }

// Snapshot implements gpu.Source.
func (s *Source) Snapshot(ctx context.Context) (*gpu.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.path != "" {
		if err := s.reload(); err != nil {
			return nil, err
		}
	}
	now := s.now()
	snap := s.cfg.snapshot(now.Sub(s.loaded).Seconds())
	snap.Time = now
	if s.lastErr != nil {
		snap.Errors = append(snap.Errors, gpu.DeviceError{Index: -1, Operation: gpu.OpConfig, Err: s.lastErr})
	}
	return snap, nil
}

// PresetOwners implements attribution.Preset: the owners that the node file gives its processes, which need not
// exist on this machine.
func (s *Source) PresetOwners() map[uint32]attribution.Identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.owners()
}

// PresetStarted implements attribution.Preset: when the processes whose age the node file gives started.
func (s *Source) PresetStarted() map[uint32]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.started(s.opened)
}

// HasAllocations reports whether the node file lists kubelet allocations.
func (s *Source) HasAllocations() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Allocations != nil
}

// Allocatable is how many devices of each GPU resource the node file's stand-in kubelet can allocate; read-only.
func (s *Source) Allocatable() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Allocatable
}

// Allocations implements allocation.Source: the node file's kubelet allocations, so that a simulated node shows the allocation signals
// without a kubelet. ok is false when the file has no allocations key.
func (s *Source) Allocations() (kubelet.Allocations, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.Allocations == nil {
		return kubelet.Allocations{}, false
	}
	return kubelet.Allocations{Time: s.now(), Items: s.cfg.allocations()}, true
}

// reload re-reads the file if it changed. It returns an error only when the file cannot be stat'ed at all.
func (s *Source) reload() error {
	fi, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("reading simulated node file: %w", err)
	}
	if s.cfg != nil && fi.ModTime().Equal(s.modTime) && fi.Size() == s.size {
		return nil
	}
	if s.lastErr != nil && fi.ModTime().Equal(s.failedAt) {
		return nil
	}
	// A regular file only, read no further than the cap: a FIFO would block the reading, a device never end it.
	data, err := configfile.Read(s.path, MaxFileBytes)
	if errors.Is(err, configfile.ErrTooLarge) {
		s.lastErr = fmt.Errorf("simulated node file %s is larger than %d bytes", s.path, MaxFileBytes)
		s.failedAt = fi.ModTime()
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading simulated node file: %w", err)
	}
	cfg, err := parse(data)
	if err != nil {
		s.lastErr = fmt.Errorf("simulated node file %s: %w", s.path, err)
		s.failedAt = fi.ModTime()
		return nil
	}
	if s.cfg == nil {
		s.loaded = s.now()
	}
	s.cfg, s.modTime, s.size, s.lastErr = cfg, fi.ModTime(), fi.Size(), nil
	return nil
}
