// Package mixed serves a node with NVIDIA GPUs and GPUs of the kernel's DRM drivers (AMD, Intel) as one source:
// NVML's or nvidia-smi's reading of the NVIDIA GPUs, then the DRM source's of the others, each GPU once (the DRM
// source reads no GPU of NVIDIA's driver) and each with an index of its own.
package mixed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Source reads both sources, one after the other, into one snapshot.
type Source struct {
	nvidia, drm gpu.Source
}

// New joins the NVIDIA GPUs' source and the DRM source.
func New(nvidia, drm gpu.Source) *Source { return &Source{nvidia: nvidia, drm: drm} }

// Name implements gpu.Source: the two sources' names, "nvml+drm" or "nvidia-smi+drm".
func (s *Source) Name() string { return s.nvidia.Name() + "+" + s.drm.Name() }

// Timeout is the NVIDIA source's own bound on a reading (nvidia-smi's run), if it has one.
func (s *Source) Timeout() time.Duration {
	if t, ok := s.nvidia.(gpu.Timeouter); ok {
		return t.Timeout()
	}
	return 0
}

// Sources are the two sources, NVIDIA's first, for what one of them offers beyond readings (NVML's self-metrics).
func (s *Source) Sources() []gpu.Source { return []gpu.Source{s.nvidia, s.drm} }

// Snapshot implements gpu.Source. A source that cannot be read at all leaves the other's GPUs, with an error
// that says which failed; an error return means neither could be read.
func (s *Source) Snapshot(ctx context.Context) (*gpu.Snapshot, error) {
	nv, nvErr := s.nvidia.Snapshot(ctx)
	dr, drErr := s.drm.Snapshot(ctx)
	switch {
	case nvErr != nil && drErr != nil:
		return nil, errors.Join(fmt.Errorf("%s: %w", s.nvidia.Name(), nvErr), fmt.Errorf("%s: %w", s.drm.Name(), drErr))
	case nvErr != nil:
		dr.Errors = append(dr.Errors, gpu.DeviceError{Index: -1, Operation: gpu.OpDevice,
			Err: fmt.Errorf("reading the NVIDIA GPUs (%s): %w", s.nvidia.Name(), nvErr)})
		return dr, nil
	case drErr != nil:
		nv.Errors = append(nv.Errors, gpu.DeviceError{Index: -1, Operation: gpu.OpDevice,
			Err: fmt.Errorf("reading the AMD and Intel GPUs (%s): %w", s.drm.Name(), drErr)})
		return nv, nil
	}
	// The DRM source numbers its GPUs after the node's NVIDIA GPUs; should NVML number them past that (a GPU
	// that sysfs did not show), the DRM GPUs move up rather than share an index.
	shift := 0
	for _, d := range nv.Devices {
		for _, o := range dr.Devices {
			shift = max(shift, d.Index+1-o.Index)
		}
	}
	for i := range dr.Devices {
		dr.Devices[i].Index += shift
	}
	for i := range dr.Errors {
		if dr.Errors[i].Index >= 0 {
			dr.Errors[i].Index += shift
		}
	}
	nv.Devices = append(nv.Devices, dr.Devices...)
	nv.Errors = append(nv.Errors, dr.Errors...)
	return nv, nil
}

// Close implements gpu.Source.
func (s *Source) Close() error { return errors.Join(s.nvidia.Close(), s.drm.Close()) }
