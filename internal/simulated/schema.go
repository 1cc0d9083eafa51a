package simulated

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// The file format is "Simulated node file" in docs/reference.md. Every optional reading is a pointer so that "absent" (the series
// is left out, as for a real N/A) differs from 0.
type nodeConfig struct {
	DriverVersion string      `yaml:"driver_version"`
	CUDAVersion   string      `yaml:"cuda_version"`
	GPUs          []gpuConfig `yaml:"gpus"`
	// Allocations stand in for the kubelet's PodResources answer; nil (the key absent) means "no kubelet",
	// which differs from an empty list.
	Allocations *[]allocationConfig `yaml:"allocations"`
	// Allocatable is how many devices of each GPU resource the stand-in kubelet says it can allocate.
	Allocatable map[string]int `yaml:"allocatable"`
}

// allocationConfig is one container's GPU devices as the kubelet would report them: device plugin device IDs, or,
// with claim, the device names of a DRA ResourceClaim of NVIDIA's driver.
type allocationConfig struct {
	Namespace string       `yaml:"namespace"`
	Pod       string       `yaml:"pod"`
	Container string       `yaml:"container"`
	Resource  string       `yaml:"resource"`
	DeviceIDs []string     `yaml:"device_ids"`
	Claim     *claimConfig `yaml:"claim"`
}

type claimConfig struct {
	Name      string `yaml:"name"`
	Namespace string `yaml:"namespace"` // default: the pod's
	Pool      string `yaml:"pool"`
}

type gpuConfig struct {
	UUID                    string                 `yaml:"uuid"`
	Name                    string                 `yaml:"name"`
	Vendor                  vendor                 `yaml:"vendor"`
	DriverVersion           string                 `yaml:"driver_version"`
	DRMCard                 string                 `yaml:"drm_card"`
	PCIBusID                string                 `yaml:"pci_bus_id"`
	MinorNumber             *int                   `yaml:"minor_number"`
	MIGMode                 migMode                `yaml:"mig_mode"`
	MemoryTotalBytes        *bytesValue            `yaml:"memory_total_bytes"`
	MemoryUsedBytes         *bytesValue            `yaml:"memory_used_bytes"`
	UtilizationRatio        *ratio                 `yaml:"utilization_ratio"`
	MemoryUtilizationRatio  *ratio                 `yaml:"memory_utilization_ratio"`
	EncoderUtilizationRatio *ratio                 `yaml:"encoder_utilization_ratio"`
	DecoderUtilizationRatio *ratio                 `yaml:"decoder_utilization_ratio"`
	TemperatureCelsius      *finite                `yaml:"temperature_celsius"`
	PowerUsageWatts         *nonNegative           `yaml:"power_usage_watts"`
	PowerLimitWatts         *nonNegative           `yaml:"power_limit_watts"`
	EnergyJoules            *nonNegative           `yaml:"energy_joules"`
	FanSpeedRatio           *ratio                 `yaml:"fan_speed_ratio"`
	PerformanceState        *pstate                `yaml:"performance_state"`
	ClocksHertz             map[string]nonNegative `yaml:"clocks_hertz"`
	ECCErrors               map[string]nonNegative `yaml:"ecc_errors"`
	XIDErrors               map[uint64]uint64      `yaml:"xid_errors"`
	MIGInstances            []migConfig            `yaml:"mig_instances"`
	Processes               []processConfig        `yaml:"processes"`
	gpuHealthConfig         `yaml:",inline"`
}

type migConfig struct {
	UUID             string           `yaml:"uuid"`
	GPUInstance      int              `yaml:"gpu_instance"`
	ComputeInstance  int              `yaml:"compute_instance"`
	Profile          string           `yaml:"profile"`
	MemoryTotalBytes *bytesValue      `yaml:"memory_total_bytes"`
	MemoryUsedBytes  *bytesValue      `yaml:"memory_used_bytes"`
	Placement        *placementConfig `yaml:"placement"`
	Profiling        *profilingConfig `yaml:"profiling"`
}

// placementConfig is where a MIG instance's GPU instance sits, by which DRA device names place MIG devices.
type placementConfig struct {
	ProfileID int `yaml:"profile_id"`
	Start     int `yaml:"start"`
	Size      int `yaml:"size"`
}

type processConfig struct {
	PID                     uint32          `yaml:"pid"`
	Name                    string          `yaml:"name"`
	Type                    processType     `yaml:"type"`
	UsedMemoryBytes         *bytesValue     `yaml:"used_memory_bytes"`
	SMUtilizationRatio      *ratio          `yaml:"sm_utilization_ratio"`
	MemoryUtilizationRatio  *ratio          `yaml:"memory_utilization_ratio"`
	EncoderUtilizationRatio *ratio          `yaml:"encoder_utilization_ratio"`
	DecoderUtilizationRatio *ratio          `yaml:"decoder_utilization_ratio"`
	GPUInstance             *int            `yaml:"gpu_instance"`
	ComputeInstance         *int            `yaml:"compute_instance"`
	Identity                *identityConfig `yaml:"identity"`
	// Age is how long the process has run when the node is first read; it ages from there. Nil: not said.
	Age *age `yaml:"age"`
}

// identityConfig presets who owns a process, for demo nodes whose PIDs are not real. Processes without it are
// attributed through procfs and the container runtimes like real ones. Its keys are the identity labels
// (attribution.IdentityLabels, by name) and pod_labels.
type identityConfig struct {
	attribution.Identity
}

// podLabelsKey is the identity's allowlisted pod labels, a mapping of their own.
const podLabelsKey = "pod_labels"

// identityKeys are the keys an identity takes, for the error that names an unknown one.
func identityKeys() []string {
	keys := []string{podLabelsKey}
	for _, l := range attribution.IdentityLabels {
		keys = append(keys, l.Name)
	}
	slices.Sort(keys)
	return keys
}

// UnmarshalYAML reads an identity's keys through attribution.IdentityLabels, so that the file takes every label
// the outputs write, and only those.
func (c *identityConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: identity must be %s", n.Line, kindOfTag("map"))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, value := n.Content[i], n.Content[i+1]
		if key.Value == podLabelsKey {
			if err := value.Decode(&c.PodLabels); err != nil {
				return err
			}
			continue
		}
		j := slices.IndexFunc(attribution.IdentityLabels, func(l attribution.IdentityLabel) bool { return l.Name == key.Value })
		if j < 0 {
			return fmt.Errorf("line %d: unknown key %q (valid keys here: %s)", key.Line, key.Value, strings.Join(identityKeys(), ", "))
		}
		// yaml's own type error, which explain words for the user.
		if err := value.Decode(attribution.IdentityLabels[j].Get(&c.Identity)); err != nil {
			return err
		}
	}
	c.QoS = strings.ToLower(c.QoS)
	return nil
}

// Validated scalar types: each checks its own value so that the error names the line.

type ratio float64

func (r *ratio) UnmarshalYAML(n *yaml.Node) error {
	var f float64
	if err := n.Decode(&f); err != nil {
		return err
	}
	if !(f >= 0 && f <= 1) {
		return fmt.Errorf("line %d: ratio %s is outside 0..1", n.Line, n.Value)
	}
	*r = ratio(f)
	return nil
}

type nonNegative float64

func (v *nonNegative) UnmarshalYAML(n *yaml.Node) error {
	var f float64
	if err := n.Decode(&f); err != nil {
		return err
	}
	if !(f >= 0) || math.IsInf(f, 1) {
		return fmt.Errorf("line %d: %s must be a finite number, not negative", n.Line, n.Value)
	}
	*v = nonNegative(f)
	return nil
}

type bytesValue uint64

func (b *bytesValue) UnmarshalYAML(n *yaml.Node) error {
	var u uint64
	if err := n.Decode(&u); err != nil || n.ShortTag() != "!!int" {
		return fmt.Errorf("line %d: %q is not a byte count (a whole number of bytes)", n.Line, n.Value)
	}
	*b = bytesValue(u)
	return nil
}

type age time.Duration

func (a *age) UnmarshalYAML(n *yaml.Node) error {
	d, err := time.ParseDuration(n.Value)
	if err != nil || d < 0 || n.ShortTag() != "!!str" {
		return fmt.Errorf("line %d: age %q must be a duration, e.g. 3h20m", n.Line, n.Value)
	}
	*a = age(d)
	return nil
}

type pstate int

func (p *pstate) UnmarshalYAML(n *yaml.Node) error {
	var i int
	if err := n.Decode(&i); err != nil || i < 0 || i > 15 {
		return fmt.Errorf("line %d: performance_state %q must be a whole number 0..15", n.Line, n.Value)
	}
	*p = pstate(i)
	return nil
}

type processType string

func (t *processType) UnmarshalYAML(n *yaml.Node) error {
	switch n.Value {
	case gpu.ProcessCompute, gpu.ProcessGraphics, gpu.ProcessComputeAndGraphics, gpu.ProcessMPS:
		*t = processType(n.Value)
		return nil
	}
	return fmt.Errorf("line %d: process type %q must be compute, graphics, compute+graphics or mps", n.Line, n.Value)
}

type migMode gpu.MIGMode

func (m *migMode) UnmarshalYAML(n *yaml.Node) error {
	switch v := gpu.MIGMode(n.Value); v {
	case gpu.MIGEnabled, gpu.MIGDisabled, gpu.MIGUnsupported:
		*m = migMode(v)
		return nil
	}
	return fmt.Errorf("line %d: mig_mode %q must be enabled or disabled", n.Line, n.Value)
}

// vendor is a GPU's vendor; empty is NVIDIA's, as every node file before vendors were named.
type vendor string

func (v *vendor) UnmarshalYAML(n *yaml.Node) error {
	switch n.Value {
	case gpu.VendorNVIDIA, gpu.VendorAMD, gpu.VendorIntel:
		*v = vendor(n.Value)
		return nil
	}
	return fmt.Errorf("line %d: vendor %q must be nvidia, amd or intel", n.Line, n.Value)
}
