//go:build e2e

// Package compat runs the real binary with --demo --compat=nvidiasmi,dcgm, has a real Prometheus scrape it, and
// runs the queries of the dashboards that the compatibility outputs are for, checking the answers against the
// demo node.
package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
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
// UUID, Hostname), counters without _total and a name with its type in it (DCGM_FI_DEV_PCIE_REPLAY_COUNTER).
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
			strings.Contains(line, `"_total" suffix`) || strings.Contains(line, "should not include type"))
		if line != "" && !inherent {
			t.Errorf("promtool: %s", line)
		}
	}
}

func TestDashboardQueries(t *testing.T) {
	addr := exporter(t, "--demo", "--compat=nvidiasmi,dcgm")
	prom := e2eutil.StartPrometheus(t, e2eutil.ScrapeConfig(addr))
	testkit.WaitFor(t, 60*time.Second, "Prometheus to have both compatibility outputs", func() bool {
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
			// In MIG mode too: the GPU instances' series and the GPU's (the memory outside them) add up.
			idx := strconv.Itoa(d.Index)
			used[idx] = d.MemoryUsedBytes.V / mib
			if pods, outside := podsOn(d.Processes); len(d.MIG) == 0 && pods <= 1 && !(pods == 1 && outside) {
				util[idx] = d.UtilizationRatio.V * 100
			}
		}
		got := e2eutil.ByLabel(e2eutil.Query(t, prom, `sum by (gpu, Hostname) (DCGM_FI_DEV_FB_USED)`), "gpu")
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

// dcgmDashboard is every panel query of upstream dcgm-exporter's own Grafana dashboard, quoted from
// NVIDIA/dcgm-exporter grafana/dcgm-exporter-dashboard.json (commit d5e5f510a1b6b393f39a43293ccd9dc985defc79), in
// its panel order. Its variables $instance and $gpu are label_values(DCGM_FI_DEV_GPU_TEMP, instance) and
// label_values(DCGM_FI_DEV_GPU_TEMP, gpu), multi-valued, with "All".
var dcgmDashboard = []struct{ title, expr string }{
	{"GPU Temperature", `DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}`},
	{"GPU Avg. Temp", `avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})`},
	{"GPU Power Usage", `DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}`},
	{"GPU Power Total", `sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})`},
	{"GPU SM Clocks", `DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000`},
	{"GPU Utilization", `DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}`},
	{"GPU Framebuffer Mem Used", `DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}`},
	{"Tensor Core Utilization", `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}`},
}

// TestUpstreamDCGMDashboard runs dcgm-exporter's own dashboard on the demo node, whose GPUs are shared by pods,
// split by MIG and used outside Kubernetes, and checks that all 8 of its panels show the node's true values: the
// per-GPU panels of what does not add up (temperature, clocks) have one series per GPU with its value, those of
// what adds up (power, utilization, memory) have series that sum to it, and the two single-stat panels are the
// node's. Tensor core activity comes from the performance monitor: one series per GPU that has one (the H100s) and
// per GPU instance of the MIG GPU, none for the RTX 6000 Ada, which has no monitor.
func TestUpstreamDCGMDashboard(t *testing.T) {
	addr := exporter(t, "--demo", "--compat=dcgm")
	prom := e2eutil.StartPrometheus(t, e2eutil.ScrapeConfig(addr))
	testkit.WaitFor(t, 60*time.Second, "Prometheus to have the dcgm output", func() bool {
		return len(e2eutil.Query(t, prom, "DCGM_FI_DEV_FB_USED")) > 0
	})
	snap, err := simulated.Demo().Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	// Grafana's "All" of a multi-value variable is the regex of every value, each escaped, (a|b|…), and the
	// backslashes are escaped again inside the PromQL string.
	all := func(label string) string {
		data, err := e2eutil.PromAPI(prom, "/api/v1/label/"+label+"/values", url.Values{"match[]": {"DCGM_FI_DEV_GPU_TEMP"}})
		if err != nil {
			t.Fatalf("label_values(DCGM_FI_DEV_GPU_TEMP, %s): %v", label, err)
		}
		var values []string
		if err := json.Unmarshal(data, &values); err != nil || len(values) == 0 {
			t.Fatalf("label_values(DCGM_FI_DEV_GPU_TEMP, %s) = %s (%v)", label, data, err)
		}
		for i, v := range values {
			values[i] = strings.ReplaceAll(regexp.QuoteMeta(v), `\`, `\\`)
		}
		return "(" + strings.Join(values, "|") + ")"
	}
	instance, gpus := all("instance"), all("gpu")
	if n := strings.Count(gpus, "|") + 1; n != len(snap.Devices) {
		t.Errorf("$gpu has %d values, want the demo's %d GPUs", n, len(snap.Devices))
	}
	run := func(expr string) []e2eutil.Sample {
		return e2eutil.Query(t, prom, strings.NewReplacer("$instance", instance, "$gpu", gpus).Replace(expr))
	}

	// The node's true values, per GPU (index → value), from the demo's own snapshot; tensor activity per GPU and per
	// GPU instance ("index/GPU_I_ID").
	temp, power, clock, util, used, tensor := map[string]float64{}, map[string]float64{}, map[string]float64{},
		map[string]float64{}, map[string]float64{}, map[string]float64{}
	var tempSum, powerSum float64
	for _, d := range snap.Devices {
		g := strconv.Itoa(d.Index)
		if d.TemperatureCelsius.Valid {
			temp[g] = d.TemperatureCelsius.V
			tempSum += d.TemperatureCelsius.V
		}
		if d.PowerUsageWatts.Valid {
			power[g] = d.PowerUsageWatts.V
			powerSum += d.PowerUsageWatts.V
		}
		for _, c := range d.Clocks {
			if c.Name == "sm" {
				clock[g] = c.Hertz
			}
		}
		if d.UtilizationRatio.Valid {
			util[g] = 100 * d.UtilizationRatio.V
		}
		if d.MemoryUsedBytes.Valid {
			used[g] = d.MemoryUsedBytes.V / mib
		}
		if d.Profiling != nil && d.Profiling.TensorActive.Valid {
			tensor[g+"/"] = d.Profiling.TensorActive.V
		}
		for _, m := range d.MIG {
			if m.Profiling != nil && m.Profiling.TensorActive.Valid {
				tensor[g+"/"+strconv.Itoa(m.GPUInstance)] = m.Profiling.TensorActive.V
			}
		}
	}
	if len(tensor) == 0 {
		t.Fatal("the demo node has no tensor activity: the Tensor Core panel would check nothing")
	}

	once := func(title string, res []e2eutil.Sample, want map[string]float64) {
		t.Helper()
		got := map[string]float64{}
		for _, s := range res {
			if _, dup := got[s.Metric["gpu"]]; dup {
				t.Errorf("%s: GPU %s has more than one series (a value that does not add up, repeated)", title, s.Metric["gpu"])
			}
			got[s.Metric["gpu"]] = s.Value
		}
		t.Logf("%s: %d series for %d GPUs", title, len(res), len(want))
		compare(t, title, got, want)
	}
	summed := func(title string, res []e2eutil.Sample, want map[string]float64) {
		t.Helper()
		got := map[string]float64{}
		for _, s := range res {
			got[s.Metric["gpu"]] += s.Value
		}
		t.Logf("%s: %d series, adding up to %.1f for the node (true: %.1f)", title, len(res), sum(got), sum(want))
		compare(t, title+" (its series per GPU, added up)", got, want)
	}
	single := func(title string, res []e2eutil.Sample, want float64) {
		t.Helper()
		if len(res) == 1 {
			t.Logf("%s: %.2f (true: %.2f)", title, res[0].Value, want)
		}
		if len(res) != 1 || math.Abs(res[0].Value-want) > 1e-6 {
			t.Errorf("%s = %v, want the node's %v", title, res, want)
		}
	}
	var series []int
	for _, p := range dcgmDashboard {
		res := run(p.expr)
		series = append(series, len(res))
		switch p.title {
		case "GPU Temperature":
			once(p.title, res, temp)
		case "GPU Avg. Temp":
			single(p.title, res, tempSum/float64(len(temp)))
		case "GPU Power Usage":
			summed(p.title, res, power)
		case "GPU Power Total":
			single(p.title, res, powerSum)
		case "GPU SM Clocks":
			once(p.title, res, clock)
		case "GPU Utilization":
			summed(p.title, res, util)
		case "GPU Framebuffer Mem Used":
			summed(p.title, res, used)
		case "Tensor Core Utilization":
			got := map[string]float64{}
			for _, s := range res {
				k := s.Metric["gpu"] + "/" + s.Metric["GPU_I_ID"]
				if _, dup := got[k]; dup {
					t.Errorf("%s: GPU %s has more than one series (a ratio, repeated)", p.title, k)
				}
				got[k] = s.Value
			}
			t.Logf("%s: %d series for %d GPUs and GPU instances with a performance monitor", p.title, len(res), len(tensor))
			compare(t, p.title, got, tensor)
		default:
			t.Fatalf("no check for panel %q", p.title)
		}
	}
	t.Logf("panels' series: %v; node: %.1f W, avg %.2f °C, %.0f MiB used", series, powerSum, tempSum/float64(len(temp)), sum(used))
}

// defaultCounters are the active lines of dcgm-exporter's default counter file: its field names and their types
// (gauge, counter, or label for a field dcgm-exporter writes as a label).
func defaultCounters(t *testing.T) (names, types []string) {
	t.Helper()
	b, err := os.ReadFile("testdata/default-counters.csv")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cells := strings.Split(line, ",")
		if len(cells) < 3 {
			t.Fatalf("default-counters.csv: %q is not FIELD, type, help", line)
		}
		names, types = append(names, strings.TrimSpace(cells[0])), append(types, strings.TrimSpace(cells[1]))
	}
	return names, types
}

// Every field of dcgm-exporter's default counter file is served on --demo --compat=dcgm, with the file's type; its
// label field (DCGM_FI_DRIVER_VERSION) is a label of every series. The NVLink bandwidth is a rate between two
// readings, so the second scrape is the one checked.
func TestServesEveryDefaultField(t *testing.T) {
	names, types := defaultCounters(t)
	if len(names) != 26 {
		t.Fatalf("testdata/default-counters.csv has %d active lines, want dcgm-exporter's 26", len(names))
	}
	addr := exporter(t, "--demo", "--compat=dcgm")
	e2eutil.Scrape(t, addr)
	_, families := e2eutil.Scrape(t, addr)
	served := 0
	for i, name := range names {
		if types[i] == "label" {
			ok := false
			for fam, mf := range families {
				if !strings.HasPrefix(fam, "DCGM_FI_") {
					continue
				}
				ok = true
				for _, m := range mf.GetMetric() {
					if e2eutil.Label(m, name) == "" {
						t.Errorf("%s has a series without the %s label", fam, name)
						ok = false
						break
					}
				}
			}
			if ok {
				served++
			}
			continue
		}
		mf := families[name]
		switch {
		case mf == nil || len(mf.GetMetric()) == 0:
			t.Errorf("%s (default-counters.csv) is not served", name)
		case !strings.EqualFold(mf.GetType().String(), types[i]):
			t.Errorf("%s is a %s, default-counters.csv says %s", name, mf.GetType(), types[i])
		default:
			served++
		}
	}
	t.Logf("%d of the %d fields of dcgm-exporter's default counter file served", served, len(names))
}

func sum(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
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
