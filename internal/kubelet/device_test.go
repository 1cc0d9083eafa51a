package kubelet

import (
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

func TestParseDeviceID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want DeviceRef
	}{
		{"GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60", DeviceRef{UUID: "GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60", Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60::7", DeviceRef{UUID: "GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60", Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"MIG-0c7a4d3e-1b2c-5d6e-8f90-a1b2c3d4e5f6", DeviceRef{UUID: "MIG-0c7a4d3e-1b2c-5d6e-8f90-a1b2c3d4e5f6", Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"MIG-0c7a4d3e-1b2c-5d6e-8f90-a1b2c3d4e5f6::1", DeviceRef{UUID: "MIG-0c7a4d3e-1b2c-5d6e-8f90-a1b2c3d4e5f6", Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"MIG-GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60/7/0", DeviceRef{UUID: "GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60", Index: -1, MIGIndex: -1, GPUInstance: 7, ComputeInstance: 0, Minor: -1}},
		{"0", DeviceRef{Index: 0, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"3::2", DeviceRef{Index: 3, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"1:2", DeviceRef{Index: 1, MIGIndex: 2, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"nvidia2", DeviceRef{Index: 2, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"nvidia0/vgpu3", DeviceRef{Index: 0, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		// AMD's device plugin: the PCI address, in the kernel's form whatever the case.
		{"0000:26:00.0", DeviceRef{PCIBusID: "0000:26:00.0", Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"0000:C6:00.0", DeviceRef{PCIBusID: "0000:c6:00.0", Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		// Intel's: the DRM card and a replica of it.
		{"card1-0", DeviceRef{DRMCard: "card1", Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
		{"card12-3", DeviceRef{DRMCard: "card12", Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}},
	} {
		if got := ParseDeviceID(tc.id); got != tc.want || !got.Known() {
			t.Errorf("ParseDeviceID(%q) = %+v, want %+v", tc.id, got, tc.want)
		}
	}
	for _, id := range []string{"", "fpga0", "-1", "1:x", "x:1", "nvidia", "nvidiax", "MIG-GPU-abc/1", "MIG-GPU-abc/x/0", "99999999", "::1",
		"amdgpu_xcp_30", "0000:26:00", "0000:26:00.8", "1:2:3", "card", "card1", "card-0", "cardx-0", "card1-", "card1-x", "all"} {
		if got := ParseDeviceID(id); got.Known() {
			t.Errorf("ParseDeviceID(%q) = %+v, want unknown", id, got)
		}
	}
}

func FuzzParseDeviceID(f *testing.F) {
	for _, s := range []string{"GPU-a::1", "MIG-GPU-a/1/2", "0:1", "nvidia0/vgpu1", "0000:26:00.0", "card1-0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		r := ParseDeviceID(id)
		if r.MIGIndex >= 0 && r.Index < 0 {
			t.Errorf("%q: MIG index without a GPU index: %+v", id, r)
		}
		if r.UUID != "" && r.Index >= 0 {
			t.Errorf("%q: both UUID and index: %+v", id, r)
		}
		names := 0
		for _, named := range []bool{r.UUID != "", r.Index >= 0, r.Minor >= 0, r.PCIBusID != "", r.DRMCard != ""} {
			if named {
				names++
			}
		}
		if names > 1 {
			t.Errorf("%q: names a GPU in more than one way: %+v", id, r)
		}
		if r.PCIBusID != "" {
			if pci, ok := gpu.ParsePCIBusID(r.PCIBusID); !ok || pci != r.PCIBusID {
				t.Errorf("%q: PCI address %q is not in the kernel's form", id, r.PCIBusID)
			}
		}
	})
}
