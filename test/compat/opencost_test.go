//go:build e2e

package compat

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// openCostUsage is OpenCost's GPU usage query, queryFmtGPUsUsageAvg of its pkg/costmodel/allocation.go (at
// 5f65333), with its window and cluster label (PROM_CLUSTER_ID_LABEL's default) filled in as OpenCost fills them.
const openCostUsage = `avg(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""}[1h])) by (container, pod, namespace, cluster_id)`

// wantUsage is what each container should be charged: on every GPU (GPU instance in MIG mode) with an engine
// activity reading, its part by docs/compat.md's rule, written out here on its own: the whole value for the only
// pod of a GPU; on a GPU shared with other pods or with processes outside Kubernetes, the value times the
// container's SM utilization over the larger of all the processes' SM utilization and the GPU's utilization (a GPU
// instance has none of its own). OpenCost averages a container's GPUs. estimate: GPUs without a performance monitor
// count their utilization as the activity.
func wantUsage(t *testing.T, estimate bool) map[string]float64 {
	snap, err := simulated.Demo().Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sum, n := map[string]float64{}, map[string]float64{}
	charge := func(whole float64, processes []gpu.Process, util gpu.Value) {
		pods, outside := podsOn(processes)
		busy, sm := 0.0, map[string]float64{}
		known := true
		for _, p := range processes {
			o := owner(p)
			key := o.Namespace + "/" + o.Pod + "/" + o.Container
			if o.Container == "" {
				busy += p.SMUtilizationRatio.V
				continue
			}
			known = known && p.SMUtilizationRatio.Valid
			sm[key] += p.SMUtilizationRatio.V
			busy += p.SMUtilizationRatio.V
		}
		if util.Valid {
			busy = math.Max(busy, util.V)
		}
		for key, v := range sm {
			switch {
			case pods == 1 && !outside:
				sum[key] += whole
			case known:
				sum[key] += whole * v / busy
			default:
				continue // not split: the GPU's series keeps it, without a container
			}
			n[key]++
		}
	}
	for _, d := range snap.Devices {
		if len(d.MIG) > 0 {
			seen := map[int]bool{}
			for _, m := range d.MIG {
				if seen[m.GPUInstance] || m.Profiling == nil || !m.Profiling.GraphicsEngineActive.Valid {
					continue
				}
				seen[m.GPUInstance] = true
				var processes []gpu.Process
				for _, p := range d.Processes {
					if p.MIG && p.GPUInstance == m.GPUInstance {
						processes = append(processes, p)
					}
				}
				charge(m.Profiling.GraphicsEngineActive.V, processes, gpu.Value{})
			}
			continue
		}
		switch {
		case d.Profiling != nil && d.Profiling.GraphicsEngineActive.Valid:
			charge(d.Profiling.GraphicsEngineActive.V, d.Processes, d.UtilizationRatio)
		case estimate && d.UtilizationRatio.Valid:
			charge(d.UtilizationRatio.V, d.Processes, d.UtilizationRatio)
		}
	}
	for key := range sum {
		sum[key] /= n[key]
	}
	return sum
}

// OpenCost's own usage query, in a real Prometheus that scrapes the demo node, charges each container its share of
// the GPUs it runs on: on the time-sliced H100 (GPU 0) each pod its SM share of the engine activity, not the whole
// GPU's; with the estimate, the pods before Hopper (the RTX 6000 Ada's transcoder, shared with a Docker container
// and a service) too. The shares of each GPU add up to its value.
func TestOpenCostUsage(t *testing.T) {
	for _, estimate := range []bool{false, true} {
		t.Run(fmt.Sprintf("estimate=%v", estimate), func(t *testing.T) {
			args := []string{"--demo", "--compat=dcgm"}
			if estimate {
				args = append(args, "--compat.dcgm-gr-engine-estimate")
			}
			prom := e2eutil.StartPrometheus(t, e2eutil.ScrapeConfig(exporter(t, args...)))
			want := wantUsage(t, estimate)
			var got map[string]float64
			testkit.WaitFor(t, 60*time.Second, "OpenCost's usage query to answer for every container", func() bool {
				res, err := e2eutil.TryQuery(prom, openCostUsage)
				got = map[string]float64{}
				for _, s := range res {
					got[s.Metric["namespace"]+"/"+s.Metric["pod"]+"/"+s.Metric["container"]] = s.Value
				}
				return err == nil && len(got) >= len(want)
			})
			compare(t, openCostUsage, got, want)
			const bert = "ml-training/bert-finetune-7c9d8b6f4-x2kqp/trainer"
			if math.Abs(got[bert]-0.70*0.41/0.71) > 1e-9 {
				t.Errorf("bert-finetune's usage = %v, want its SM share of GPU 0's 0.70: 0.70 × 0.41 / 0.71", got[bert])
			}
			const transcoder = "media/transcoder-5d8f7c9b6-2xkqp/ffmpeg"
			if _, ok := got[transcoder]; ok != estimate {
				t.Errorf("the transcoder on the RTX 6000 Ada (no monitor) has a usage: %v; want one only with the estimate", ok)
			}
			if estimate && math.Abs(got[transcoder]-0.19) > 1e-9 {
				t.Errorf("the transcoder's estimated usage = %v, want 0.37 × 0.19 / 0.37", got[transcoder])
			}

			// Per GPU, the series add up to the GPU's value: nothing is charged twice.
			snap, _ := simulated.Demo().Snapshot(context.Background())
			perGPU := e2eutil.ByLabel(e2eutil.Query(t, prom, `sum by (gpu) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID=""})`), "gpu")
			for _, d := range snap.Devices {
				g := strconv.Itoa(d.Index)
				w, ok := 0.0, false
				switch {
				case d.Profiling != nil && d.Profiling.GraphicsEngineActive.Valid:
					w, ok = d.Profiling.GraphicsEngineActive.V, true
				case estimate && len(d.MIG) == 0 && d.UtilizationRatio.Valid:
					w, ok = d.UtilizationRatio.V, true
				}
				if v, present := perGPU[g]; present != ok || math.Abs(v-w) > 1e-9 {
					t.Errorf("GPU %s: its DCGM_FI_PROF_GR_ENGINE_ACTIVE series add up to %v (present %v), want %v (present %v)", g, v, present, w, ok)
				}
			}
		})
	}
}

// --compat.dcgm-version=4.8.3 names the host label as that release does, and nothing else changes: upstream's
// dashboards of 4.8.3 and later group by hostname.
func TestDCGMVersionHostLabel(t *testing.T) {
	prom := e2eutil.StartPrometheus(t, e2eutil.ScrapeConfig(exporter(t, "--demo", "--compat=dcgm", "--compat.dcgm-version=4.6.0-4.8.3")))
	var res []e2eutil.Sample
	testkit.WaitFor(t, 60*time.Second, "the DCGM fields", func() bool {
		var err error
		res, err = e2eutil.TryQuery(prom, `count by (hostname, Hostname) (DCGM_FI_DEV_GPU_TEMP)`)
		return err == nil && len(res) > 0
	})
	if len(res) != 1 || res[0].Metric["hostname"] != nodeName || res[0].Metric["Hostname"] != "" || res[0].Value != 8 {
		t.Errorf("count by (hostname, Hostname) (DCGM_FI_DEV_GPU_TEMP) = %v, want 8 GPUs with hostname %q and no Hostname", res, nodeName)
	}
}
