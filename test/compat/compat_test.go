//go:build e2e

// Package compat runs the real binary with --demo --compat=nvidiasmi,dcgm, has a real Prometheus scrape it, and
// runs the queries of the dashboards that the compatibility outputs are for, checking the answers against the
// demo node.
package compat

import (
	"bytes"
	"context"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/simulated"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

const (
	nodeName = "gpu-node-e2e"
	mib      = 1 << 20
)

var binary string

func TestMain(m *testing.M) { e2eutil.Main(m, &binary) }

func TestUnknownCompatNameIsAnError(t *testing.T) {
	out, err := exec.Command(binary, "--demo", "--compat=nvidiasmi,dcgm-exporter").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `"dcgm-exporter"`) {
		t.Errorf("--compat=nvidiasmi,dcgm-exporter: err %v, output:\n%s", err, out)
	}
}

// The exposition passes promtool, but for what dcgm-exporter's own names bring: camelCase label names (modelName,
// UUID, Hostname) and an energy counter without _total.
func TestCompatExpositionPassesPromtool(t *testing.T) {
	addr := exporter(t, "--demo", "--compat=nvidiasmi,dcgm")
	text, _ := e2eutil.Scrape(t, addr)
	body := []byte(text)
	for _, family := range []string{"nvidiasmi_process_used_memory_bytes", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"} {
		if !bytes.Contains(body, []byte("\n"+family+"{")) {
			t.Errorf("no %s in the exposition", family)
		}
	}
	promtool := exec.Command("promtool", "check", "metrics")
	promtool.Stdin = bytes.NewReader(body)
	out, _ := promtool.CombinedOutput()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		inherent := strings.HasPrefix(line, "DCGM_FI_") && (strings.Contains(line, "snake_case") ||
			strings.Contains(line, `"_total" suffix`))
		if line != "" && !inherent {
			t.Errorf("promtool: %s", line)
		}
	}
}

func TestDashboardQueries(t *testing.T) {
	addr := exporter(t, "--demo", "--compat=nvidiasmi,dcgm")
	prom := e2eutil.StartPrometheus(t, e2eutil.ScrapeConfig(addr))
	e2eutil.WaitFor(t, 60*time.Second, "Prometheus to have both compatibility outputs", func() bool {
		return len(e2eutil.Query(t, prom, "nvidiasmi_process_used_memory_bytes")) > 0 && len(e2eutil.Query(t, prom, "DCGM_FI_DEV_FB_USED")) > 0
	})
	snap, err := simulated.Demo().Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("nvidiasmi panel", func(t *testing.T) {
		panel := `sum(nvidiasmi_process_used_memory_bytes{uuid=~"GPU-$gpu"}) by (pod_name)`
		for _, d := range snap.Devices {
			want := map[string]float64{}
			for _, p := range d.Processes {
				want[owner(p).Pod] += p.UsedMemoryBytes.V
			}
			// Grafana fills $gpu from label_values(uuid) with the GPU- prefix cut off by the variable's regex.
			expr := strings.ReplaceAll(panel, "$gpu", strings.TrimPrefix(d.UUID, "GPU-"))
			compare(t, expr, e2eutil.ByLabel(e2eutil.Query(t, prom, expr), "pod_name"), want)
		}
		// A multi-value variable becomes (a|b).
		a, b := snap.Devices[0], snap.Devices[1]
		expr := strings.ReplaceAll(panel, "$gpu", "("+strings.TrimPrefix(a.UUID, "GPU-")+"|"+strings.TrimPrefix(b.UUID, "GPU-")+")")
		want := map[string]float64{}
		for _, p := range append(append([]gpu.Process{}, a.Processes...), b.Processes...) {
			want[owner(p).Pod] += p.UsedMemoryBytes.V
		}
		compare(t, expr, e2eutil.ByLabel(e2eutil.Query(t, prom, expr), "pod_name"), want)
	})

	t.Run("dcgm labels", func(t *testing.T) {
		expr := `count by (Hostname, DCGM_FI_DRIVER_VERSION, modelName) (DCGM_FI_DEV_GPU_TEMP)`
		res := e2eutil.Query(t, prom, expr)
		models := map[string]bool{}
		for _, d := range snap.Devices {
			models[d.Name] = true
		}
		for _, r := range res {
			if r.Metric["Hostname"] != nodeName || r.Metric["DCGM_FI_DRIVER_VERSION"] != snap.DriverVersion || !models[r.Metric["modelName"]] {
				t.Errorf("%s: group %v, want Hostname %s, driver %s and a model of the demo node", expr, r.Metric, nodeName, snap.DriverVersion)
			}
		}
		if len(res) != len(models) {
			t.Errorf("%s = %v, want one group per GPU model (%d)", expr, res, len(models))
		}
		expr = `count by (gpu, device, UUID, pci_bus_id) (DCGM_FI_DEV_GPU_TEMP)`
		if res := e2eutil.Query(t, prom, expr); len(res) != len(snap.Devices) {
			t.Errorf("%s: %d GPUs, want %d", expr, len(res), len(snap.Devices))
		}
		for _, r := range e2eutil.Query(t, prom, expr) {
			if r.Metric["device"] != "nvidia"+r.Metric["gpu"] || !strings.HasPrefix(r.Metric["UUID"], "GPU-") {
				t.Errorf("%s: labels %v", expr, r.Metric)
			}
		}
	})

	// A GPU's FB_USED series add up to the GPU's memory use, shared or not; per-GPU utilization panels keep their
	// value on GPUs that are not shared.
	t.Run("dcgm per GPU", func(t *testing.T) {
		used, util := map[string]float64{}, map[string]float64{}
		for _, d := range snap.Devices {
			if len(d.MIG) > 0 {
				continue // in MIG mode there is a series per GPU instance and none for the whole GPU, as in DCGM
			}
			idx := strconv.Itoa(d.Index)
			used[idx] = d.MemoryUsedBytes.V / mib
			if pods, outside := podsOn(d.Processes); pods <= 1 && !(pods == 1 && outside) {
				util[idx] = d.UtilizationRatio.V * 100
			}
		}
		got := e2eutil.ByLabel(e2eutil.Query(t, prom, `sum by (gpu, Hostname) (DCGM_FI_DEV_FB_USED{GPU_I_ID=""})`), "gpu")
		compare(t, "sum by (gpu) FB_USED", got, used)
		got = e2eutil.ByLabel(e2eutil.Query(t, prom, `avg by (gpu, Hostname) (DCGM_FI_DEV_GPU_UTIL)`), "gpu")
		for g, want := range util {
			if math.Abs(got[g]-want) > 1e-6 {
				t.Errorf("avg by (gpu, Hostname) (DCGM_FI_DEV_GPU_UTIL) on unshared GPU %s = %v, want %v", g, got[g], want)
			}
		}
		// GPU 0 is time-sliced between three pods, all with known SM utilization: their shares and the rest add
		// up to the GPU's utilization.
		d := snap.Devices[0]
		got = e2eutil.ByLabel(e2eutil.Query(t, prom, `sum by (gpu, Hostname) (DCGM_FI_DEV_GPU_UTIL)`), "gpu")
		if math.Abs(got["0"]-d.UtilizationRatio.V*100) > 1e-6 {
			t.Errorf("sum by (gpu) GPU_UTIL on shared GPU 0 = %v, want %v", got["0"], d.UtilizationRatio.V*100)
		}
	})

	// Each pod's memory: its own processes' on a shared GPU, the GPU's (or the GPU instance's) when it has it alone.
	t.Run("dcgm per pod", func(t *testing.T) {
		want := map[string]float64{}
		for _, d := range snap.Devices {
			for _, e := range entities(d) {
				pods, outside := podsOn(e.processes)
				alone := pods == 1 && !outside
				for i, p := range e.processes {
					key := owner(p).Namespace + "/" + owner(p).Pod
					switch {
					case owner(p).Pod == "":
					case !alone:
						want[key] += p.UsedMemoryBytes.V / mib
					case i == 0: // the pod alone on the GPU has the GPU's memory, once
						want[key] += e.used / mib
					}
				}
			}
		}
		res := e2eutil.Query(t, prom, `sum by (namespace, pod) (DCGM_FI_DEV_FB_USED)`)
		got := map[string]float64{}
		for _, r := range res {
			if r.Metric["pod"] != "" {
				got[r.Metric["namespace"]+"/"+r.Metric["pod"]] = r.Value
			}
		}
		compare(t, "sum by (namespace, pod) (DCGM_FI_DEV_FB_USED)", got, want)
		// The pods on the time-sliced GPU 0 have their own memory, not the whole GPU's as dcgm-exporter would say.
		p := snap.Devices[0].Processes[0]
		if g := got[owner(p).Namespace+"/"+owner(p).Pod]; g != p.UsedMemoryBytes.V/mib {
			t.Errorf("pod %s on a shared GPU: FB_USED %v MiB, want its own %v MiB", owner(p).Pod, g, p.UsedMemoryBytes.V/mib)
		}
	})
}

// demoOwners are the identities the demo node presets for its processes.
var demoOwners = simulated.Demo().PresetOwners()

func owner(p gpu.Process) attribution.Identity { return demoOwners[p.PID] }

// podsOn counts the distinct containers (namespace, pod, container) among processes, and says whether any process
// is in none.
func podsOn(processes []gpu.Process) (pods int, outside bool) {
	seen := map[[3]string]bool{}
	for _, p := range processes {
		k := [3]string{owner(p).Namespace, owner(p).Pod, owner(p).Container}
		if k == ([3]string{}) {
			outside = true
		} else if !seen[k] {
			seen[k] = true
			pods++
		}
	}
	return pods, outside
}

type entity struct {
	used      float64
	processes []gpu.Process
}

// entities are a GPU's GPU instances in MIG mode, else the GPU.
func entities(d gpu.Device) []entity {
	if len(d.MIG) == 0 {
		return []entity{{d.MemoryUsedBytes.V, d.Processes}}
	}
	var out []entity
	for _, m := range d.MIG {
		e := entity{used: m.MemoryUsedBytes.V}
		for _, p := range d.Processes {
			if p.GPUInstance == m.GPUInstance {
				e.processes = append(e.processes, p)
			}
		}
		out = append(out, e)
	}
	return out
}

func compare(t *testing.T, what string, got, want map[string]float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
		return
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || math.Abs(g-w) > 1e-6 {
			t.Errorf("%s: %q = %v, want %v", what, k, g, w)
		}
	}
}

// exporter starts the binary on the node NODE_NAME names and waits until it listens. It is stopped when the test
// ends.
func exporter(t *testing.T, args ...string) string {
	t.Helper()
	t.Setenv("NODE_NAME", nodeName)
	return e2eutil.StartExporter(t, binary, args...).Addr
}
