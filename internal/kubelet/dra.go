package kubelet

import "strings"

// NVIDIADRADriver is the DRA driver name of NVIDIA's GPU driver (k8s-dra-driver-gpu, now
// kubernetes-sigs/dra-driver-nvidia-gpu: cmd/gpu-kubelet-plugin/main.go, DriverName). Its claims are the GPU
// allocations of a DRA node; devices of other drivers are not GPUs this exporter can name.
const NVIDIADRADriver = "gpu.nvidia.com"

// MIGPlacement names a MIG device by where it sits on its GPU, the way NVIDIA's DRA driver names MIG devices:
// a GPU instance profile and the first memory slice of the placement.
type MIGPlacement struct {
	// Profile is the profile as the driver's name carries it: nvidia-smi's profile name lower-cased, dots removed,
	// other characters outside [a-z0-9-] turned into '-' ("1g.10gb" → "1g10gb", "1g.10gb+me" → "1g10gb-me").
	// Empty in the names of driver releases before v25.12, which carry the profile ID only.
	Profile   string
	ProfileID int // GPU instance profile ID (nvidia-smi mig -lgip)
	Start     int // the placement's first memory slice
	Size      int // memory slices of the placement; 0 when the name does not say (v25.12 and later)
}

// DRAName sorts a gpu.nvidia.com device name into what this package does with it.
type DRAName int

const (
	DRAUnknown DRAName = iota // a name of no form below: ignored, never guessed
	DRAGPU                    // a whole GPU, or a MIG device, that NVML sees
	DRAVFIO                   // a GPU passed through to a VM (vfio-pci): NVML does not see it
)

// ParseDRADeviceName reads a device name of NVIDIA's DRA driver for GPUs (gpu.nvidia.com). The driver names
// devices by the GPU's minor number, the N of /dev/nvidiaN, which is not always NVML's index
// (cmd/gpu-kubelet-plugin/deviceinfo.go and mig.go, the CanonicalName functions; the minor replaced the index in
// v25.3.0, commit 85eff3b3 "Use device minor as suffix in device name instead of the index"):
//
//	gpu-<minor>                                          a whole GPU, also when the claim shares it through
//	                                                     time-slicing or MPS (sharing is claim configuration,
//	                                                     not a device of its own)
//	gpu-<minor>-mig-<profile>-<profileID>-<start>        a MIG device, v25.12 and later (MigSpecTuple.ToCanonicalName),
//	                                                     e.g. gpu-1-mig-2g47gb-14-0
//	gpu-<minor>-mig-<profileID>-<start>-<size>           a MIG device, v25.3 to v25.8 (MigDeviceInfo.CanonicalName)
//	gpu-vfio-<index>                                     a GPU passed through to a VM, v25.12 and later
//
// The returned DeviceRef has Minor set (and MIG for MIG devices) for DRAGPU, and is unknown otherwise.
func ParseDRADeviceName(name string) (DeviceRef, DRAName) {
	ref := DeviceRef{Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}
	rest, ok := strings.CutPrefix(name, "gpu-")
	if !ok {
		return ref, DRAUnknown
	}
	if n, ok := strings.CutPrefix(rest, "vfio-"); ok {
		if number(n) < 0 {
			return ref, DRAUnknown
		}
		return ref, DRAVFIO
	}
	minor, mig, isMIG := strings.Cut(rest, "-mig-")
	if number(minor) < 0 {
		return ref, DRAUnknown
	}
	if !isMIG {
		ref.Minor = number(minor)
		return ref, DRAGPU
	}
	parts := strings.Split(mig, "-")
	var p MIGPlacement
	switch n := len(parts); {
	case n == 3 && number(parts[0]) >= 0:
		// v25.3 to v25.8: three numbers. A profile always has a letter, so this cannot be the newer form.
		p = MIGPlacement{ProfileID: number(parts[0]), Start: number(parts[1]), Size: number(parts[2])}
		if p.Size <= 0 {
			return ref, DRAUnknown
		}
	case n >= 3:
		p = MIGPlacement{Profile: strings.Join(parts[:n-2], "-"), ProfileID: number(parts[n-2]), Start: number(parts[n-1])}
		if !validProfile(p.Profile) {
			return ref, DRAUnknown
		}
	default:
		return ref, DRAUnknown
	}
	if p.ProfileID < 0 || p.Start < 0 {
		return ref, DRAUnknown
	}
	ref.Minor, ref.MIG = number(minor), &p
	return ref, DRAGPU
}

// validProfile reports whether s is a MIG profile as the driver writes it into a name: it names the slices
// ("1g10gb", "1c2g20gb", "1g10gb-me"), so it starts with a digit and has a letter; all-digit fields are the
// numbers of the older form.
func validProfile(s string) bool {
	if s == "" || s[0] < '0' || s[0] > '9' || strings.HasSuffix(s, "-") || strings.Trim(s, "0123456789-") == "" {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == ""
}

// DRAProfile turns a MIG profile name as NVML and nvidia-smi print it ("1g.10gb", "1g.10gb+me") into the form
// the DRA driver puts into device names: lower case, no dots, other characters outside [a-z0-9-] as '-', no '-'
// at either end (mig.go, ToCanonicalName and toRFC1123Compliant).
func DRAProfile(profile string) string {
	s := strings.ToLower(strings.ReplaceAll(profile, ".", ""))
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, s)
	return strings.Trim(s, "-")
}

// number parses a decimal number as the driver prints one (%d: no sign, no leading zeros), -1 when s is not one.
func number(s string) int {
	if len(s) > 1 && s[0] == '0' {
		return -1
	}
	return index(s)
}
