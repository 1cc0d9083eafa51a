package simulated

import (
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
)

func (cfg *nodeConfig) allocations() []kubelet.Allocation {
	var out []kubelet.Allocation
	for _, a := range *cfg.Allocations {
		resource := a.Resource
		switch {
		case a.Claim != nil:
			resource = kubelet.NVIDIADRADriver
		case resource == "":
			resource = "nvidia.com/gpu"
		}
		for _, id := range a.DeviceIDs {
			alloc := kubelet.Allocation{Namespace: a.Namespace, Pod: a.Pod, Container: a.Container, Resource: resource, DeviceID: id}
			if c := a.Claim; c != nil {
				ns := c.Namespace
				if ns == "" {
					ns = a.Namespace
				}
				alloc.Device, _ = kubelet.ParseDRADeviceName(id)
				alloc.Claim = &kubelet.Claim{Name: c.Name, Namespace: ns, Pool: c.Pool}
			} else {
				alloc.Device = kubelet.ParseDeviceID(id)
			}
			out = append(out, alloc)
		}
	}
	return out
}

// owners returns the identities the file presets, by PID; where a PID is listed on more than one GPU, the first
// listing's identity counts.
func (cfg *nodeConfig) owners() map[uint32]attribution.Identity {
	out := make(map[uint32]attribution.Identity)
	for _, g := range cfg.GPUs {
		for _, p := range g.Processes {
			if _, seen := out[p.PID]; !seen && p.Identity != nil {
				out[p.PID] = p.Identity.identity()
			}
		}
	}
	return out
}

// started returns when the processes whose age the file gives started, counted back from opened; where a PID is
// listed on more than one GPU, the first listing's age counts.
func (cfg *nodeConfig) started(opened time.Time) map[uint32]time.Time {
	out := make(map[uint32]time.Time)
	for _, g := range cfg.GPUs {
		for _, p := range g.Processes {
			if _, seen := out[p.PID]; !seen && p.Age != nil {
				out[p.PID] = opened.Add(-time.Duration(*p.Age))
			}
		}
	}
	return out
}

func (c *identityConfig) identity() attribution.Identity { return c.Identity }
