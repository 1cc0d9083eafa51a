package view

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// CriticalXIDs are the XIDs that point at the hardware, its memory or its links: those of the GPUXIDCritical alert
// of deploy/prometheus/rules.yml.
var CriticalXIDs = []uint64{48, 63, 64, 74, 79, 92, 94, 95}

// Busy is the utilization above which a PCIe link below its maximum generation is degraded: an idle GPU lowers its
// generation to save power (GPUPCIeLinkDegraded).
const Busy = 0.5

// The clock event reasons that hold a GPU down for heat, for a power brake and at its power cap.
var (
	ThermalReasons    = []string{"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"}
	PowerBrakeReasons = []string{"hw_power_brake_slowdown"}
	PowerCapReasons   = []string{"sw_power_cap"}
)

// Health is what a GPU's health is read from: the families of the health alerts, from a node's reading
// (HealthOf) or from Prometheus (internal/cluster). An absent value says nothing is wrong with it.
type Health struct {
	// RecoveryAction is gpu_recovery_action: 1 a GPU reset, 2 a node reboot, 3 drain peer-to-peer, 4 both.
	RecoveryAction gpu.Value
	// RemapFailure, RemapPending and RetirementPending are 1 when true.
	RemapFailure, RemapPending, RetirementPending gpu.Value
	// XIDs are the critical XIDs seen since the exporter started.
	XIDs []uint64
	// ClockEvents are the reasons that hold the clocks down now.
	ClockEvents []string
	// The PCIe link now and at best; the generation matters only while the GPU is Busy.
	PCIeWidth, PCIeMaxWidth, PCIeGeneration, PCIeMaxGeneration gpu.Value
	Utilization                                                gpu.Value
	// NVLinksDown of NVLinks are down.
	NVLinksDown, NVLinks int
	// FabricState is 1 not started, 2 in progress, 3 completed; FabricHealthy 1 or 0.
	FabricState, FabricHealthy gpu.Value
}

// HealthOf reads a node's GPU, each value as its family bounds it (internal/families): a driver's "not available"
// says nothing is wrong, as its absent series does in the cluster's view.
func HealthOf(d *gpu.Device) Health {
	h := Health{
		RecoveryAction:    families.RecoveryAction.Known(d.Health.RecoveryAction),
		RemapFailure:      families.RowRemapFailure.Known(d.Health.RemapFailure),
		RemapPending:      families.RowRemapPending.Known(d.Health.RemapPending),
		RetirementPending: families.RetiredPagesPending.Known(d.Health.RetirementPending),
		PCIeWidth:         families.PCIeLinkWidth.Known(d.PCIe.Width),
		PCIeMaxWidth:      families.PCIeLinkMaxWidth.Known(d.PCIe.MaxWidth),
		PCIeGeneration:    families.PCIeLinkGeneration.Known(d.PCIe.Generation),
		PCIeMaxGeneration: families.PCIeLinkMaxGeneration.Known(d.PCIe.MaxGeneration),
		Utilization:       families.Utilization.Known(d.UtilizationRatio),
		FabricState:       families.FabricState.Known(d.Health.FabricState),
		FabricHealthy:     families.FabricHealthy.Known(d.Health.FabricHealthy),
	}
	for _, x := range d.XIDErrors {
		if x.Count > 0 && slices.Contains(CriticalXIDs, x.XID) {
			h.XIDs = append(h.XIDs, x.XID)
		}
	}
	for _, e := range d.Health.ClockEvents {
		if e.Active {
			h.ClockEvents = append(h.ClockEvents, e.Reason)
		}
	}
	for _, l := range d.NVLink.Links {
		if l.Active.Valid {
			h.NVLinks++
			if l.Active.V == 0 {
				h.NVLinksDown++
			}
		}
	}
	return h
}

// Problems lists what is wrong with the GPU now, a few words each, the most serious first, and the severity of
// the worst: what the driver says it needs, memory it could not repair or waits to, critical XIDs seen since the
// exporter started, clocks held down for heat or power, a PCIe link below its maximum, NVLinks down, a fabric not
// ready. Empty, and Healthy, when nothing is wrong or the source cannot tell.
func (h *Health) Problems() ([]string, Severity) {
	var problems []string
	worst := Healthy
	add := func(sev Severity, p string) {
		problems = append(problems, p)
		worst = min(worst, sev)
	}
	if h.RecoveryAction.Valid {
		switch h.RecoveryAction.V {
		case 1:
			add(Fault, "needs GPU reset")
		case 2:
			add(Fault, "needs node reboot")
		case 3:
			add(Fault, "needs peer-to-peer drained")
		case 4:
			add(Fault, "needs peer-to-peer drained and GPU reset")
		}
	}
	if is(h.RemapFailure) {
		add(Fault, "row remap failed")
	}
	if is(h.RemapPending) {
		add(Degraded, "row remap pending")
	}
	if is(h.RetirementPending) {
		add(Degraded, "page retirement pending")
	}
	if len(h.XIDs) > 0 {
		xids := slices.Clone(h.XIDs)
		slices.Sort(xids)
		xids = slices.Compact(xids)
		codes := make([]string, len(xids))
		for i, x := range xids {
			codes[i] = strconv.FormatUint(x, 10)
		}
		add(Fault, "XID "+strings.Join(codes, ", "))
	}
	active := func(reasons []string) bool {
		return slices.ContainsFunc(h.ClockEvents, func(r string) bool { return slices.Contains(reasons, r) })
	}
	if active(ThermalReasons) {
		add(Degraded, "thermal slowdown")
	}
	if active(PowerBrakeReasons) {
		add(Degraded, "power brake")
	}
	if active(PowerCapReasons) {
		add(Degraded, "at power cap")
	}
	if h.PCIeWidth.Valid && h.PCIeMaxWidth.Valid && h.PCIeWidth.V < h.PCIeMaxWidth.V {
		add(Degraded, fmt.Sprintf("PCIe x%.0f of x%.0f", h.PCIeWidth.V, h.PCIeMaxWidth.V))
	}
	if h.PCIeGeneration.Valid && h.PCIeMaxGeneration.Valid && h.PCIeGeneration.V < h.PCIeMaxGeneration.V &&
		h.Utilization.Valid && h.Utilization.V > Busy {
		add(Degraded, fmt.Sprintf("PCIe gen %.0f of %.0f", h.PCIeGeneration.V, h.PCIeMaxGeneration.V))
	}
	if h.NVLinksDown > 0 {
		add(Degraded, fmt.Sprintf("%d of %d NVLinks down", h.NVLinksDown, h.NVLinks))
	}
	switch {
	case h.FabricState.Valid && h.FabricState.V < 3:
		add(Degraded, "fabric not ready")
	case h.FabricHealthy.Valid && h.FabricHealthy.V == 0:
		add(Degraded, "fabric degraded")
	}
	return problems, worst
}

// is tells whether a 0/1 reading is known and 1.
func is(v gpu.Value) bool { return v.Valid && v.V == 1 }
