package ps

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// criticalXIDs are the XIDs that point at the hardware, its memory or its links: those of the GPUXIDCritical alert
// of deploy/prometheus/rules.yml.
var criticalXIDs = []uint64{48, 63, 64, 74, 79, 92, 94, 95}

// busy is the utilization above which a PCIe link below its maximum generation is degraded: an idle GPU lowers its
// generation to save power (GPUPCIeLinkDegraded).
const busy = 0.5

// Health lists what a GPU's reading says is wrong with it now, a few words each, the most serious first: what the
// driver says it needs, memory it could not repair or waits to, critical XIDs seen since the exporter started,
// clocks held down for heat or power, a PCIe link below its maximum, NVLinks down, a fabric not ready. Empty when
// nothing is wrong, or the source cannot tell.
func Health(d *gpu.Device) []string {
	var problems []string
	add := func(p string) { problems = append(problems, p) }
	h := &d.Health
	if h.RecoveryAction.Valid {
		switch h.RecoveryAction.V {
		case 1:
			add("needs GPU reset")
		case 2:
			add("needs node reboot")
		case 3:
			add("needs peer-to-peer drained")
		case 4:
			add("needs peer-to-peer drained and GPU reset")
		}
	}
	if is(h.RemapFailure) {
		add("row remap failed")
	}
	if is(h.RemapPending) {
		add("row remap pending")
	}
	if is(h.RetirementPending) {
		add("page retirement pending")
	}
	var xids []uint64
	for _, x := range d.XIDErrors {
		if x.Count > 0 && slices.Contains(criticalXIDs, x.XID) {
			xids = append(xids, x.XID)
		}
	}
	if len(xids) > 0 {
		slices.Sort(xids)
		codes := make([]string, len(xids))
		for i, x := range xids {
			codes[i] = strconv.FormatUint(x, 10)
		}
		add("XID " + strings.Join(codes, ", "))
	}
	var thermal, powerCap, powerBrake bool
	for _, e := range h.ClockEvents {
		if !e.Active {
			continue
		}
		switch e.Reason {
		case "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown":
			thermal = true
		case "sw_power_cap":
			powerCap = true
		case "hw_power_brake_slowdown":
			powerBrake = true
		}
	}
	if thermal {
		add("thermal slowdown")
	}
	if powerBrake {
		add("power brake")
	}
	if powerCap {
		add("at power cap")
	}
	p := &d.PCIe
	if p.Width.Valid && p.MaxWidth.Valid && p.Width.V < p.MaxWidth.V {
		add(fmt.Sprintf("PCIe x%.0f of x%.0f", p.Width.V, p.MaxWidth.V))
	}
	if p.Generation.Valid && p.MaxGeneration.Valid && p.Generation.V < p.MaxGeneration.V &&
		d.UtilizationRatio.Valid && d.UtilizationRatio.V > busy {
		add(fmt.Sprintf("PCIe gen %.0f of %.0f", p.Generation.V, p.MaxGeneration.V))
	}
	var down []string
	for _, l := range d.NVLink.Links {
		if l.Active.Valid && l.Active.V == 0 {
			down = append(down, strconv.Itoa(l.Link))
		}
	}
	if len(down) > 0 {
		add("NVLink " + strings.Join(down, ", ") + " down")
	}
	switch {
	case h.FabricState.Valid && h.FabricState.V < 3:
		add("fabric not ready")
	case h.FabricHealthy.Valid && h.FabricHealthy.V == 0:
		add("fabric degraded")
	}
	return problems
}

// is tells whether a 0/1 reading is known and 1.
func is(v gpu.Value) bool { return v.Valid && v.V == 1 }

// HealthLines are the GPUs with a problem, one line each: "GPU 6: needs GPU reset, row remap pending, XID 48".
func HealthLines(snap *gpu.Snapshot) []string {
	var lines []string
	for i := range snap.Devices {
		if problems := Health(&snap.Devices[i]); len(problems) > 0 {
			lines = append(lines, fmt.Sprintf("GPU %d: %s", snap.Devices[i].Index, strings.Join(problems, ", ")))
		}
	}
	return lines
}
