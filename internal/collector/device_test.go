package collector

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvidiasmi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
)

// baseUnits are the units docs/reference.md's conventions allow in a name.
var baseUnits = []string{"bytes", "seconds", "watts", "joules", "hertz", "celsius", "ratio"}

// Each row of deviceFamilies is complete and follows the conventions of docs/reference.md: base units, a name that
// ends in its unit, _total on counters and only there, one way to read the family, and dcgm fields whose conversion
// starts from the family's unit.
func TestDeviceFamilyRows(t *testing.T) {
	names := make(map[string]bool)
	for _, f := range deviceFamilies {
		if names[f.Name] {
			t.Errorf("%s: two rows", f.Name)
		}
		names[f.Name] = true
		if f.help == "" || f.sources == 0 {
			t.Errorf("%s: no help or no sources", f.Name)
		}
		if (f.value == nil) == (f.series == nil) {
			t.Errorf("%s: want a value or series function, not both or neither", f.Name)
		}
		if len(f.labels) > 0 && f.series == nil {
			t.Errorf("%s: labels %v, but no series function to give their values", f.Name, f.labels)
		}
		base, isTotal := strings.CutSuffix(f.Name, "_total")
		if isTotal != (f.typ == counter) {
			t.Errorf("%s: a %s; counters, and only they, end in _total", f.Name, f.typ)
		}
		if f.Unit != "" && (!slices.Contains(baseUnits, f.Unit) || !strings.HasSuffix(base, "_"+f.Unit)) {
			t.Errorf("%s: unit %q is not a base unit the name ends with", f.Name, f.Unit)
		}
		for _, u := range baseUnits {
			if f.Unit == "" && strings.HasSuffix(base, "_"+u) {
				t.Errorf("%s: the name ends in %s, but the row has no unit", f.Name, u)
			}
		}
		for _, d := range f.dcgm {
			if names[d.name] || !strings.HasPrefix(d.name, "DCGM_FI_") || d.help == "" {
				t.Errorf("%s: dcgm field %q is named twice, not DCGM_FI_*, or has no help", f.Name, d.name)
			}
			names[d.name] = true
			if d.convert.from != "" && d.convert.from != f.Unit {
				t.Errorf("%s: %s converts from %s, but the family is in %q", f.Name, d.name, d.convert.from, f.Unit)
			}
			if d.value == nil && f.value == nil {
				t.Errorf("%s: %s needs a value function: the family has labels", f.Name, d.name)
			}
			if split := d.share != nil || d.busy != nil; split != (d.shareHelp != "") || (d.share != nil && d.busy != nil) {
				t.Errorf("%s: %s is split (by an amount %v, by a share of the busy time %v) but says how %q", f.Name, d.name,
					d.share != nil, d.busy != nil, d.shareHelp)
			}
		}
	}
}

// familiesOf returns the device families that a snapshot gives series.
func familiesOf(t *testing.T, snap *gpu.Snapshot) map[string]bool {
	t.Helper()
	m := newDeviceMetrics()
	b := series.NewEngine(m.descs()...).Batch()
	m.update(b, &reading.Reading{Snapshot: snap})
	written := make(map[string]bool)
	b.Each(func(d *series.Desc, _ []string, _ float64) { written[d.Name()] = true })
	if _, err := b.Gather(nil); err != nil {
		t.Fatal(err)
	}
	return written
}

// A row's sources are the sources that fill its family: every family that the nvidia-smi source (on every
// fixture of real output) or the simulated source (the demo node, the reference example) gives series lists it, and
// each family that lists one of them gets series from it somewhere. The NVML column is checked by hand against
// internal/gpu/nvml: its stub library runs in that package's tests only.
func TestDeviceFamilySources(t *testing.T) {
	fixtures, err := filepath.Glob("../gpu/nvidiasmi/testdata/*.xml")
	if err != nil || len(fixtures) < 10 {
		t.Fatalf("nvidia-smi fixtures: %v, %v", fixtures, err)
	}
	var smi []*gpu.Snapshot
	for _, path := range fixtures {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		snap, err := nvidiasmi.Parse(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		smi = append(smi, snap)
	}
	var sim []*gpu.Snapshot
	example, err := simulated.Open("../simulated/testdata/node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range []gpu.Source{simulated.Demo(), example} {
		snap, err := src.Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		sim = append(sim, snap)
	}
	for _, c := range []struct {
		name      string
		source    source
		snapshots []*gpu.Snapshot
	}{{"nvidia-smi", fromNvidiaSMI, smi}, {"simulated", fromSimulated, sim}} {
		written := make(map[string]bool)
		for _, snap := range c.snapshots {
			for name := range familiesOf(t, snap) {
				written[name] = true
			}
		}
		for _, f := range deviceFamilies {
			listed := f.sources&c.source != 0
			switch {
			case written[f.Name] && !listed:
				t.Errorf("the %s source fills %s, whose row does not list it", c.name, f.Name)
			case !written[f.Name] && listed:
				t.Errorf("%s lists the %s source, which fills it nowhere", f.Name, c.name)
			}
		}
	}
}

// A GPU's NVLinks are counted by state (a link whose state is unknown in neither), and their error counters are
// summed by type, absent for a type that one link does not report; a GPU without NVLink has neither family.
func TestNVLinkFamilies(t *testing.T) {
	link := func(n int, active gpu.Value, replays gpu.Value) gpu.NVLinkLink {
		return gpu.NVLinkLink{Link: n, Active: active, CRCFlitErrors: gpu.Known(float64(n)), CRCDataErrors: gpu.Known(0),
			ReplayErrors: replays}
	}
	snap := &gpu.Snapshot{Devices: []gpu.Device{
		{Index: 0, UUID: "GPU-a", NVLink: gpu.NVLink{Links: []gpu.NVLinkLink{
			link(0, gpu.Known(1), gpu.Known(1)), link(1, gpu.Known(0), gpu.Known(2)), link(2, gpu.Known(1), gpu.Value{}),
			link(3, gpu.Value{}, gpu.Known(4)),
		}}},
		{Index: 1, UUID: "GPU-b"},
	}}
	got := gpuFamilies(t, registry(t, fixedSource{snap}, fixedOwners{}, Options{}))
	for _, want := range []string{
		`gpu_nvlink_links{gpu="0",state="active",uuid="GPU-a"} 2`,
		`gpu_nvlink_links{gpu="0",state="inactive",uuid="GPU-a"} 1`,
		`gpu_nvlink_errors_total{gpu="0",type="crc_flit",uuid="GPU-a"} 6`,
		`gpu_nvlink_errors_total{gpu="0",type="crc_data",uuid="GPU-a"} 0`,
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("exposition lacks %s:\n%s", want, got)
		}
	}
	for _, absent := range []string{`type="replay"`, `type="recovery"`, `gpu="1"`} {
		if strings.Contains(nvlinkLines(got), absent) {
			t.Errorf("NVLink series with %s, want none:\n%s", absent, nvlinkLines(got))
		}
	}
}

func nvlinkLines(exposition string) string {
	var b strings.Builder
	for _, l := range strings.Split(exposition, "\n") {
		if strings.HasPrefix(l, "gpu_nvlink") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
