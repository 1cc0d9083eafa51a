package simulated

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// gpuHealthConfig are a GPU's link, health and profiling readings ("Simulated node file" in docs/reference.md). Its
// keys sit on the GPU beside the others. Counters (PCIe and NVLink bytes, violation times) grow from the values in
// the file as the readings go on, like energy_joules: a counter's rate is given, or, for a violation, follows its
// clock event reason.
type gpuHealthConfig struct {
	MemoryReservedBytes       *bytesValue         `yaml:"memory_reserved_bytes"`
	MemoryTemperatureCelsius  *finite             `yaml:"memory_temperature_celsius"`
	PowerManagementLimitWatts *nonNegative        `yaml:"power_management_limit_watts"`
	VGPULicensed              *bool               `yaml:"vgpu_licensed"`
	PCIe                      *pcieConfig         `yaml:"pcie"`
	NVLink                    *nvlinkConfig       `yaml:"nvlink"`
	RemappedRows              *remappedRowsConfig `yaml:"remapped_rows"`
	RetiredPages              *retiredPagesConfig `yaml:"retired_pages"`
	// ClockEventsActive lists the reasons that hold the clocks down now; with the key, the GPU reports every reason
	// (the others inactive), without it none.
	ClockEventsActive *[]clockReason                  `yaml:"clock_events_active"`
	ViolationsSeconds map[violationPolicy]nonNegative `yaml:"violations_seconds"`
	RecoveryAction    *recoveryAction                 `yaml:"recovery_action"`
	Fabric            *fabricConfig                   `yaml:"fabric"`
	Profiling         *profilingConfig                `yaml:"profiling"`
}

type pcieConfig struct {
	Generation       *count       `yaml:"generation"`
	MaxGeneration    *count       `yaml:"max_generation"`
	Width            *count       `yaml:"width"`
	MaxWidth         *count       `yaml:"max_width"`
	Replays          *count       `yaml:"replays"`
	TXBytes          *bytesValue  `yaml:"tx_bytes"`
	RXBytes          *bytesValue  `yaml:"rx_bytes"`
	TXBytesPerSecond *nonNegative `yaml:"tx_bytes_per_second"`
	RXBytesPerSecond *nonNegative `yaml:"rx_bytes_per_second"`
}

type nvlinkConfig struct {
	TXBytes          *bytesValue        `yaml:"tx_bytes"`
	RXBytes          *bytesValue        `yaml:"rx_bytes"`
	TXBytesPerSecond *nonNegative       `yaml:"tx_bytes_per_second"`
	RXBytesPerSecond *nonNegative       `yaml:"rx_bytes_per_second"`
	Links            []nvlinkLinkConfig `yaml:"links"`
}

type nvlinkLinkConfig struct {
	Link           *count `yaml:"link"`
	Active         *bool  `yaml:"active"`
	CRCFlitErrors  *count `yaml:"crc_flit_errors"`
	CRCDataErrors  *count `yaml:"crc_data_errors"`
	ReplayErrors   *count `yaml:"replay_errors"`
	RecoveryErrors *count `yaml:"recovery_errors"`
}

type remappedRowsConfig struct {
	Correctable   *count `yaml:"correctable"`
	Uncorrectable *count `yaml:"uncorrectable"`
	Pending       *bool  `yaml:"pending"`
	Failure       *bool  `yaml:"failure"`
}

type retiredPagesConfig struct {
	SingleBit *count `yaml:"single_bit"`
	DoubleBit *count `yaml:"double_bit"`
	Pending   *bool  `yaml:"pending"`
}

type fabricConfig struct {
	State   fabricState `yaml:"state"`
	Healthy *bool       `yaml:"healthy"`
}

// profilingConfig is what the performance monitor measured on a GPU or a GPU instance.
type profilingConfig struct {
	GraphicsEngineActive   *ratio       `yaml:"graphics_engine_active"`
	SMActive               *ratio       `yaml:"sm_active"`
	SMOccupancy            *ratio       `yaml:"sm_occupancy"`
	TensorActive           *ratio       `yaml:"tensor_active"`
	DRAMActive             *ratio       `yaml:"dram_active"`
	FP64Active             *ratio       `yaml:"fp64_active"`
	FP32Active             *ratio       `yaml:"fp32_active"`
	FP16Active             *ratio       `yaml:"fp16_active"`
	PCIeTXBytesPerSecond   *nonNegative `yaml:"pcie_tx_bytes_per_second"`
	PCIeRXBytesPerSecond   *nonNegative `yaml:"pcie_rx_bytes_per_second"`
	NVLinkTXBytesPerSecond *nonNegative `yaml:"nvlink_tx_bytes_per_second"`
	NVLinkRXBytesPerSecond *nonNegative `yaml:"nvlink_rx_bytes_per_second"`
}

func init() {
	registerSections(pcieConfig{}, nvlinkConfig{}, nvlinkLinkConfig{}, remappedRowsConfig{}, retiredPagesConfig{},
		fabricConfig{}, profilingConfig{})
}

// Validated scalar types of the health keys.

// finite is any number but NaN and the infinities.
type finite float64

func (f *finite) UnmarshalYAML(n *yaml.Node) error {
	var v float64
	if err := n.Decode(&v); err != nil {
		return err
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("line %d: %s is not a finite number", n.Line, n.Value)
	}
	*f = finite(v)
	return nil
}

// count is a whole number of events, links or lanes.
type count uint64

func (c *count) UnmarshalYAML(n *yaml.Node) error {
	var u uint64
	// yaml would truncate 1.5 to 1: a count must be written as a whole number.
	if err := n.Decode(&u); err != nil || n.ShortTag() != "!!int" {
		return fmt.Errorf("line %d: %q is not a count (a whole number, not negative)", n.Line, n.Value)
	}
	*c = count(u)
	return nil
}

type clockReason string

func (r *clockReason) UnmarshalYAML(n *yaml.Node) error {
	if !slices.Contains(gpu.ClockEventReasons, n.Value) {
		return fmt.Errorf("line %d: clock event reason %q is not one of %v", n.Line, n.Value, gpu.ClockEventReasons)
	}
	*r = clockReason(n.Value)
	return nil
}

type violationPolicy string

func (p *violationPolicy) UnmarshalYAML(n *yaml.Node) error {
	if !slices.Contains(gpu.ViolationPolicies, n.Value) {
		return fmt.Errorf("line %d: violation policy %q is not one of %v", n.Line, n.Value, gpu.ViolationPolicies)
	}
	*p = violationPolicy(n.Value)
	return nil
}

// recoveryActions are the names of NVML's GPU recovery actions, by their number.
var recoveryActions = []string{"none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"}

type recoveryAction int

func (a *recoveryAction) UnmarshalYAML(n *yaml.Node) error {
	i := slices.Index(recoveryActions, n.Value)
	if i < 0 {
		return fmt.Errorf("line %d: recovery_action %q is not one of %v", n.Line, n.Value, recoveryActions)
	}
	*a = recoveryAction(i)
	return nil
}

// fabricStates are the names of NVML's fabric registration states, by their number.
var fabricStates = []string{"not_supported", "not_started", "in_progress", "completed"}

type fabricState int

func (s *fabricState) UnmarshalYAML(n *yaml.Node) error {
	i := slices.Index(fabricStates, n.Value)
	if i < 0 {
		return fmt.Errorf("line %d: fabric state %q is not one of %v", n.Line, n.Value, fabricStates)
	}
	*s = fabricState(i)
	return nil
}

// violationReasons are the clock event reasons during which a violation policy's time grows.
var violationReasons = map[violationPolicy][]clockReason{
	"power":                   {"sw_power_cap"},
	"low_utilization":         {"gpu_idle"},
	"thermal":                 {"sw_thermal_slowdown", "hw_thermal_slowdown"},
	"sync_boost":              {"sync_boost"},
	"board_limit":             {"board_limit"},
	"reliability":             {"reliability"},
	"sw_thermal_slowdown":     {"sw_thermal_slowdown"},
	"hw_thermal_slowdown":     {"hw_thermal_slowdown"},
	"hw_power_brake_slowdown": {"hw_power_brake_slowdown"},
}

// validate checks what a single key cannot: values that must agree with each other, as on a real GPU.
func (h *gpuHealthConfig) validate(memoryTotal bytesValue) error {
	if h.MemoryReservedBytes != nil && *h.MemoryReservedBytes > memoryTotal {
		return errors.New("memory_reserved_bytes is more than memory_total_bytes")
	}
	if p := h.PCIe; p != nil {
		if p.Generation != nil && p.MaxGeneration != nil && *p.Generation > *p.MaxGeneration {
			return errors.New("pcie: generation is above max_generation")
		}
		if p.Width != nil && p.MaxWidth != nil && *p.Width > *p.MaxWidth {
			return errors.New("pcie: width is above max_width")
		}
	}
	if l := h.NVLink; l != nil {
		seen := map[count]bool{}
		for j, link := range l.Links {
			if link.Link == nil {
				return fmt.Errorf("nvlink.links[%d].link is required", j)
			}
			if seen[*link.Link] {
				return fmt.Errorf("nvlink.links[%d]: link %d appears twice", j, *link.Link)
			}
			seen[*link.Link] = true
		}
	}
	if h.ClockEventsActive != nil {
		seen := map[clockReason]bool{}
		for _, r := range *h.ClockEventsActive {
			if seen[r] {
				return fmt.Errorf("clock_events_active: %s appears twice", r)
			}
			seen[r] = true
		}
	}
	if f := h.Fabric; f != nil && f.Healthy != nil && *f.Healthy && fabricStates[f.State] != "completed" {
		return fmt.Errorf("fabric: healthy needs state completed, not %s", fabricStates[f.State])
	}
	if f := h.Fabric; f != nil && f.Healthy != nil && fabricStates[f.State] == "not_supported" {
		return errors.New("fabric: a GPU without fabric support has no fabric health")
	}
	if err := h.Profiling.validate(); err != nil {
		return fmt.Errorf("profiling: %w", err)
	}
	if p := h.Profiling; p != nil {
		for _, r := range []struct {
			what             string
			counter, monitor *nonNegative
		}{
			{"pcie.tx_bytes_per_second and profiling.pcie_tx_bytes_per_second", pcieRate(h.PCIe, true), p.PCIeTXBytesPerSecond},
			{"pcie.rx_bytes_per_second and profiling.pcie_rx_bytes_per_second", pcieRate(h.PCIe, false), p.PCIeRXBytesPerSecond},
			{"nvlink.tx_bytes_per_second and profiling.nvlink_tx_bytes_per_second", nvlinkRate(h.NVLink, true), p.NVLinkTXBytesPerSecond},
			{"nvlink.rx_bytes_per_second and profiling.nvlink_rx_bytes_per_second", nvlinkRate(h.NVLink, false), p.NVLinkRXBytesPerSecond},
		} {
			if r.counter != nil && r.monitor != nil && *r.counter != *r.monitor {
				return fmt.Errorf("%s differ: both are the same traffic", r.what)
			}
		}
	}
	return nil
}

func pcieRate(p *pcieConfig, tx bool) *nonNegative {
	switch {
	case p == nil:
		return nil
	case tx:
		return p.TXBytesPerSecond
	}
	return p.RXBytesPerSecond
}

func nvlinkRate(l *nvlinkConfig, tx bool) *nonNegative {
	switch {
	case l == nil:
		return nil
	case tx:
		return l.TXBytesPerSecond
	}
	return l.RXBytesPerSecond
}

// validate holds the ratios to what they measure: SMs are active only while the graphics engine is, warps are
// resident and pipes busy only on active SMs.
func (p *profilingConfig) validate() error {
	if p == nil {
		return nil
	}
	for _, c := range []struct {
		name, bound string
		v, max      *ratio
	}{
		{"sm_active", "graphics_engine_active", p.SMActive, p.GraphicsEngineActive},
		{"sm_occupancy", "sm_active", p.SMOccupancy, p.SMActive},
		{"tensor_active", "sm_active", p.TensorActive, p.SMActive},
		{"fp64_active", "sm_active", p.FP64Active, p.SMActive},
		{"fp32_active", "sm_active", p.FP32Active, p.SMActive},
		{"fp16_active", "sm_active", p.FP16Active, p.SMActive},
	} {
		if c.v != nil && c.max != nil && *c.v > *c.max {
			return fmt.Errorf("%s %v is above %s %v", c.name, *c.v, c.bound, *c.max)
		}
	}
	return nil
}

// apply sets the device's health readings, elapsedSeconds after the file was read. It runs after the memory
// readings are set: reserved memory is not free.
func (h *gpuHealthConfig) apply(d *gpu.Device, elapsedSeconds float64) {
	if h.MemoryReservedBytes != nil {
		d.MemoryReservedBytes = gpu.Known(float64(*h.MemoryReservedBytes))
		d.MemoryFreeBytes = gpu.Known(max(d.MemoryTotalBytes.V-d.MemoryUsedBytes.V-d.MemoryReservedBytes.V, 0))
	}
	d.MemoryTemperatureCelsius = opt(h.MemoryTemperatureCelsius)
	d.PowerManagementLimitWatts = opt(h.PowerManagementLimitWatts)
	d.VGPULicensed = flag(h.VGPULicensed)
	if p := h.PCIe; p != nil {
		d.PCIe = gpu.PCIe{
			Generation: opt(p.Generation), MaxGeneration: opt(p.MaxGeneration),
			Width: opt(p.Width), MaxWidth: opt(p.MaxWidth), Replays: opt(p.Replays),
			TXBytes: growing(p.TXBytes, p.TXBytesPerSecond, elapsedSeconds),
			RXBytes: growing(p.RXBytes, p.RXBytesPerSecond, elapsedSeconds),
		}
	}
	if l := h.NVLink; l != nil {
		d.NVLink.TXBytes = growing(l.TXBytes, l.TXBytesPerSecond, elapsedSeconds)
		d.NVLink.RXBytes = growing(l.RXBytes, l.RXBytesPerSecond, elapsedSeconds)
		for _, link := range l.Links {
			d.NVLink.Links = append(d.NVLink.Links, gpu.NVLinkLink{
				Link: int(*link.Link), Active: flag(link.Active),
				CRCFlitErrors: opt(link.CRCFlitErrors), CRCDataErrors: opt(link.CRCDataErrors),
				ReplayErrors: opt(link.ReplayErrors), RecoveryErrors: opt(link.RecoveryErrors),
			})
		}
		slices.SortFunc(d.NVLink.Links, func(a, b gpu.NVLinkLink) int { return a.Link - b.Link })
	}
	hl := &d.Health
	if r := h.RemappedRows; r != nil {
		hl.CorrectableRemappedRows, hl.UncorrectableRemappedRows = opt(r.Correctable), opt(r.Uncorrectable)
		hl.RemapPending, hl.RemapFailure = flag(r.Pending), flag(r.Failure)
	}
	if r := h.RetiredPages; r != nil {
		hl.RetiredPagesSingleBit, hl.RetiredPagesDoubleBit = opt(r.SingleBit), opt(r.DoubleBit)
		hl.RetirementPending = flag(r.Pending)
	}
	active := map[clockReason]bool{}
	if h.ClockEventsActive != nil {
		for _, r := range *h.ClockEventsActive {
			active[r] = true
		}
		for _, r := range gpu.ClockEventReasons {
			hl.ClockEvents = append(hl.ClockEvents, gpu.ClockEvent{Reason: r, Active: active[clockReason(r)]})
		}
	}
	for _, policy := range gpu.ViolationPolicies {
		base, ok := h.ViolationsSeconds[violationPolicy(policy)]
		if !ok {
			continue
		}
		seconds := float64(base)
		if slices.ContainsFunc(violationReasons[violationPolicy(policy)], func(r clockReason) bool { return active[r] }) {
			seconds += elapsedSeconds
		}
		hl.Violations = append(hl.Violations, gpu.Violation{Policy: policy, Seconds: seconds})
	}
	if h.RecoveryAction != nil {
		hl.RecoveryAction = gpu.Known(float64(*h.RecoveryAction))
	}
	if f := h.Fabric; f != nil {
		hl.FabricState, hl.FabricHealthy = gpu.Known(float64(f.State)), flag(f.Healthy)
	}
	d.Profiling = h.Profiling.profiling()
}

func (p *profilingConfig) profiling() *gpu.Profiling {
	if p == nil {
		return nil
	}
	return &gpu.Profiling{
		GraphicsEngineActive: opt(p.GraphicsEngineActive), SMActive: opt(p.SMActive), SMOccupancy: opt(p.SMOccupancy),
		TensorActive: opt(p.TensorActive), DRAMActive: opt(p.DRAMActive),
		FP64Active: opt(p.FP64Active), FP32Active: opt(p.FP32Active), FP16Active: opt(p.FP16Active),
		PCIeTXBytesPerSecond: opt(p.PCIeTXBytesPerSecond), PCIeRXBytesPerSecond: opt(p.PCIeRXBytesPerSecond),
		NVLinkTXBytesPerSecond: opt(p.NVLinkTXBytesPerSecond), NVLinkRXBytesPerSecond: opt(p.NVLinkRXBytesPerSecond),
	}
}

// validateMIGProfiling allows profiling on one MIG device per GPU instance: it is the GPU instance's, like its
// memory.
func validateMIGProfiling(instances []migConfig) error {
	seen := map[int]bool{}
	for j, m := range instances {
		if m.Profiling == nil {
			continue
		}
		if seen[m.GPUInstance] {
			return fmt.Errorf("mig_instances[%d]: profiling of gpu_instance %d is given twice (it is the GPU instance's)", j, m.GPUInstance)
		}
		seen[m.GPUInstance] = true
		if err := m.Profiling.validate(); err != nil {
			return fmt.Errorf("mig_instances[%d].profiling: %w", j, err)
		}
	}
	return nil
}

// growing is a counter: its value when the file was read, plus its rate times the seconds since. Either may be
// absent (then 0); both absent, the counter is.
func growing[T ~uint64](base *T, rate *nonNegative, elapsedSeconds float64) gpu.Value {
	if base == nil && rate == nil {
		return gpu.Value{}
	}
	var v float64
	if base != nil {
		v = float64(*base)
	}
	if rate != nil {
		v += float64(*rate) * elapsedSeconds
	}
	return gpu.Known(v)
}

// flag is a boolean reading as 0 or 1.
func flag(b *bool) gpu.Value {
	if b == nil {
		return gpu.Value{}
	}
	if *b {
		return gpu.Known(1)
	}
	return gpu.Known(0)
}
