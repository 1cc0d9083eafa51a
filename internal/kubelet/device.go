package kubelet

import (
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// DefaultResources are the extended resources of the GPU device plugins whose device IDs ParseDeviceID reads:
// NVIDIA's (whole GPUs or their shared replicas, and MIG devices), AMD's (ROCm/k8s-device-plugin) and Intel's
// (intel-device-plugins-for-kubernetes, one resource per kernel driver).
var DefaultResources = []string{"nvidia.com/gpu", "nvidia.com/mig-*", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe"}

// DeviceRef is what a device plugin's device ID, or a DRA device name, says about the GPU behind it. They name
// devices in different ways; the collector resolves a DeviceRef against the GPU snapshot, where UUIDs, indices and
// minor numbers are known.
type DeviceRef struct {
	// UUID is a GPU-… or MIG-… UUID; empty for index-style IDs.
	UUID string
	// Index is the GPU index for index-style IDs ("0", "nvidia0", "0:1"); -1 otherwise.
	Index int
	// MIGIndex is the position of the MIG device on GPU Index for index-style MIG IDs ("0:1"); -1 otherwise.
	MIGIndex int
	// GPUInstance and ComputeInstance are set (>= 0) by old-style MIG IDs that carry them
	// (MIG-GPU-<uuid>/<gi>/<ci>, drivers before R470); UUID is then the parent GPU's. -1 otherwise.
	GPUInstance, ComputeInstance int
	// Minor is the GPU's minor number (the N of /dev/nvidiaN) for NVIDIA DRA device names; -1 otherwise.
	Minor int
	// MIG is set for a MIG device of GPU Minor named by its placement (NVIDIA DRA device names); nil otherwise.
	MIG *MIGPlacement
	// PCIBusID is the GPU's PCI address, in the kernel's form (0000:05:00.0), for AMD's device plugin; empty
	// otherwise.
	PCIBusID string
	// DRMCard is the GPU's DRM card (card1), for Intel's device plugin; empty otherwise.
	DRMCard string
}

// Known reports whether the ID named a GPU in a form this package understands.
func (r DeviceRef) Known() bool {
	return r.UUID != "" || r.Index >= 0 || r.Minor >= 0 || r.PCIBusID != "" || r.DRMCard != ""
}

// ParseDeviceID reads a device ID as the kubelet reports it for a GPU resource:
//
//	GPU-<uuid>                 a whole GPU (NVIDIA device plugin, deviceIDStrategy=uuid, the default)
//	GPU-<uuid>::<n>            replica n of a time-sliced or MPS-shared GPU (NVIDIA device plugin sharing)
//	MIG-<uuid>                 a MIG device (nvidia.com/mig-* resources, or nvidia.com/gpu with migStrategy=single)
//	MIG-GPU-<uuid>/<gi>/<ci>   a MIG device as drivers before R470 named it
//	<n>, <n>::<r>              GPU index n (deviceIDStrategy=index)
//	<n>:<m>                    MIG device m of GPU n (deviceIDStrategy=index)
//	nvidia<n>, nvidia<n>/<x>   GPU index n, whole or a shared slice of it (GKE's device plugin)
//	<domain>:<bus>:<dev>.<fn>  the GPU at that PCI address (AMD's device plugin, amd.com/gpu)
//	card<n>-<i>                replica i of the GPU of DRM card n (Intel's device plugin, gpu.intel.com/i915
//	                           and gpu.intel.com/xe; one replica unless -shared-dev-num shares the card)
//
// Anything else is returned with Known() false: AMD's compute partitions (amdgpu_xcp_<n>), which the DRM
// source does not read as GPUs of their own, among them.
func ParseDeviceID(id string) DeviceRef {
	ref := DeviceRef{Index: -1, MIGIndex: -1, GPUInstance: -1, ComputeInstance: -1, Minor: -1}
	id = strings.TrimSpace(id)
	// Sharing replicas name the same GPU; the replica number does not matter for who holds it.
	if base, _, ok := strings.Cut(id, "::"); ok {
		id = base
	}
	switch {
	case strings.HasPrefix(id, "MIG-GPU-"):
		parts := strings.Split(strings.TrimPrefix(id, "MIG-"), "/")
		if len(parts) != 3 {
			return ref
		}
		gi, err1 := strconv.Atoi(parts[1])
		ci, err2 := strconv.Atoi(parts[2])
		if err1 != nil || err2 != nil || gi < 0 || ci < 0 {
			return ref
		}
		ref.UUID, ref.GPUInstance, ref.ComputeInstance = parts[0], gi, ci
	case strings.HasPrefix(id, "GPU-"), strings.HasPrefix(id, "MIG-"):
		ref.UUID = id
	case strings.HasPrefix(id, "nvidia"):
		n, _, _ := strings.Cut(strings.TrimPrefix(id, "nvidia"), "/")
		ref.Index = index(n)
	case strings.HasPrefix(id, "card"):
		card, replica, ok := strings.Cut(id, "-")
		if ok && index(strings.TrimPrefix(card, "card")) >= 0 && index(replica) >= 0 {
			ref.DRMCard = card
		}
	case strings.Count(id, ":") == 2:
		if pci, ok := gpu.ParsePCIBusID(id); ok {
			ref.PCIBusID = pci
		}
	default:
		gpuIdx, mig, isMIG := strings.Cut(id, ":")
		ref.Index = index(gpuIdx)
		if isMIG {
			ref.MIGIndex = index(mig)
			// Both halves name the device, or neither does.
			if ref.MIGIndex < 0 || ref.Index < 0 {
				ref.Index, ref.MIGIndex = -1, -1
			}
		}
	}
	return ref
}

// index parses a non-negative decimal index, -1 when s is not one.
func index(s string) int {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" || len(s) > 6 {
		return -1
	}
	n, _ := strconv.Atoi(s)
	return n
}
