package simulated

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
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
	PCIBusID                string                 `yaml:"pci_bus_id"`
	MinorNumber             *int                   `yaml:"minor_number"`
	MIGMode                 migMode                `yaml:"mig_mode"`
	MemoryTotalBytes        *bytesValue            `yaml:"memory_total_bytes"`
	MemoryUsedBytes         *bytesValue            `yaml:"memory_used_bytes"`
	UtilizationRatio        *ratio                 `yaml:"utilization_ratio"`
	MemoryUtilizationRatio  *ratio                 `yaml:"memory_utilization_ratio"`
	EncoderUtilizationRatio *ratio                 `yaml:"encoder_utilization_ratio"`
	DecoderUtilizationRatio *ratio                 `yaml:"decoder_utilization_ratio"`
	TemperatureCelsius      *float64               `yaml:"temperature_celsius"`
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
}

type migConfig struct {
	UUID             string           `yaml:"uuid"`
	GPUInstance      int              `yaml:"gpu_instance"`
	ComputeInstance  int              `yaml:"compute_instance"`
	Profile          string           `yaml:"profile"`
	MemoryTotalBytes *bytesValue      `yaml:"memory_total_bytes"`
	MemoryUsedBytes  *bytesValue      `yaml:"memory_used_bytes"`
	Placement        *placementConfig `yaml:"placement"`
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
}

// identityConfig presets who owns a process, for demo nodes whose PIDs are not real. Processes without it are
// attributed through procfs and the container runtimes like real ones.
type identityConfig struct {
	Namespace   string            `yaml:"namespace"`
	Pod         string            `yaml:"pod"`
	Container   string            `yaml:"container"`
	PodUID      string            `yaml:"pod_uid"`
	ContainerID string            `yaml:"container_id"`
	Runtime     string            `yaml:"runtime"`
	QoS         string            `yaml:"qos"`
	SlurmJobID  string            `yaml:"slurm_job_id"`
	SystemdUnit string            `yaml:"systemd_unit"`
	User        string            `yaml:"user"` // the process owner, shown with --collector.process-user
	PodLabels   map[string]string `yaml:"pod_labels"`
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
	if !(f >= 0) {
		return fmt.Errorf("line %d: %s must not be negative", n.Line, n.Value)
	}
	*v = nonNegative(f)
	return nil
}

type bytesValue uint64

func (b *bytesValue) UnmarshalYAML(n *yaml.Node) error {
	var u uint64
	if err := n.Decode(&u); err != nil {
		return fmt.Errorf("line %d: %q is not a byte count (a whole number of bytes)", n.Line, n.Value)
	}
	*b = bytesValue(u)
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

var uuidPattern = regexp.MustCompile(`^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// parse reads a node file strictly: unknown keys, wrong types and out-of-range values are errors that name the key
// or value and its line.
func parse(data []byte) (*nodeConfig, error) {
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
		if !uuidPattern.MatchString(g.UUID) {
			return fmt.Errorf("gpus[%d].uuid: %q is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", i, g.UUID)
		}
		if uuids[g.UUID] {
			return fmt.Errorf("gpus[%d].uuid: %s appears twice", i, g.UUID)
		}
		uuids[g.UUID] = true
		if g.MemoryTotalBytes == nil {
			return fmt.Errorf("gpus[%d].memory_total_bytes is required", i)
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

// snapshot turns the configuration into the readings it describes. Energy grows with power draw since the file
// was loaded, so that rate() over the counter shows the configured power.
func (cfg *nodeConfig) snapshot(elapsedSeconds float64) *gpu.Snapshot {
	snap := &gpu.Snapshot{
		DriverVersion: cfg.DriverVersion,
		CUDAVersion:   cfg.CUDAVersion,
		Simulated:     true,
		Devices:       make([]gpu.Device, 0, len(cfg.GPUs)),
	}
	for i, g := range cfg.GPUs {
		d := gpu.Device{
			Index:                   i,
			UUID:                    g.UUID,
			Name:                    g.Name,
			PCIBusID:                g.PCIBusID,
			MinorNumber:             gpu.Known(float64(i)),
			MIGMode:                 gpu.MIGMode(g.MIGMode),
			MemoryTotalBytes:        gpu.Known(float64(*g.MemoryTotalBytes)),
			UtilizationRatio:        opt(g.UtilizationRatio),
			MemoryUtilizationRatio:  opt(g.MemoryUtilizationRatio),
			EncoderUtilizationRatio: opt(g.EncoderUtilizationRatio),
			DecoderUtilizationRatio: opt(g.DecoderUtilizationRatio),
			TemperatureCelsius:      opt(g.TemperatureCelsius),
			PowerUsageWatts:         opt(g.PowerUsageWatts),
			PowerLimitWatts:         opt(g.PowerLimitWatts),
			FanSpeedRatio:           opt(g.FanSpeedRatio),
			ProcessesListed:         true,
		}
		if g.MinorNumber != nil {
			d.MinorNumber = gpu.Known(float64(*g.MinorNumber))
		}
		if d.PCIBusID == "" {
			d.PCIBusID = fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10)
		}
		if g.PerformanceState != nil {
			d.PerformanceState = gpu.Known(float64(*g.PerformanceState))
		}
		if g.EnergyJoules != nil || g.PowerUsageWatts != nil {
			var base, watts float64
			if g.EnergyJoules != nil {
				base = float64(*g.EnergyJoules)
			}
			if g.PowerUsageWatts != nil {
				watts = float64(*g.PowerUsageWatts)
			}
			d.EnergyJoules = gpu.Known(base + watts*elapsedSeconds)
		}
		for _, name := range slices.Sorted(maps.Keys(g.ClocksHertz)) {
			d.Clocks = append(d.Clocks, gpu.Clock{Name: name, Hertz: float64(g.ClocksHertz[name])})
		}
		for _, typ := range slices.Sorted(maps.Keys(g.ECCErrors)) {
			d.ECCErrors = append(d.ECCErrors, gpu.ECCCount{Type: typ, Count: float64(g.ECCErrors[typ])})
		}
		for _, xid := range slices.Sorted(maps.Keys(g.XIDErrors)) {
			d.XIDErrors = append(d.XIDErrors, gpu.XIDCount{XID: xid, Count: g.XIDErrors[xid]})
		}
		for _, m := range g.MIGInstances {
			inst := gpu.MIGInstance{
				UUID:             m.UUID,
				GPUInstance:      m.GPUInstance,
				ComputeInstance:  m.ComputeInstance,
				Profile:          m.Profile,
				MemoryTotalBytes: opt(m.MemoryTotalBytes),
				MemoryUsedBytes:  opt(m.MemoryUsedBytes),
			}
			if p := m.Placement; p != nil {
				inst.Placement = &gpu.MIGPlacement{ProfileID: p.ProfileID, Start: p.Start, Size: p.Size}
			}
			d.MIG = append(d.MIG, inst)
		}
		var processMemory float64
		for _, p := range g.Processes {
			proc := gpu.Process{
				PID:                     p.PID,
				Name:                    p.Name,
				Type:                    string(p.Type),
				UsedMemoryBytes:         opt(p.UsedMemoryBytes),
				SMUtilizationRatio:      opt(p.SMUtilizationRatio),
				MemoryUtilizationRatio:  opt(p.MemoryUtilizationRatio),
				EncoderUtilizationRatio: opt(p.EncoderUtilizationRatio),
				DecoderUtilizationRatio: opt(p.DecoderUtilizationRatio),
			}
			if p.GPUInstance != nil {
				proc.MIG, proc.GPUInstance, proc.ComputeInstance = true, *p.GPUInstance, *p.ComputeInstance
			}
			processMemory += proc.UsedMemoryBytes.V
			d.Processes = append(d.Processes, proc)
		}
		used := processMemory
		if g.MemoryUsedBytes != nil {
			used = float64(*g.MemoryUsedBytes)
		}
		d.MemoryUsedBytes = gpu.Known(used)
		d.MemoryFreeBytes = gpu.Known(max(d.MemoryTotalBytes.V-used, 0))
		snap.Devices = append(snap.Devices, d)
	}
	return snap
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

func (c *identityConfig) identity() attribution.Identity {
	return attribution.Identity{
		Namespace: c.Namespace, Pod: c.Pod, Container: c.Container, PodUID: c.PodUID,
		ContainerID: c.ContainerID, Runtime: c.Runtime, QoS: strings.ToLower(c.QoS),
		SlurmJobID: c.SlurmJobID, SystemdUnit: c.SystemdUnit, User: c.User, PodLabels: c.PodLabels,
	}
}

// opt turns an optional file value into a reading: absent in the file, absent in the metrics.
func opt[T ~float64 | ~uint64](p *T) gpu.Value {
	if p == nil {
		return gpu.Value{}
	}
	return gpu.Known(float64(*p))
}
