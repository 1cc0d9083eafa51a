package main

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
)

// Under auto, an NVIDIA driver that fails (a driver/library mismatch, no permission on /dev/nvidia*) does not keep
// the node's AMD and Intel GPUs from being read: they are served, numbered after the NVIDIA GPUs that sysfs shows,
// and every reading says why the NVIDIA GPUs are missing, as a mixed node does when NVML fails after the start.
func TestAutoReadsDRMGPUsWhenTheNVIDIADriverFails(t *testing.T) {
	node := drmfake.NewMI300X().Node(false)
	node.GPUs, node.Processes = node.GPUs[:1], nil
	node.OtherCards = map[int][2]string{20: {"nvidia", "0000:01:00.0"}}
	sysfs, procfs, err := node.Write(t.TempDir())
	if errors.Is(err, drmfake.ErrNeedsRoot) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	f := &sourceFlags{source: "auto", sysfs: sysfs}
	broken := errors.New("Driver/library version mismatch")
	src, err := f.auto(slog.New(slog.DiscardHandler), procfs, nil, nil, false, broken)
	if err != nil {
		t.Fatalf("auto with a failing NVIDIA driver next to an AMD GPU: %v; want the AMD GPU served", err)
	}
	t.Cleanup(func() { _ = src.Close() })
	if src.Name() != "nvml+drm" {
		t.Errorf("source %q, want nvml+drm", src.Name())
	}
	snap, err := src.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Devices) != 1 || snap.Devices[0].Vendor != gpu.VendorAMD || snap.Devices[0].Index != 1 {
		t.Errorf("devices %+v, want the MI300X as GPU 1, after the NVIDIA GPU sysfs shows", snap.Devices)
	}
	found := false
	for _, e := range snap.Errors {
		found = found || e.Operation == gpu.OpDevice && errors.Is(e.Err, broken) && strings.Contains(e.Err.Error(), "NVIDIA")
	}
	if !found {
		t.Errorf("errors %v, want the NVIDIA driver's failure as a device error", snap.Errors)
	}
}

// Without an NVIDIA driver, or without AMD and Intel GPUs, nothing changes: the DRM source alone, or the NVIDIA
// source's own error.
func TestAutoWithOneVendor(t *testing.T) {
	f := &sourceFlags{source: "auto", sysfs: t.TempDir()}
	broken := errors.New("Driver/library version mismatch")
	if _, err := f.auto(slog.New(slog.DiscardHandler), t.TempDir(), nil, nil, false, broken); !errors.Is(err, broken) {
		t.Errorf("a failing NVIDIA driver on a node without DRM GPUs: %v, want its error", err)
	}
}
