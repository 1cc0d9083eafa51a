package simulated

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"

	"go.yaml.in/yaml/v3"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
)

var uuidPattern = regexp.MustCompile(`^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// The UUIDs of the GPUs the DRM source reads: amdgpu's 64-bit unique ID, or the PCI address where the driver
// publishes none (Intel's).
var (
	amdUUIDPattern = regexp.MustCompile(`^GPU-[0-9a-f]{16}$`)
	drmCardPattern = regexp.MustCompile(`^card[0-9]{1,6}$`)
)

// validateIdentity checks a GPU's UUID in its vendor's form, and that only the GPUs the DRM source reads (AMD's
// and Intel's) have a DRM card, by which Intel's device plugin names them.
func validateIdentity(g gpuConfig) error {
	switch g.Vendor {
	case gpu.VendorAMD:
		if !amdUUIDPattern.MatchString(g.UUID) && g.UUID != "PCI-"+g.PCIBusID {
			return fmt.Errorf("uuid: %q is not an AMD GPU's UUID (GPU- and 16 hex digits of amdgpu's unique_id, or PCI-<pci_bus_id>)", g.UUID)
		}
	case gpu.VendorIntel:
		if g.UUID != "PCI-"+g.PCIBusID {
			return fmt.Errorf("uuid: %q is not an Intel GPU's UUID (PCI-<pci_bus_id>)", g.UUID)
		}
	default:
		if !uuidPattern.MatchString(g.UUID) {
			return fmt.Errorf("uuid: %q is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", g.UUID)
		}
		if g.DRMCard != "" {
			return errors.New("drm_card: only AMD's and Intel's GPUs are read as DRM cards")
		}
	}
	if g.DRMCard != "" && !drmCardPattern.MatchString(g.DRMCard) {
		return fmt.Errorf("drm_card: %q is not a DRM card (card<N>)", g.DRMCard)
	}
	if g.Vendor == gpu.VendorAMD || g.Vendor == gpu.VendorIntel {
		if _, ok := gpu.ParsePCIBusID(g.PCIBusID); !ok {
			return fmt.Errorf("pci_bus_id: %q is required for an AMD or Intel GPU, as domain:bus:device.function", g.PCIBusID)
		}
	}
	return nil
}

// parse reads a node file strictly: unknown keys, wrong types and out-of-range values are errors that name the key
// or value and its line.
func parse(data []byte) (*nodeConfig, error) {
	if err := checkExpansion(data); err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var cfg nodeConfig
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the file is empty")
		}
		return nil, explain(err)
	}
	if err := validate(&cfg); err != nil {
		return nil, err
	}
	return &cfg, nil
}

func validate(cfg *nodeConfig) error {
	if len(cfg.GPUs) == 0 {
		return errors.New("gpus: at least one GPU is required")
	}
	if cfg.Allocations != nil {
		for i, a := range *cfg.Allocations {
			if a.Namespace == "" || a.Pod == "" || a.Container == "" || len(a.DeviceIDs) == 0 {
				return fmt.Errorf("allocations[%d]: namespace, pod, container and device_ids are required", i)
			}
			if err := validateClaim(a); err != nil {
				return fmt.Errorf("allocations[%d]: %w", i, err)
			}
		}
	}
	for r, n := range cfg.Allocatable {
		if cfg.Allocations == nil {
			return errors.New("allocatable: needs allocations, the kubelet whose devices it counts")
		}
		if n < 0 {
			return fmt.Errorf("allocatable: %s has %d devices", r, n)
		}
	}
	uuids, minors := map[string]bool{}, map[int]bool{}
	for i, g := range cfg.GPUs {
		minor := i
		if g.MinorNumber != nil {
			minor = *g.MinorNumber
		}
		if minor < 0 || minors[minor] {
			return fmt.Errorf("gpus[%d].minor_number: %d is negative or another GPU's", i, minor)
		}
		minors[minor] = true
		if err := validateIdentity(g); err != nil {
			return fmt.Errorf("gpus[%d].%w", i, err)
		}
		if uuids[g.UUID] {
			return fmt.Errorf("gpus[%d].uuid: %s appears twice", i, g.UUID)
		}
		uuids[g.UUID] = true
		if g.MemoryTotalBytes == nil {
			return fmt.Errorf("gpus[%d].memory_total_bytes is required", i)
		}
		if err := g.gpuHealthConfig.validate(*g.MemoryTotalBytes); err != nil {
			return fmt.Errorf("gpus[%d]: %w", i, err)
		}
		if err := validateMIGProfiling(g.MIGInstances); err != nil {
			return fmt.Errorf("gpus[%d].%w", i, err)
		}
		if len(g.MIGInstances) > 0 && gpu.MIGMode(g.MIGMode) != gpu.MIGEnabled {
			return fmt.Errorf("gpus[%d]: mig_instances need mig_mode: enabled", i)
		}
		for clock := range g.ClocksHertz {
			switch clock {
			case "graphics", "sm", "memory", "video":
			default:
				return fmt.Errorf("gpus[%d].clocks_hertz: unknown clock %q (graphics, sm, memory, video)", i, clock)
			}
		}
		for typ := range g.ECCErrors {
			if typ != "corrected" && typ != "uncorrected" {
				return fmt.Errorf("gpus[%d].ecc_errors: unknown type %q (corrected, uncorrected)", i, typ)
			}
		}
		instances := map[[2]int]bool{}
		for j, m := range g.MIGInstances {
			key := [2]int{m.GPUInstance, m.ComputeInstance}
			if instances[key] {
				return fmt.Errorf("gpus[%d].mig_instances[%d]: gpu_instance %d, compute_instance %d appears twice",
					i, j, m.GPUInstance, m.ComputeInstance)
			}
			instances[key] = true
			if p := m.Placement; p != nil && (p.ProfileID < 0 || p.Start < 0 || p.Size <= 0) {
				return fmt.Errorf("gpus[%d].mig_instances[%d].placement: profile_id and start must not be negative, size must be positive", i, j)
			}
		}
		pids := map[uint32]bool{}
		for j, p := range g.Processes {
			where := fmt.Sprintf("gpus[%d].processes[%d]", i, j)
			if p.PID == 0 {
				return fmt.Errorf("%s.pid is required", where)
			}
			if pids[p.PID] {
				return fmt.Errorf("%s: pid %d appears twice on this GPU", where, p.PID)
			}
			pids[p.PID] = true
			if p.Type == "" {
				return fmt.Errorf("%s.type is required (compute, graphics, compute+graphics or mps)", where)
			}
			if (p.GPUInstance == nil) != (p.ComputeInstance == nil) {
				return fmt.Errorf("%s: gpu_instance and compute_instance go together", where)
			}
			if p.GPUInstance != nil && !instances[[2]int{*p.GPUInstance, *p.ComputeInstance}] {
				return fmt.Errorf("%s: no mig_instances entry has gpu_instance %d and compute_instance %d",
					where, *p.GPUInstance, *p.ComputeInstance)
			}
		}
	}
	return nil
}

// validateClaim checks a DRA allocation: NVIDIA's driver, and device names of its forms (others would be ignored
// by a real node, so a file listing them is a mistake).
func validateClaim(a allocationConfig) error {
	if a.Claim == nil {
		return nil
	}
	if a.Claim.Name == "" {
		return errors.New("claim.name is required")
	}
	if a.Resource != "" && a.Resource != kubelet.NVIDIADRADriver {
		return fmt.Errorf("resource %q: a claim's resource is its DRA driver, %s", a.Resource, kubelet.NVIDIADRADriver)
	}
	for _, name := range a.DeviceIDs {
		if _, kind := kubelet.ParseDRADeviceName(name); kind != kubelet.DRAGPU {
			return fmt.Errorf("device_ids: %q is not a %s GPU device name (gpu-<minor>, gpu-<minor>-mig-<profile>-<profile id>-<start>)",
				name, kubelet.NVIDIADRADriver)
		}
	}
	return nil
}

// MaxExpandedBytes bounds a node file with its YAML aliases expanded, as the exporter holds it: an alias repeats
// what its anchor holds, so that a 3 MB file whose thousand GPUs alias one 3 MB name stands for 3 GB. Twice
// MaxFileBytes is room for a file of a thousand GPUs that shares its processes or health readings through aliases.
const MaxExpandedBytes = 2 * MaxFileBytes

// nodeOverhead is what one YAML node counts for besides its text, so that many aliases of an empty value count too.
const nodeOverhead = 16

// checkExpansion refuses a file whose values, aliases expanded, take more than MaxExpandedBytes. It walks the
// parsed nodes once, each anchor's size counted once and added at each of its aliases, and stops at the bound.
// A file that does not parse is left to the decoding that follows, which says where.
func checkExpansion(data []byte) error {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return nil
	}
	sizes := map[*yaml.Node]int64{}
	var size func(n *yaml.Node) int64
	size = func(n *yaml.Node) int64 {
		if s, ok := sizes[n]; ok {
			return s
		}
		sizes[n] = MaxExpandedBytes + 1 // while it is being measured: an anchor aliased inside itself has no end
		s := int64(nodeOverhead + len(n.Value))
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			s += size(n.Alias)
		}
		for _, c := range n.Content {
			if s += size(c); s > MaxExpandedBytes {
				break
			}
		}
		sizes[n] = s
		return s
	}
	if s := size(&root); s > MaxExpandedBytes {
		return fmt.Errorf("the file's values take more than %d MiB with its YAML aliases expanded (an alias repeats "+
			"what its anchor holds): write the values out, or alias less", MaxExpandedBytes>>20)
	}
	return nil
}
