package kubelet

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// The names below are those NVIDIA's DRA driver writes (NVIDIA/k8s-dra-driver-gpu, now
// kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin): deviceinfo.go GpuInfo.CanonicalName
// "gpu-%d" of the minor; mig.go MigSpecTuple.ToCanonicalName "gpu-%d-mig-%s-%d-%d" (v25.12+, the profile
// through toRFC1123Compliant without dots; device_state.go quotes "gpu-1-mig-2g47gb-14-0" from a real claim);
// deviceinfo.go MigDeviceInfo.CanonicalName "gpu-%d-mig-%d-%d-%d" of profile ID, placement start and size
// (v25.3.0 to v25.8.1); VfioDeviceInfo.CanonicalName "gpu-vfio-%d".
func TestParseDRADeviceName(t *testing.T) {
	gpu := func(minor int) DeviceRef {
		return DeviceRef{Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: minor}
	}
	mig := func(minor int, p MIGPlacement) DeviceRef {
		r := gpu(minor)
		r.MIG = &p
		return r
	}
	for _, tc := range []struct {
		name string
		want DeviceRef
		kind DRAName
	}{
		{"gpu-0", gpu(0), DRAGPU},
		{"gpu-7", gpu(7), DRAGPU},
		{"gpu-1-mig-2g47gb-14-0", mig(1, MIGPlacement{Profile: "2g47gb", ProfileID: 14, Start: 0}), DRAGPU},
		{"gpu-0-mig-1g10gb-19-6", mig(0, MIGPlacement{Profile: "1g10gb", ProfileID: 19, Start: 6}), DRAGPU},
		{"gpu-3-mig-1g10gb-me-20-4", mig(3, MIGPlacement{Profile: "1g10gb-me", ProfileID: 20, Start: 4}), DRAGPU},
		{"gpu-2-mig-1c3g40gb-9-4", mig(2, MIGPlacement{Profile: "1c3g40gb", ProfileID: 9, Start: 4}), DRAGPU},
		{"gpu-0-mig-19-6-1", mig(0, MIGPlacement{ProfileID: 19, Start: 6, Size: 1}), DRAGPU},
		{"gpu-1-mig-0-0-8", mig(1, MIGPlacement{ProfileID: 0, Start: 0, Size: 8}), DRAGPU},
		{"gpu-vfio-0", gpu(-1), DRAVFIO},
	} {
		got, kind := ParseDRADeviceName(tc.name)
		if kind != tc.kind || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseDRADeviceName(%q) = %+v (MIG %+v), %v; want %+v (MIG %+v), %v", tc.name, got, got.MIG, kind, tc.want, tc.want.MIG, tc.kind)
		}
		if known := kind == DRAGPU; got.Known() != known {
			t.Errorf("%q: Known() = %v", tc.name, got.Known())
		}
	}
	for _, name := range []string{
		"", "gpu", "gpu-", "gpu-x", "gpu--1", "gpu-01", "gpu-1234567", "GPU-0", "gpu-0 ", " gpu-0",
		"gpu-0-mig", "gpu-0-mig-", "gpu-0-mig-19-6", "gpu-0-mig-19-6-0", "gpu-0-mig-1g10gb-19", "gpu-0-mig-1g10gb--6",
		"gpu-0-mig-1g10gb-19-", "gpu-0-mig-19-x-1", "gpu-0-mig-1G10GB-19-6", "gpu-0-mig-1g.10gb-19-6", "gpu-0-mig-g-19-6",
		"gpu-0-mig-1g10gb--19-6", "gpu-x-mig-1g10gb-19-6", "gpu-vfio-", "gpu-vfio-x", "gpu-vfio-01",
		"channel-0", "daemon-3", "mig-1g.10gb-0", "GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60", "0",
	} {
		if got, kind := ParseDRADeviceName(name); kind != DRAUnknown || got.Known() {
			t.Errorf("ParseDRADeviceName(%q) = %+v, %v; want unknown", name, got, kind)
		}
	}
}

// The driver puts nvidia-smi's profile names through ToCanonicalName; DRAProfile must give the same.
func TestDRAProfile(t *testing.T) {
	for in, want := range map[string]string{
		"1g.10gb": "1g10gb", "2g.47gb": "2g47gb", "1g.10gb+me": "1g10gb-me", "1c.3g.40gb": "1c3g40gb",
		"7g.80GB": "7g80gb", "+gfx": "gfx", "": "",
	} {
		if got := DRAProfile(in); got != want {
			t.Errorf("DRAProfile(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzParseDRADeviceName(f *testing.F) {
	for _, s := range []string{"gpu-0", "gpu-1-mig-2g47gb-14-0", "gpu-0-mig-19-6-1", "gpu-vfio-2", "gpu-0-mig-1g10gb-me-20-4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		r, kind := ParseDRADeviceName(name)
		if r.UUID != "" || r.Index >= 0 || r.MIGIndex >= 0 || r.GPUInstance >= 0 || r.ComputeInstance >= 0 {
			t.Errorf("%q: a DRA name set device plugin fields: %+v", name, r)
		}
		if (kind == DRAGPU) != (r.Minor >= 0) {
			t.Errorf("%q: kind %v with minor %d", name, kind, r.Minor)
		}
		if r.MIG != nil && (r.Minor < 0 || r.MIG.ProfileID < 0 || r.MIG.Start < 0 || r.MIG.Size < 0 ||
			r.MIG.Profile == "" && r.MIG.Size == 0 || r.MIG.Profile != "" && r.MIG.Size != 0) {
			t.Errorf("%q: inconsistent MIG placement %+v", name, *r.MIG)
		}
		// What is accepted is a name the driver could have written: rebuilding it gives it back.
		if kind == DRAGPU {
			if got := rebuild(r); got != name {
				t.Errorf("%q parsed as %+v, which the driver would write %q", name, r, got)
			}
		}
	})
}

// rebuild writes a parsed name the way the driver's CanonicalName functions do.
func rebuild(r DeviceRef) string {
	var b strings.Builder
	b.WriteString("gpu-" + strconv.Itoa(r.Minor))
	if m := r.MIG; m != nil {
		if m.Profile != "" {
			b.WriteString("-mig-" + m.Profile + "-" + strconv.Itoa(m.ProfileID) + "-" + strconv.Itoa(m.Start))
		} else {
			b.WriteString("-mig-" + strconv.Itoa(m.ProfileID) + "-" + strconv.Itoa(m.Start) + "-" + strconv.Itoa(m.Size))
		}
	}
	return b.String()
}
