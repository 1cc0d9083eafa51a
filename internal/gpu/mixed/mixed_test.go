package mixed

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

type fixed struct {
	name string
	snap *gpu.Snapshot
	err  error
}

func (f fixed) Name() string { return f.name }
func (f fixed) Snapshot(context.Context) (*gpu.Snapshot, error) {
	if f.snap == nil {
		return nil, f.err
	}
	c := *f.snap
	c.Devices = append([]gpu.Device(nil), f.snap.Devices...)
	return &c, f.err
}
func (f fixed) Close() error { return nil }

func devices(vendor string, indices ...int) *gpu.Snapshot {
	s := &gpu.Snapshot{DriverVersion: vendor + "-driver"}
	for _, i := range indices {
		s.Devices = append(s.Devices, gpu.Device{Index: i, UUID: vendor + "-" + string(rune('0'+i)), Vendor: vendor})
	}
	return s
}

// Both vendors' GPUs, NVIDIA's first, each once, indices distinct; a source that fails leaves the other's GPUs
// and an error naming it; both failing is the reading's failure.
func TestMixed(t *testing.T) {
	nv := fixed{name: "nvml", snap: devices(gpu.VendorNVIDIA, 0, 1)}
	dr := fixed{name: "drm", snap: devices(gpu.VendorAMD, 2, 3)}
	s := New(nv, dr)
	if s.Name() != "nvml+drm" {
		t.Errorf("name %q", s.Name())
	}
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range snap.Devices {
		got = append(got, d.Vendor+":"+string(rune('0'+d.Index)))
	}
	if strings.Join(got, " ") != "nvidia:0 nvidia:1 amd:2 amd:3" || snap.DriverVersion != "nvidia-driver" {
		t.Errorf("devices %v, driver %q", got, snap.DriverVersion)
	}

	// NVML numbers a GPU past the ones sysfs showed: the DRM GPUs move up.
	s = New(fixed{name: "nvml", snap: devices(gpu.VendorNVIDIA, 0, 1, 2)}, dr)
	snap, _ = s.Snapshot(t.Context())
	if idx := snap.Devices[3].Index; idx != 3 || snap.Devices[4].Index != 4 {
		t.Errorf("DRM GPUs at %d, %d; want 3, 4", idx, snap.Devices[4].Index)
	}

	s = New(fixed{name: "nvidia-smi", err: errors.New("nvidia-smi timed out")}, dr)
	snap, err = s.Snapshot(t.Context())
	if err != nil || len(snap.Devices) != 2 || len(snap.Errors) != 1 ||
		!strings.Contains(snap.Errors[0].Error(), "NVIDIA GPUs (nvidia-smi): nvidia-smi timed out") {
		t.Errorf("NVIDIA failing: %v, %+v", err, snap)
	}
	s = New(nv, fixed{name: "drm", err: errors.New("listing DRM devices: EIO")})
	if snap, err = s.Snapshot(t.Context()); err != nil || len(snap.Devices) != 2 || len(snap.Errors) != 1 {
		t.Errorf("DRM failing: %v, %+v", err, snap)
	}
	s = New(fixed{name: "nvml", err: errors.New("a")}, fixed{name: "drm", err: errors.New("b")})
	if _, err := s.Snapshot(t.Context()); err == nil || err.Error() != "nvml: a\ndrm: b" {
		t.Errorf("both failing: %v", err)
	}
}
