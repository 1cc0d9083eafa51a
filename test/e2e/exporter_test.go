//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// --- the simulated GPU config -------------------------------------------------------------------------------------

// GPU 2 runs nothing: it is allocated to a pod that leaves it idle.
var gpuUUIDs = []string{"GPU-e2e00000-0000-4000-8000-000000000000", "GPU-e2e00001-0000-4000-8000-000000000001",
	"GPU-e2e00002-0000-4000-8000-000000000002"}

// gpuMinors are the GPUs' /dev/nvidiaN numbers, which NVIDIA's DRA driver names devices by; unlike the indices,
// as on real nodes where they differ.
var gpuMinors = []int{2, 0, 1}

// writeSimConfig writes the simulated node with the workloads' PIDs on their GPUs (docs/reference.md, "Simulated node file"),
// atomically, so that the running exporter never reads half a file.
func writeSimConfig(t *testing.T, path string, ws []*workload) {
	t.Helper()
	var b strings.Builder
	b.WriteString("driver_version: \"580.95.05\"\ncuda_version: \"13.0\"\ngpus:\n")
	for i, uuid := range gpuUUIDs {
		fmt.Fprintf(&b, "  - uuid: %s\n    name: NVIDIA H100 80GB HBM3\n    memory_total_bytes: 85520809984\n", uuid)
		fmt.Fprintf(&b, "    minor_number: %d\n", gpuMinors[i])
		fmt.Fprintf(&b, "    utilization_ratio: 0.5\n    processes:\n")
		n := 0
		for _, w := range ws {
			for _, g := range w.gpus {
				if g == i {
					fmt.Fprintf(&b, "      - pid: %d\n        type: compute\n        used_memory_bytes: %d\n"+
						"        sm_utilization_ratio: 0.25\n", w.pid, w.mem)
					n++
				}
			}
		}
		if n == 0 {
			b.WriteString("      []\n")
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// --- the exporter -------------------------------------------------------------------------------------------------

type exporter struct {
	*e2eutil.Exporter
	flags []string // source and attribution flags, shared with `ps`
}

// attributionFlags are the flags the serving exporter and `ps` share.
func attributionFlags(simConfig string) []string {
	return []string{
		"--gpu.simulated-config=" + simConfig,
		"--runtime.endpoint=unix://" + env.containerdSock,
		"--docker.host=unix://" + env.dockerSock,
		"--podman.host=unix://" + env.podmanSock,
		"--kubernetes.pod-labels=app,team",
	}
}

// startExporter runs the real binary and waits until it listens; it is stopped when the test ends, and its log is
// shown if the test failed.
func startExporter(t *testing.T, simConfig string) *exporter {
	t.Helper()
	if env.buildErr != nil {
		t.Fatalf("the exporter could not be built: %v", env.buildErr)
	}
	flags := attributionFlags(simConfig)
	// The kubelet's allocations are the server's, not ps's.
	args := append([]string{"--kubelet.pod-resources-endpoint=unix://" + filepath.Join(env.tmp, "kubelet.sock"),
		"--kubelet.refresh-interval=200ms"}, flags...)
	return &exporter{Exporter: e2eutil.StartExporter(t, env.binary, args...), flags: flags}
}

// scrape fetches and parses /metrics once.
func (e *exporter) scrape() (map[string]*dto.MetricFamily, error) {
	_, families, err := e2eutil.TryScrape(e.Addr)
	return families, err
}

// ps runs `gpu-pod-exporter ps --output json` with the same flags.
func (e *exporter) ps(t *testing.T) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.binary, append([]string{"ps", "--output=json"}, e.flags...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstderr:\n%s", strings.Join(cmd.Args, " "), err, stderr.String())
	}
	var rows []map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("ps --output json is not a JSON array of objects: %v\n%s", err, stdout.String())
	}
	return rows
}

// --- reading series -----------------------------------------------------------------------------------------------

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// processSeries returns the gpu_process_memory_used_bytes series of one PID, keyed by gpu index.
func processSeries(mfs map[string]*dto.MetricFamily, pid int) map[string][]map[string]string {
	out := map[string][]map[string]string{}
	for _, m := range mfs["gpu_process_memory_used_bytes"].GetMetric() {
		l := labelsOf(m)
		if l["pid"] == strconv.Itoa(pid) {
			out[l["gpu"]] = append(out[l["gpu"]], l)
		}
	}
	return out
}

// identityDiff compares the identity labels of a series with the expectation; "" means they match.
func identityDiff(got, want map[string]string) string {
	var d []string
	for _, k := range identityLabels {
		if got[k] != want[k] {
			d = append(d, fmt.Sprintf("%s=%q (want %q)", k, got[k], want[k]))
		}
	}
	return strings.Join(d, ", ")
}

// workloadIdentityDiff is identityDiff for workload series, which have every identity label but container_id (a
// container restarted in its pod continues its workload's series).
func workloadIdentityDiff(got, want map[string]string) string {
	var d []string
	for _, k := range identityLabels {
		switch _, has := got[k]; {
		case k == "container_id" && has:
			d = append(d, "container_id on a workload series")
		case k != "container_id" && got[k] != want[k]:
			d = append(d, fmt.Sprintf("%s=%q (want %q)", k, got[k], want[k]))
		}
	}
	return strings.Join(d, ", ")
}

// checkProcess returns what is wrong with one workload's process series in a scrape ("" when all is right).
// names=false checks only the cgroup-derived labels (pod_uid, container_id, slurm_job_id, systemd_unit).
func checkProcess(mfs map[string]*dto.MetricFamily, w *workload, names bool) string {
	series := processSeries(mfs, w.pid)
	var problems []string
	for _, g := range w.gpus {
		ss := series[strconv.Itoa(g)]
		if len(ss) != 1 {
			problems = append(problems, fmt.Sprintf("gpu %d: %d gpu_process_memory_used_bytes series for pid %d, want 1",
				g, len(ss), w.pid))
			continue
		}
		got := ss[0]
		if got["uuid"] != gpuUUIDs[g] {
			problems = append(problems, fmt.Sprintf("gpu %d: uuid=%q, want %q", g, got["uuid"], gpuUUIDs[g]))
		}
		if got["process_name"] != "sleep" {
			problems = append(problems, fmt.Sprintf("gpu %d: process_name=%q, want \"sleep\"", g, got["process_name"]))
		}
		if got["process_type"] != "compute" {
			problems = append(problems, fmt.Sprintf("gpu %d: process_type=%q, want \"compute\"", g, got["process_type"]))
		}
		want := w.want
		if !names {
			want = map[string]string{}
			for _, k := range identityLabels {
				want[k] = got[k]
			}
			for _, k := range []string{"pod_uid", "container_id", "slurm_job_id", "systemd_unit"} {
				want[k] = w.want[k]
			}
		}
		if d := identityDiff(got, want); d != "" {
			problems = append(problems, fmt.Sprintf("gpu %d: %s", g, d))
		}
	}
	for g := range series {
		n, _ := strconv.Atoi(g)
		if !containsInt(w.gpus, n) {
			problems = append(problems, fmt.Sprintf("unexpected series on gpu %s", g))
		}
	}
	if len(problems) == 0 {
		return ""
	}
	return fmt.Sprintf("%s (pid %d): %s", w.desc, w.pid, strings.Join(problems, "; "))
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// resolverErrors returns the error count of one resolver. docs/reference.md fixes only the prefix ("collection duration and
// errors per source and per resolver"), so a few plausible shapes are accepted; ok=false when none is exposed.
func resolverErrors(mfs map[string]*dto.MetricFamily, resolver string) (total float64, ok bool) {
	for _, name := range []string{"gpu_pod_exporter_resolver_requests_total", "gpu_pod_exporter_resolver_lookups_total",
		"gpu_pod_exporter_resolver_calls_total"} {
		for _, m := range mfs[name].GetMetric() {
			l := labelsOf(m)
			if l["resolver"] == resolver && (l["result"] == "error" || l["outcome"] == "error" || l["status"] == "error") {
				total += e2eutil.Value(m)
				ok = true
			}
		}
	}
	for _, name := range []string{"gpu_pod_exporter_resolver_errors_total", "gpu_pod_exporter_resolver_failures_total"} {
		for _, m := range mfs[name].GetMetric() {
			if labelsOf(m)["resolver"] == resolver {
				total += e2eutil.Value(m)
				ok = true
			}
		}
	}
	return total, ok
}

// cacheSize returns the number of containers in the exporter's name cache: the sum over the series of
// gpu_pod_exporter_resolver_cache_entries (by state: resolved, unresolved, pending), or else of another gauge named
// like gpu_pod_exporter_*cache*; ok=false when none is exposed.
func cacheSize(mfs map[string]*dto.MetricFamily) (total float64, name string, ok bool) {
	names := []string{"gpu_pod_exporter_resolver_cache_entries"}
	var others []string
	for n, mf := range mfs {
		if strings.HasPrefix(n, "gpu_pod_exporter_") && strings.Contains(n, "cache") && n != names[0] &&
			mf.GetType() == dto.MetricType_GAUGE {
			others = append(others, n)
		}
	}
	sort.Strings(others)
	for _, n := range append(names, others...) {
		mf, found := mfs[n]
		if !found {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += e2eutil.Value(m)
		}
		return total, n, true
	}
	return 0, "", false
}

// selfMetrics lists the exporter's own families, for failure messages.
func selfMetrics(mfs map[string]*dto.MetricFamily) string {
	var out []string
	for n := range mfs {
		if strings.HasPrefix(n, "gpu_pod_exporter_") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}
