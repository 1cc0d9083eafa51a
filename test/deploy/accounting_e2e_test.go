//go:build e2e

package deploy

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// What the demo node (internal/simulated/demo.yaml) implies, worked out by hand from its numbers. Its values do
// not change, and its energy counters grow with its power, so that every workload's energy grows at its share of
// the board power, and GPU time and memory-time at its SM utilization and memory.
var (
	// Board power of GPUs 0-7, and power by namespace: GPU 0 splits 402.3 W by SM 0.41, 0.22, 0.03; GPU 1 365 W
	// between the MPS clients by SM 0.33 and 0.29 (the MPS server reports none); GPU 2 (MIG) 231.8 W by memory (18,
	// 6 and 4 GiB); GPU
	// 3 455.1 W to jupyter-bob; GPU 5 188.2 W by SM 0.12 (ollama.service), 0.06 (a Docker container), 0.19
	// (transcoder). GPU 4 is a Slurm job; GPUs 6 and 7 are idle.
	demoBoardWatts     = []float64{402.3, 365, 231.8, 455.1, 612.4, 188.2, 71.9, 69.4}
	demoNamespaceWatts = map[string]float64{
		"ml-training":  402.3 * 0.41 / 0.66,
		"ml-research":  402.3 * 0.22 / 0.66,
		"data-science": 402.3*0.03/0.66 + 455.1,
		"inference":    365,
		"gpu-operator": 0,
		"vision":       231.8,
		"media":        188.2 * 0.19 / 0.37,
	}
	demoUserWatts = map[string]float64{
		"priya": 402.3 * 0.41 / 0.66, "marco": 402.3 * 0.22 / 0.66, "alice": 402.3 * 0.03 / 0.66, "root": 0,
		"triton": 365, "li.wei": 231.8 * 18 / 28, "svc-vision": 231.8 * 6 / 28, "nadia": 231.8 * 4 / 28, "bob": 455.1, "jdoe": 612.4,
		"ollama": 188.2 * 0.12 / 0.37, "kim": 188.2 * 0.06 / 0.37, "svc-media": 188.2 * 0.19 / 0.37,
	}
	// SM utilization by namespace (MIG and the MPS server report none, so vision and gpu-operator have no GPU time).
	demoNamespaceSM = map[string]float64{"ml-training": 0.41, "ml-research": 0.22, "data-science": 0.03 + 0.67, "inference": 0.62 + 0.04, "media": 0.19}
	// Memory by namespace, bytes.
	demoNamespaceMemory = map[string]float64{
		"ml-training": 23622320128, "ml-research": 12884901888, "data-science": 4294967296 + 32212254720,
		"inference": 9663676416*2 + 2147483648, "gpu-operator": 536870912, "vision": 19327352832 + 6442450944 + 4294967296, "media": 1610612736,
	}
	demoIdleWatts = 71.9 + 69.4
)

// TestAccountingAgainstPrometheus has a real Prometheus scrape the demo every second and evaluate the accounting
// rules, then checks what the issue promises: workload plus unattributed energy matches the GPUs' energy, power
// splits as the demo node implies, the recording rules and every query of the accounting dashboard return data,
// and their values stand in the proportions the demo node implies.
func TestAccountingAgainstPrometheus(t *testing.T) {
	target := e2eutil.StartExporter(t, exporterBinary(t), "--demo").Addr
	rules := filepath.Join(repoRoot(t), "deploy/prometheus/rules.yml")
	api := e2eutil.StartPrometheus(t, fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: gpu-pod-exporter
    honor_labels: true
    static_configs:
      - targets: [%q]
`, rules, target))

	// 30 readings, so that a 15 s window lies inside the data for every series at the instant queried below.
	testkit.WaitFor(t, 90*time.Second, "30 scrapes of the demo", func() bool {
		r, err := e2eutil.TryQuery(api, `count_over_time(gpu_unattributed_energy_joules_total{gpu="7"}[1m])`)
		return err == nil && len(r) == 1 && r[0].Value >= 30
	})

	// Every query is evaluated at the same instant, so that values computed from one another agree. The instant is
	// some evaluations back: at "now" the rule group may be half way through a round, its first rules written at
	// this round's time and the others still at the last one's, and a scrape may be in flight, so that two rules
	// read together would come from different rounds.
	at := time.Now().Add(-5 * time.Second)
	query := func(expr string) []e2eutil.Sample {
		t.Helper()
		out, err := e2eutil.TryQueryAt(api, expr, at)
		if err != nil {
			t.Fatalf("query %q: %v", expr, err)
		}
		return out
	}
	one := func(expr string) float64 {
		t.Helper()
		r := query(expr)
		if len(r) != 1 {
			t.Fatalf("%s: %d series, want 1", expr, len(r))
		}
		return r[0].Value
	}
	near := func(what string, got, want, rel float64) {
		t.Helper()
		if math.Abs(got-want) > rel*math.Max(math.Abs(want), 1e-9) {
			t.Errorf("%s = %g, want %g (within %g)", what, got, want, rel)
		}
	}

	// The "done when": over a window, workload plus unattributed energy matches the GPUs' energy counters.
	// All these series are scraped together, so increase() extrapolates them alike and the match is exact up to
	// floating point; 1% is what the issue asks.
	const window = "[15s]"
	accounted := one(`sum(increase({__name__=~"gpu_workload_energy_joules_total|gpu_unattributed_energy_joules_total"}` + window + `))`)
	board := one(`sum(increase(gpu_energy_consumption_joules_total` + window + `))`)
	t.Logf("energy over %s: GPUs %.1f J, workloads + unattributed %.1f J, relative difference %.2g", window, board, accounted, math.Abs(accounted-board)/board)
	near("workload + unattributed energy", accounted, board, 0.01)
	near("board energy over the window", board, sumOf(demoBoardWatts)*15, 0.05)

	// Power: every GPU's split adds up to its board power, and by namespace and user it is what the demo implies.
	for gpu, watts := range demoBoardWatts {
		got := one(fmt.Sprintf(`sum(gpu_workload_power_watts{gpu="%d"} or gpu_unattributed_power_watts{gpu="%d"})`, gpu, gpu))
		near(fmt.Sprintf("GPU %d workload + unattributed power", gpu), got, watts, 1e-9)
	}
	checkMap(t, "power by namespace", e2eutil.ByLabel(query(`sum by (namespace) (gpu_workload_power_watts{namespace!=""})`), "namespace"), demoNamespaceWatts, 1e-9)
	checkMap(t, "power by user", e2eutil.ByLabel(query(`sum by (user) (gpu_workload_power_watts)`), "user"), demoUserWatts, 1e-9)
	near("unattributed power", one(`sum(gpu_unattributed_power_watts)`), demoIdleWatts, 1e-9)
	near("Slurm job power", one(`sum(gpu_workload_power_watts{slurm_job_id="88231"})`), 612.4, 1e-9)

	// The recording rules: every workload arrived at the same reading, so their counters stand in the proportions
	// of their power, SM utilization and memory.
	checkShares(t, "rule kWh by namespace", e2eutil.ByLabel(query(`namespace:gpu_workload_energy_kwh:increase1h`), "namespace"), demoNamespaceWatts)
	checkShares(t, "rule kWh by user", e2eutil.ByLabel(query(`user:gpu_workload_energy_kwh:increase1h`), "user"), demoUserWatts)
	checkShares(t, "rule GPU-hours by namespace", e2eutil.ByLabel(query(`namespace:gpu_workload_gpu_hours:increase1h`), "namespace"), demoNamespaceSM)
	checkShares(t, "rule GiB-hours by namespace", e2eutil.ByLabel(query(`namespace:gpu_workload_memory_gib_hours:increase1h`), "namespace"), demoNamespaceMemory)
	if jobs := e2eutil.ByLabel(query(`slurm_job_id:gpu_workload_energy_kwh:increase1h`), "slurm_job_id"); len(jobs) != 1 || jobs["88231"] <= 0 {
		t.Errorf("rule kWh by Slurm job: %v, want job 88231", jobs)
	}
	// GPU-hours: the job keeps 0.93 of a GPU busy, so its GPU-hours are 0.93 of its hours on the GPU, which are
	// its kWh over its power. Exactly so within one query, which reads one consistent view of the samples; two
	// rules are two queries, and a scrape committed between them (its samples stamped before the rules' time)
	// extends one rule's range and not the other's, so the rules agree to the extrapolation of a sample (1 s of a
	// range of 30 s or more).
	perHourOnGPU := `(sum(increase(gpu_workload_sm_seconds_total{slurm_job_id="88231"}[1h])) / 3600)
		/ (sum(increase(gpu_workload_energy_joules_total{slurm_job_id="88231"}[1h])) / 3.6e6 * 1000 / 612.4)`
	near("Slurm job GPU-hours per hour on the GPU", one(perHourOnGPU), 0.93, 1e-6)
	jobHours := one(`slurm_job_id:gpu_workload_gpu_hours:increase1h`)
	jobKWh := one(`slurm_job_id:gpu_workload_energy_kwh:increase1h`)
	near("Slurm job GPU-hours per hour on the GPU, by the rules", jobHours/(jobKWh*1000/612.4), 0.93, 0.04)
	for _, rule := range []string{"instance:gpu_unattributed_energy_kwh:increase1h", "user:gpu_workload_gpu_hours:increase1h",
		"slurm_job_id:gpu_workload_memory_gib_hours:increase1h", "user:gpu_workload_memory_gib_hours:increase1h",
		"slurm_job_id:gpu_workload_gpu_hours:increase1h"} {
		if r := query(rule); len(r) == 0 || r[0].Value <= 0 {
			t.Errorf("%s: %v", rule, r)
		}
	}

	// Every query of the accounting dashboard returns data.
	d := loadAccountingDashboard(t)
	panelQueries := map[string][]string{}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			expr := substituteAccounting(tg.Expr)
			panelQueries[p.Title] = append(panelQueries[p.Title], expr)
			if r := query(expr); len(r) == 0 {
				t.Errorf("panel %q: %s: no data", p.Title, expr)
			}
		}
	}
	// And the values are those the demo implies.
	byNamespace := panelQueries["By namespace"]
	checkShares(t, "By namespace kWh", e2eutil.ByLabel(query(byNamespace[0]), "namespace"), demoNamespaceWatts)
	kWh := e2eutil.ByLabel(query(byNamespace[0]), "namespace")
	cost := e2eutil.ByLabel(query(byNamespace[1]), "namespace")
	for ns, v := range kWh {
		near("By namespace cost of "+ns, cost[ns], v*0.15, 1e-9)
	}
	checkShares(t, "By namespace GPU-hours", e2eutil.ByLabel(query(byNamespace[2]), "namespace"), demoNamespaceSM)
	checkShares(t, "By namespace GiB-hours", e2eutil.ByLabel(query(byNamespace[3]), "namespace"), demoNamespaceMemory)
	checkShares(t, "By user kWh", e2eutil.ByLabel(query(panelQueries["By user"][0]), "user"), demoUserWatts)
	if jobs := e2eutil.ByLabel(query(panelQueries["By Slurm job"][0]), "slurm_job_id"); len(jobs) != 1 || jobs["88231"] <= 0 {
		t.Errorf("By Slurm job: %v", jobs)
	}
	top := query(panelQueries["Top consumers"][0])
	slices.SortFunc(top, func(a, b e2eutil.Sample) int { return cmp.Compare(b.Value, a.Value) })
	if len(top) != 10 || top[0].Metric["slurm_job_id"] != "88231" || top[1].Metric["pod"] != "jupyter-bob-0" {
		t.Errorf("Top consumers: %v, want 10 with Slurm job 88231 (612.4 W) first and jupyter-bob-0 (455.1 W) second", top)
	}
	energy, price := one(panelQueries["Energy"][0]), one(panelQueries["Energy cost"][0])
	near("Energy cost", price, energy*0.15, 1e-9)
	// Unattributed: the idle GPUs' share of the power, plus the others' first interval if the range holds it.
	share := one(panelQueries["Unattributed energy"][0])
	if idle := demoIdleWatts / sumOf(demoBoardWatts); share < idle*(1-1e-9) || share > 2*idle {
		t.Errorf("Unattributed energy share %g, want a little above the idle GPUs' %g", share, idle)
	}
}

func sumOf(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s
}

func checkMap(t *testing.T, what string, got, want map[string]float64, rel float64) {
	t.Helper()
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Errorf("%s: %v, want %v", what, got, want)
		return
	}
	for k, w := range want {
		if math.Abs(got[k]-w) > rel*math.Max(math.Abs(w), 1e-9) {
			t.Errorf("%s[%s] = %g, want %g", what, k, got[k], w)
		}
	}
}

// checkShares checks that got stands in the proportions of want: same keys, each value's share of the total the
// same within 1e-6. Keys whose wanted value is 0 must be 0.
func checkShares(t *testing.T, what string, got, want map[string]float64) {
	t.Helper()
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Errorf("%s: keys %v, want %v", what, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		return
	}
	gotTotal, wantTotal := 0.0, 0.0
	for k := range want {
		gotTotal += got[k]
		wantTotal += want[k]
	}
	if gotTotal <= 0 {
		t.Errorf("%s: %v, all 0", what, got)
		return
	}
	var bad []string
	for k := range want {
		if g, w := got[k]/gotTotal, want[k]/wantTotal; math.Abs(g-w) > 1e-6 {
			bad = append(bad, fmt.Sprintf("%s %.6f (want %.6f)", k, g, w))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s: shares %s", what, strings.Join(bad, ", "))
	}
}
