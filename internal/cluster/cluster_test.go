package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/promapi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// fake answers each query of a Reader with the samples a test gives it by query.
type fake struct {
	r        *Reader
	mu       sync.Mutex
	answers  map[int][]promapi.Sample
	warnings map[int][]string
	errs     map[int]error
	asked    []string
	at       []time.Time
	ranges   [][2]time.Time
}

func newFake(cfg Config) *fake {
	f := &fake{answers: map[int][]promapi.Sample{}, warnings: map[int][]string{}, errs: map[int]error{}}
	f.r = New(f, cfg)
	return f
}

// now is the server's evaluation time in the tests.
const now = 1_800_000_000.0

func (f *fake) add(q int, value float64, labels ...string) {
	m := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		m[labels[i]] = labels[i+1]
	}
	f.answers[q] = append(f.answers[q], promapi.Sample{Metric: m, Value: value, Time: now})
}

func (f *fake) URL() string { return "http://prometheus:9090" }

func (f *fake) Query(ctx context.Context, expr string, at time.Time, each func(promapi.Sample) error) ([]string, error) {
	f.mu.Lock()
	f.asked = append(f.asked, expr)
	f.at = append(f.at, at)
	f.mu.Unlock()
	for i := range nQueries {
		if f.r.Expr(i) != expr {
			continue
		}
		if err := f.errs[i]; err != nil {
			return nil, err
		}
		for _, s := range f.answers[i] {
			// The client reuses its map: so does the fake, so that a reader that keeps it is caught.
			m := map[string]string{}
			for k, v := range s.Metric {
				m[k] = v
			}
			s.Metric = m
			if err := each(s); err != nil {
				return nil, err
			}
			clear(m)
		}
		return f.warnings[i], nil
	}
	return nil, fmt.Errorf("unknown query %s", expr)
}

// QueryRange answers a history query as Query answers an instant one: the samples a test gives it, at their times.
func (f *fake) QueryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration, each func(promapi.Sample) error) ([]string, error) {
	f.mu.Lock()
	f.ranges = append(f.ranges, [2]time.Time{start, end})
	f.mu.Unlock()
	return f.Query(ctx, expr, time.Time{}, each)
}

// healthy adds a node whose exporter answers, scraped every 15 s.
func (f *fake) healthy(node string) {
	f.add(qLastReading, now-3, "instance", node)
	f.add(qTargets, 1, "instance", node, "job", "gpe")
	f.add(qIntervals, 40, "instance", node, "job", "gpe")
	f.add(qExporters, 1, "instance", node, "__name__", "gpu_pod_exporter_source_up")
	f.add(qExporters, 0, "instance", node, "__name__", "gpu_pod_exporter_kubelet_unmapped_devices")
}

func process(node, gpu, uuid, pid, ns, pod string, more ...string) []string {
	return append([]string{"__name__", "gpu_process_memory_used_bytes", "instance", node, "job", "gpe", "gpu", gpu, "uuid", uuid,
		"pid", pid, "process_name", "python3", "process_type", "compute", "namespace", ns, "pod", pod, "container", "main",
		"pod_uid", "uid-" + pod, "container_id", "cid-" + pod}, more...)
}

func TestProcessesAreTheNodesRowsWithTheirNode(t *testing.T) {
	f := newFake(Config{})
	f.healthy("gpu-b")
	f.healthy("gpu-a")
	f.add(qProcessMemory, 2<<30, process("gpu-b", "1", "GPU-b1", "30", "ml", "train-0")...)
	f.add(qProcessMemory, 1<<30, process("gpu-a", "0", "GPU-a0", "20", "ml", "eval-0", "gpu_instance", "1", "compute_instance", "0")...)
	f.add(qProcessMemory, 3<<30, process("gpu-a", "0", "GPU-a0", "10", "", "", "slurm_job_id", "4711", "pod_uid", "", "container_id", "", "container", "", "user", "alice")...)
	f.add(qProcessSM, 0.25, "instance", "gpu-a", "uuid", "GPU-a0", "pid", "20", "gpu_instance", "1", "compute_instance", "0")
	f.add(qProcessSM, 0.5, "instance", "gpu-b", "uuid", "GPU-b1", "pid", "30")
	// A process the exporter has an SM utilization for and no memory reading: its labels are asked for then.
	f.add(qProcessSM, 0.75, "instance", "gpu-b", "uuid", "GPU-b0", "pid", "40")
	sm := process("gpu-b", "0", "GPU-b0", "40", "ml", "probe-0")
	sm[1] = "gpu_process_sm_utilization_ratio"
	f.add(qProcessSMOnly, 0.75, sm...)

	c, err := f.r.Read(context.Background(), What{})
	if err != nil {
		t.Fatal(err)
	}
	b := rowsJSON(t, c.Processes)
	want := `[` +
		`{"node":"gpu-a","gpu":0,"uuid":"GPU-a0","pid":10,"process_name":"python3","process_type":"compute","memory_used_bytes":3221225472,"sm_utilization_ratio":null,"gpu_instance":null,"compute_instance":null,"namespace":"","pod":"","container":"","pod_uid":"","container_id":"","runtime":"","slurm_job_id":"4711","systemd_unit":"","user":"alice"},` +
		`{"node":"gpu-a","gpu":0,"uuid":"GPU-a0","pid":20,"process_name":"python3","process_type":"compute","memory_used_bytes":1073741824,"sm_utilization_ratio":0.25,"gpu_instance":1,"compute_instance":0,"namespace":"ml","pod":"eval-0","container":"main","pod_uid":"uid-eval-0","container_id":"cid-eval-0","runtime":"","slurm_job_id":"","systemd_unit":"","user":""},` +
		`{"node":"gpu-b","gpu":0,"uuid":"GPU-b0","pid":40,"process_name":"python3","process_type":"compute","memory_used_bytes":null,"sm_utilization_ratio":0.75,"gpu_instance":null,"compute_instance":null,"namespace":"ml","pod":"probe-0","container":"main","pod_uid":"uid-probe-0","container_id":"cid-probe-0","runtime":"","slurm_job_id":"","systemd_unit":"","user":""},` +
		`{"node":"gpu-b","gpu":1,"uuid":"GPU-b1","pid":30,"process_name":"python3","process_type":"compute","memory_used_bytes":2147483648,"sm_utilization_ratio":0.5,"gpu_instance":null,"compute_instance":null,"namespace":"ml","pod":"train-0","container":"main","pod_uid":"uid-train-0","container_id":"cid-train-0","runtime":"","slurm_job_id":"","systemd_unit":"","user":""}]`
	if string(b) != want {
		t.Errorf("rows:\n%s\nwant\n%s", b, want)
	}
	// ps reads processes and health only: none of top's queries; the labels of processes without memory last.
	if len(f.asked) != 9 || f.asked[8] != f.r.Expr(qProcessSMOnly) {
		t.Errorf("ps asked %d queries, want 9, the last for processes without memory:\n%s", len(f.asked), strings.Join(f.asked, "\n"))
	}
	if len(c.GPUs) != 0 || len(c.Signals) != 0 {
		t.Errorf("ps read GPUs %v or signals %v", c.GPUs, c.Signals)
	}
	if got := c.Time; !got.Equal(time.Unix(now, 0)) {
		t.Errorf("time %v, want the server's evaluation time", got)
	}
}

// A process on two MIG instances of one GPU is two rows, as on the node, each with its own memory and SM.
func TestAProcessOnTwoMIGInstancesIsTwoRows(t *testing.T) {
	f := newFake(Config{})
	f.healthy("gpu-a")
	for _, gi := range []string{"1", "2"} {
		f.add(qProcessMemory, 1<<30, process("gpu-a", "0", "GPU-a0", "20", "ml", "eval-0", "gpu_instance", gi, "compute_instance", "0")...)
	}
	f.add(qProcessSM, 0.25, "instance", "gpu-a", "uuid", "GPU-a0", "pid", "20", "gpu_instance", "1", "compute_instance", "0")
	f.add(qProcessSM, 0.5, "instance", "gpu-a", "uuid", "GPU-a0", "pid", "20", "gpu_instance", "2", "compute_instance", "0")
	c, err := f.r.Read(context.Background(), What{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range c.Processes {
		got = append(got, fmt.Sprintf("%s %d %s", p.GPUColumn(), p.PID, view.Percent(p.SM)))
	}
	if want := []string{"0:1/0 20 25%", "0:2/0 20 50%"}; !slices.Equal(got, want) || c.Duplicates != 0 {
		t.Errorf("rows %q (%d duplicates), want %q", got, c.Duplicates, want)
	}
}

func TestNodeStates(t *testing.T) {
	f := newFake(Config{})
	f.healthy("up")
	// Down: Prometheus cannot scrape it; its series went stale 40 s ago and the subquery found the last one.
	f.add(qLastReading, now-40, "instance", "down")
	f.add(qTargets, 0, "instance", "down", "job", "gpe")
	f.add(qIntervals, 40, "instance", "down", "job", "gpe")
	// Stale: scraped every 15 s (40 samples in 10 minutes), last reading 31 s old.
	f.add(qLastReading, now-31, "instance", "lagging")
	f.add(qTargets, 1, "instance", "lagging", "job", "gpe")
	f.add(qIntervals, 40, "instance", "lagging", "job", "gpe")
	// Scraped every minute: 100 s is less than two intervals.
	f.add(qLastReading, now-100, "instance", "slow")
	f.add(qTargets, 1, "instance", "slow", "job", "gpe")
	f.add(qIntervals, 10, "instance", "slow", "job", "gpe")
	f.add(qExporters, 1, "instance", "slow", "__name__", "gpu_pod_exporter_source_up")
	// Its exporter answers, but cannot read the GPUs.
	f.healthy("blind")
	f.answers[qExporters] = append(f.answers[qExporters][:len(f.answers[qExporters])-2], promapi.Sample{Metric: map[string]string{"instance": "blind", "__name__": "gpu_pod_exporter_source_up"}, Time: now})
	// A target that is down and has never answered in the window.
	f.add(qTargets, 0, "instance", "never", "job", "gpe")
	// Gone: its target left (no up); the subquery last saw it 20 minutes ago, past the staleness bound: it has
	// left the view.
	f.add(qLastReading, now-1200, "instance", "gone")
	// Two exporter targets of one node, one of them down: the node is down.
	f.add(qLastReading, now-2, "instance", "twice")
	f.add(qTargets, 1, "instance", "twice", "job", "a")
	f.add(qTargets, 0, "instance", "twice", "job", "b")
	f.add(qExporters, 1, "instance", "twice", "__name__", "gpu_pod_exporter_source_up")

	c, err := f.r.Read(context.Background(), What{Top: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range c.Nodes {
		got = append(got, fmt.Sprintf("%s %q allocations=%v", n.Name, n.Problem(), n.AllocationsKnown))
	}
	want := []string{
		`blind "its exporter cannot read the GPUs" allocations=false`,
		`down "stale: exporter down, last reading 40s ago" allocations=false`,
		`lagging "stale: last reading 31s ago" allocations=false`,
		`never "stale: exporter down, no reading found" allocations=false`,
		`slow "" allocations=false`,
		`twice "stale: exporter down, last reading 2s ago" allocations=false`,
		`up "" allocations=true`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("nodes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// With the interval given, the samples of up are not asked for, and 31 s is within two 30 s intervals.
	f2 := newFake(Config{ScrapeInterval: 30 * time.Second})
	f2.answers = f.answers
	c, err = f2.r.Read(context.Background(), What{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if n.Name == "lagging" && n.State != view.NodeUp {
			t.Errorf("lagging with a 30 s interval: %s", n.Problem())
		}
	}
}

func TestNoExporterSeriesIsAnError(t *testing.T) {
	sel, _ := promapi.ParseSelector(`cluster="prod"`)
	f := newFake(Config{Selector: sel})
	_, err := f.r.Read(context.Background(), What{})
	want := `no gpu-pod-exporter series in Prometheus at http://prometheus:9090: max by (instance) (timestamp(gpu_pod_exporter_build_info{cluster="prod"})) or max by (instance) (max_over_time(timestamp(gpu_pod_exporter_build_info{cluster="prod"})[2m:1s]))`
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), "found nothing") {
		t.Errorf("error %v", err)
	}
}

func TestAFailedQueryFailsTheReading(t *testing.T) {
	f := newFake(Config{})
	f.healthy("gpu-a")
	boom := errors.New("Prometheus at http://prometheus:9090: execution: too many samples")
	f.errs[qProcessMemory] = boom
	if _, err := f.r.Read(context.Background(), What{}); !errors.Is(err, boom) {
		t.Errorf("error %v, want %v", err, boom)
	}
}

func TestWarningsAreKept(t *testing.T) {
	f := newFake(Config{})
	f.healthy("gpu-a")
	f.warnings[qProcessMemory] = []string{"warning: partial response: store b unavailable"}
	f.warnings[qProcessSM] = []string{"warning: partial response: store b unavailable", "info: metric might not be a counter"}
	f.add(qProcessMemory, 1, process("gpu-a", "x", "GPU-a0", "20", "ml", "eval-0")...)
	c, err := f.r.Read(context.Background(), What{})
	if err != nil {
		t.Fatal(err)
	}
	want := "[Prometheus warning: partial response: store b unavailable Prometheus info: metric might not be a counter " +
		"1 series of process memory left out: a gpu, pid or MIG instance label that is not a number]"
	if fmt.Sprint(c.Warnings) != want {
		t.Errorf("warnings %v\nwant %s", c.Warnings, want)
	}
}

func TestGPULinesAndSignals(t *testing.T) {
	f := newFake(Config{NodeLabel: "node"})
	// The node label, where targets have one; a series without it is named by its instance.
	f.add(qLastReading, now-1, "node", "gpu-a", "instance", "10.0.0.1:9402")
	f.add(qTargets, 1, "node", "gpu-a", "instance", "10.0.0.1:9402", "job", "gpe")
	f.add(qExporters, 1, "node", "gpu-a", "instance", "10.0.0.1:9402", "__name__", "gpu_pod_exporter_source_up")
	f.add(qExporters, 0, "node", "gpu-a", "instance", "10.0.0.1:9402", "__name__", "gpu_pod_exporter_kubelet_unmapped_devices")
	f.add(qExporters, 1, "node", "gpu-a", "instance", "10.0.0.1:9402", "__name__", "gpu_info", "simulated", "true")
	f.add(qLastReading, now-1, "instance", "10.0.0.2:9402")
	f.add(qExporters, 1, "instance", "10.0.0.2:9402", "__name__", "gpu_pod_exporter_source_up")
	gpu := func(node string, idx int, mig string) {
		f.add(qGPUs, 1, "node", node, "instance", "i", "gpu", fmt.Sprint(idx), "uuid", fmt.Sprintf("GPU-%s-%d", node, idx),
			"name", "NVIDIA H100 80GB HBM3", "mig_mode", mig)
	}
	reading := func(node string, idx int, name string, v float64) {
		f.add(qGPUReadings, v, "node", node, "uuid", fmt.Sprintf("GPU-%s-%d", node, idx), "__name__", name)
	}
	for i := range 5 {
		gpu("gpu-a", i, "disabled")
	}
	gpu("gpu-a", 5, "enabled")
	gpu("10.0.0.2:9402", 0, "")
	reading("gpu-a", 0, "gpu_workloads", 2)
	reading("gpu-a", 0, "gpu_utilization_ratio", 0.5)
	reading("gpu-a", 0, "gpu_memory_used_bytes", 40<<30)
	reading("gpu-a", 0, "gpu_memory_total_bytes", 80<<30)
	reading("gpu-a", 0, "gpu_temperature_celsius", 50)
	reading("gpu-a", 0, "gpu_power_usage_watts", 300)
	reading("gpu-a", 1, "gpu_workloads", 3)
	f.add(qMPS, 3, "node", "gpu-a", "uuid", "GPU-gpu-a-1")
	reading("gpu-a", 2, "gpu_workloads", 1)
	reading("gpu-a", 3, "gpu_workloads", 0)
	// GPU 4's process list could not be read: no gpu_workloads.
	reading("gpu-a", 5, "gpu_workloads", 2)
	f.add(qMIG, 3, "node", "gpu-a", "uuid", "GPU-gpu-a-5")
	f.add(qAllocatedPods, 2, "node", "gpu-a", "uuid", "GPU-gpu-a-0")
	f.add(qAllocatedPods, 1, "node", "gpu-a", "uuid", "GPU-gpu-a-3")
	f.add(qIdle, 0, "node", "gpu-a", "gpu", "3", "uuid", "GPU-gpu-a-3", "namespace", "ml", "pod", "idle-0", "container", "nb")
	f.add(qIdle, 0, "node", "gpu-a", "gpu", "5", "uuid", "GPU-gpu-a-5", "gpu_instance", "2", "compute_instance", "0",
		"namespace", "ml", "pod", "mig-0", "container", "nb")
	f.add(qUnrequested, 1, "node", "gpu-a", "gpu", "2", "uuid", "GPU-gpu-a-2", "namespace", "ds", "pod", "sneaky-0", "container", "jupyter")

	c, err := f.r.Read(context.Background(), What{Top: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range c.GPUs {
		got = append(got, fmt.Sprintf("%s %d %s %s inUse=%v alloc=%d idle=%d unreq=%d unknown=%v util=%v mem=%v/%v %v°C %vW", g.Node,
			g.Index, g.Name, g.Mode(), g.InUse(), g.AllocatedPods, g.IdlePods, g.Unrequested, g.AllocationsUnknown, g.Utilization,
			g.MemoryUsed, g.MemoryTotal, g.Temperature, g.Power))
	}
	want := []string{
		"10.0.0.2:9402 0 H100 80GB HBM3 ? inUse=false alloc=0 idle=0 unreq=0 unknown=true util={0 false} mem={0 false}/{0 false} {0 false}°C {0 false}W",
		"gpu-a 0 H100 80GB HBM3 shared ×2 inUse=true alloc=2 idle=0 unreq=0 unknown=false util={0.5 true} mem={4.294967296e+10 true}/{8.589934592e+10 true} {50 true}°C {300 true}W",
		"gpu-a 1 H100 80GB HBM3 MPS ×3 inUse=true alloc=0 idle=0 unreq=0 unknown=false util={0 false} mem={0 false}/{0 false} {0 false}°C {0 false}W",
		"gpu-a 2 H100 80GB HBM3 1 workload inUse=true alloc=0 idle=0 unreq=1 unknown=false util={0 false} mem={0 false}/{0 false} {0 false}°C {0 false}W",
		"gpu-a 3 H100 80GB HBM3 idle inUse=false alloc=1 idle=1 unreq=0 unknown=false util={0 false} mem={0 false}/{0 false} {0 false}°C {0 false}W",
		"gpu-a 4 H100 80GB HBM3 ? inUse=false alloc=0 idle=0 unreq=0 unknown=false util={0 false} mem={0 false}/{0 false} {0 false}°C {0 false}W",
		"gpu-a 5 H100 80GB HBM3 MIG ×3 inUse=true alloc=0 idle=1 unreq=0 unknown=false util={0 false} mem={0 false}/{0 false} {0 false}°C {0 false}W",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("GPUs:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var sigs []string
	for _, s := range c.Signals {
		sigs = append(sigs, s.String())
	}
	// By severity: the use that costs someone else their GPU first.
	wantSigs := []string{
		"unrequested use: ds/sneaky-0/jupyter on GPU 2 of gpu-a",
		"idle allocation: ml/idle-0/nb holds GPU 3 of gpu-a",
		"idle allocation: ml/mig-0/nb holds GPU 5:2/0 of gpu-a",
	}
	if strings.Join(sigs, "\n") != strings.Join(wantSigs, "\n") {
		t.Errorf("signals:\n%s", strings.Join(sigs, "\n"))
	}
	if len(c.Nodes) != 2 || !c.Nodes[1].Simulated || c.Nodes[1].Name != "gpu-a" || !c.Nodes[1].AllocationsKnown || c.Nodes[0].AllocationsKnown {
		t.Errorf("nodes %+v", c.Nodes)
	}
	// Every query but the follow-up, which no process calls for, and the workloads' history, which only the
	// grouped view asks for.
	if len(f.asked) != int(nQueries)-2 || slices.Contains(f.asked, f.r.Expr(qProcessSMOnly)) || slices.Contains(f.asked, f.r.Expr(qWorkloadHistory)) {
		t.Errorf("top asked %d queries, want %d:\n%s", len(f.asked), nQueries-2, strings.Join(f.asked, "\n"))
	}
}

// Every vector selector of every query carries the selector, and every grouping the node label: nothing is read
// outside what the person asked for, and no node is merged with another.
func TestQueriesCarryTheSelectorAndTheNodeLabel(t *testing.T) {
	sel, _ := promapi.ParseSelector(`cluster="prod",instance=~"gpu-.*"`)
	r := New(nil, Config{Selector: sel, NodeLabel: "node", ScrapeInterval: 30 * time.Second})
	selector := regexp.MustCompile(`(^|[^"|a-z_])((?:up|gpu_[a-z_]+)(\{[^}]*\})?)`)
	grouping := regexp.MustCompile(`(by|on) \(([^)]*)\)`)
	for i := range nQueries {
		expr := r.Expr(i)
		found := 0
		// The families are what is left of the query without its groupings, which name labels (gpu_instance).
		for _, m := range selector.FindAllStringSubmatch(grouping.ReplaceAllString(expr, ""), -1) {
			if strings.HasSuffix(m[2], "_total") || m[2] == "gpu_"+"" {
				continue
			}
			found++
			if !strings.Contains(m[3], `cluster="prod",instance=~"gpu-.*"`) {
				t.Errorf("%s: %s without the selector", queries[i].name, m[2])
			}
		}
		if !strings.Contains(expr, `__name__=~`) && found == 0 {
			t.Errorf("%s: no selector found in %s", queries[i].name, expr)
		}
		for _, m := range grouping.FindAllStringSubmatch(expr, -1) {
			if m[2] != "job" && !strings.HasPrefix(m[2], "node, instance") {
				t.Errorf("%s: grouping %s without the node", queries[i].name, m[0])
			}
		}
	}
	if got := r.Expr(qLastReading); !strings.Contains(got, "[1h:30s]") {
		t.Errorf("the subquery steps at the scrape interval: %s", got)
	}
	if got := New(nil, Config{ScrapeInterval: 200 * time.Millisecond}).Expr(qLastReading); !strings.Contains(got, "[1h:1s]") {
		t.Errorf("the subquery steps a second at least: %s", got)
	}
	if got := New(nil, Config{}).Expr(qLastReading); !strings.Contains(got, "[1h:15s]") {
		t.Errorf("the subquery steps 15s without an interval: %s", got)
	}
}

// The reading asks for the time it was given.
func TestReadAtATime(t *testing.T) {
	at := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	f := newFake(Config{At: at})
	f.healthy("gpu-a")
	if _, err := f.r.Read(context.Background(), What{}); err != nil {
		t.Fatal(err)
	}
	for _, got := range f.at {
		if !got.Equal(at) {
			t.Errorf("asked at %v, want %v", got, at)
		}
	}
}

// rowsJSON is the processes as ps -o json writes them, compact.
func rowsJSON(t *testing.T, procs []view.Process) []byte {
	t.Helper()
	var buf, compact bytes.Buffer
	if err := ps.WriteJSON(&buf, procs); err != nil {
		t.Fatal(err)
	}
	if err := json.Compact(&compact, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	return compact.Bytes()
}

// A GPU's health is read from the families of the health alerts, as the node reads it: the same words, the same
// order, in a signal per GPU for ps' notes and top's health line, the most severe first.
func TestHealthIsTheNodesHealth(t *testing.T) {
	f := newFake(Config{})
	f.healthy("gpu-a")
	f.healthy("gpu-b")
	h := func(node, idx, name string, v float64, more ...string) {
		f.add(qGPUHealth, v, append([]string{"instance", node, "gpu", idx, "uuid", "GPU-" + node + idx, "__name__", name}, more...)...)
	}
	h("gpu-a", "6", "gpu_recovery_action", 1)
	h("gpu-a", "6", "gpu_row_remap_pending", 1)
	h("gpu-a", "6", "gpu_xid_errors_total", 1, "xid", "63")
	h("gpu-a", "6", "gpu_xid_errors_total", 2, "xid", "48")
	h("gpu-b", "3", "gpu_pcie_link_width", 8)
	h("gpu-b", "3", "gpu_pcie_link_max_width", 16)
	h("gpu-b", "4", "gpu_clock_event_active", 1, "reason", "sw_power_cap")
	h("gpu-b", "5", "gpu_nvlink_links", 16, "state", "active")
	h("gpu-b", "5", "gpu_nvlink_links", 2, "state", "inactive")
	c, err := f.r.Read(context.Background(), What{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range c.Signals {
		got = append(got, s.String())
	}
	want := []string{
		"GPU 6 of gpu-a: needs GPU reset, row remap pending, XID 48, 63",
		"GPU 3 of gpu-b: PCIe x8 of x16",
		"GPU 4 of gpu-b: at power cap",
		"GPU 5 of gpu-b: 2 of 18 NVLinks down",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("signals:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// ps reads no GPU lines: the nodes have no GPU count made up of their unhealthy ones.
	for _, n := range c.Nodes {
		if n.GPUs != 0 {
			t.Errorf("node %s has %d GPUs", n.Name, n.GPUs)
		}
	}
}

// One exporter scraped by two jobs is one node: a process is one (GPU UUID, PID), a GPU one UUID, an allocation
// signal one; where the jobs name the node differently, its name keeps it over its address, and the other is gone.
// The reading says how many series it read twice.
// A process with neither a memory nor an SM reading has no series to be a row: the GPUs' process counts say how
// many a reading could not list, and where, rather than let them go missing without a word.
func TestProcessesWithoutReadingsAreCounted(t *testing.T) {
	f := newFake(Config{})
	f.healthy("gpu-a")
	f.healthy("gpu-b")
	f.add(qProcessMemory, 1<<30, process("gpu-a", "0", "GPU-a0", "10", "ml", "a")...)
	f.add(qProcessSM, 0.5, "instance", "gpu-a", "uuid", "GPU-a0", "pid", "11")
	sm := process("gpu-a", "0", "GPU-a0", "11", "ml", "b")
	sm[1] = "gpu_process_sm_utilization_ratio"
	f.add(qProcessSMOnly, 0.5, sm...)
	f.add(qProcessMemory, 1<<30, process("gpu-b", "0", "GPU-b0", "10", "ml", "c")...)
	f.add(qProcessCounts, 3, "instance", "gpu-a", "gpu", "0", "uuid", "GPU-a0") // one has no series
	for i := range 5 {
		f.add(qProcessCounts, 2, "instance", "gpu-a", "gpu", fmt.Sprint(i+1), "uuid", fmt.Sprint("GPU-a", i+1)) // none has
	}
	f.add(qProcessCounts, 1, "instance", "gpu-b", "gpu", "0", "uuid", "GPU-b0")
	f.add(qProcessCounts, 4, "instance", "gpu-gone", "gpu", "0", "uuid", "GPU-c0") // not a current node's
	c, err := f.r.Read(context.Background(), What{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Processes) != 3 {
		t.Errorf("%d rows, want 3", len(c.Processes))
	}
	want := "11 processes not listed: their exporters wrote no memory or SM utilization series for them (none known, " +
		"or --no-collector.processes): 1 on GPU 0 of gpu-a, 2 on GPU 1 of gpu-a, 2 on GPU 2 of gpu-a, 3 more GPUs"
	if !slices.Equal(c.Warnings, []string{want}) {
		t.Errorf("warnings %q, want %q", c.Warnings, want)
	}
}

func TestANodeScrapedTwiceIsShownOnce(t *testing.T) {
	f := newFake(Config{})
	for _, node := range []string{"gpu-a", "10.0.0.1:9402"} {
		f.healthy(node)
		for _, job := range []string{"servicemonitor", "annotations"} {
			f.add(qProcessMemory, 1<<30, process(node, "0", "GPU-a0", "20", "ml", "train-0", "job", job)...)
			f.add(qGPUs, 1, "instance", node, "job", job, "gpu", "0", "uuid", "GPU-a0", "name", "NVIDIA H100")
			f.add(qUnrequested, 1, "instance", node, "job", job, "gpu", "0", "uuid", "GPU-a0", "namespace", "ds", "pod", "x", "container", "c")
		}
		f.add(qProcessSM, 0.5, "instance", node, "uuid", "GPU-a0", "pid", "20")
		f.add(qProcessCounts, 1, "instance", node, "gpu", "0", "uuid", "GPU-a0")
	}
	c, err := f.r.Read(context.Background(), What{Top: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Processes) != 1 || c.Processes[0].Node != "gpu-a" || len(c.GPUs) != 1 || len(c.Signals) != 1 || len(c.Nodes) != 1 {
		t.Errorf("%d processes, %d GPUs, %d signals, %d nodes: %+v", len(c.Processes), len(c.GPUs), len(c.Signals), len(c.Nodes), c.Nodes)
	}
	if c.Duplicates != 3+3+3 {
		t.Errorf("%d duplicates, want 9 (3 of each: process rows, GPUs, signals)", c.Duplicates)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings %q", c.Warnings)
	}
}

// A value that is not a number, infinite, or outside what its family can hold is unknown: absent, null in JSON,
// never a failure of the whole reading nor a fake number, and counted.
func TestUnknownValuesAreAbsent(t *testing.T) {
	f := newFake(Config{})
	f.healthy("gpu-a")
	f.add(qProcessMemory, math.NaN(), process("gpu-a", "0", "GPU-a0", "10", "ml", "a")...)
	f.add(qProcessMemory, -1, process("gpu-a", "0", "GPU-a0", "11", "ml", "b")...)
	f.add(qProcessMemory, math.Inf(1), process("gpu-a", "0", "GPU-a0", "12", "ml", "c")...)
	f.add(qProcessMemory, 1<<30, process("gpu-a", "0", "GPU-a0", "13", "ml", "d")...)
	f.add(qProcessSM, math.NaN(), "instance", "gpu-a", "uuid", "GPU-a0", "pid", "10")
	f.add(qProcessSM, 7, "instance", "gpu-a", "uuid", "GPU-a0", "pid", "13")
	c, err := f.r.Read(context.Background(), What{})
	if err != nil {
		t.Fatal(err)
	}
	b := string(rowsJSON(t, c.Processes))
	if strings.Count(b, `"memory_used_bytes":null`) != 3 || strings.Count(b, `"sm_utilization_ratio":null`) != 4 ||
		!strings.Contains(b, `"memory_used_bytes":1073741824`) {
		t.Errorf("rows: %s", b)
	}
	if c.Dropped != 5 {
		t.Errorf("%d values dropped, want 5", c.Dropped)
	}
}

// A node whose target is gone from Prometheus leaves the view once its last reading is past the staleness bound;
// until then it is stale, and a stale node's GPUs, processes and signals are not shown.
func TestDepartedNodesLeave(t *testing.T) {
	f := newFake(Config{})
	f.healthy("gpu-a")
	f.add(qLastReading, now-(Departed.Seconds()-10), "instance", "leaving")
	f.add(qLastReading, now-(Departed.Seconds()+10), "instance", "left")
	f.add(qProcessMemory, 1, process("leaving", "0", "GPU-l0", "10", "ml", "a")...)
	f.add(qIdle, 0, "instance", "leaving", "gpu", "0", "uuid", "GPU-l0", "namespace", "ml", "pod", "a", "container", "c")
	c, err := f.r.Read(context.Background(), What{Top: true})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range c.Nodes {
		nodes = append(nodes, n.Name+" "+n.StateText())
	}
	if fmt.Sprint(nodes) != "[gpu-a up leaving stale 4m]" || len(c.Processes) != 0 || len(c.Signals) != 1 ||
		c.Signals[0].String() != "node leaving: stale: last reading 4m ago" {
		t.Errorf("nodes %v, %d processes, signals %v", nodes, len(c.Processes), c.Signals)
	}
}

// The history is read with one range query per family, whatever the number of nodes; the next reading reads only
// the steps since, and keeps the points it does not read again.
func TestHistoryIsReadOnceAndKept(t *testing.T) {
	f := newFake(Config{})
	f.healthy("gpu-a")
	f.add(qGPUs, 1, "instance", "gpu-a", "gpu", "0", "uuid", "GPU-a0", "name", "NVIDIA H100")
	clock := time.Unix(now, 0)
	f.r.now = func() time.Time { return clock }
	at := func(ago time.Duration, v float64) promapi.Sample {
		return promapi.Sample{Metric: map[string]string{"instance": "gpu-a", "uuid": "GPU-a0"}, Value: v,
			Time: float64(clock.Add(-ago).Unix())}
	}
	f.answers[qUtilizationHistory] = []promapi.Sample{at(50*time.Second, 0.1), at(10*time.Second, 0.5), at(0, 0.6)}
	c, err := f.r.Read(context.Background(), What{Top: true})
	if err != nil {
		t.Fatal(err)
	}
	points := c.History.GPUs[view.GPUKey("gpu-a", "GPU-a0")].Utilization
	n := view.HistoryPoints
	if points[n-1] != 0.6 || points[n-2] != 0.5 || points[n-6] != 0.1 || !math.IsNaN(points[n-3]) {
		t.Errorf("history ends %v", points[n-6:])
	}
	if len(f.ranges) != 2 || !f.ranges[0][0].Equal(clock.Add(-view.HistorySpan+10*time.Second)) || !f.ranges[0][1].Equal(clock) {
		t.Fatalf("ranges asked: %v", f.ranges)
	}
	// 20 s later: the two steps since, and what was read before, two steps older.
	clock = clock.Add(20 * time.Second)
	f.ranges = nil
	f.answers[qUtilizationHistory] = []promapi.Sample{at(0, 0.9)}
	c, err = f.r.Read(context.Background(), What{Top: true})
	if err != nil {
		t.Fatal(err)
	}
	points = c.History.GPUs[view.GPUKey("gpu-a", "GPU-a0")].Utilization
	if points[n-1] != 0.9 || points[n-3] != 0.6 || points[n-4] != 0.5 || points[n-8] != 0.1 {
		t.Errorf("history ends %v", points[n-8:])
	}
	if len(f.ranges) != 2 || !f.ranges[0][0].Equal(clock.Add(-10*time.Second)) {
		t.Errorf("ranges asked the second time: %v", f.ranges)
	}
	// A reading of the same instant asks nothing of the past again.
	f.ranges = nil
	if _, err := f.r.Read(context.Background(), What{Top: true}); err != nil || len(f.ranges) != 0 {
		t.Errorf("the same instant read the past again: %v %v", f.ranges, err)
	}
}

// The answers of a reading are bounded by Config.MaxAnswerBytes, all its queries together: a Prometheus whose
// answers are 1.5 MiB each is read under the default budget and fails under a budget of 4 MiB, naming it.
func TestTheAnswersBudgetIsTheConfigs(t *testing.T) {
	var body bytes.Buffer
	body.WriteString(`{"status":"success","data":{"resultType":"vector","result":[`)
	for i := 0; body.Len() < 3<<19; i++ {
		if i > 0 {
			body.WriteByte(',')
		}
		fmt.Fprintf(&body, `{"metric":{"instance":"gpu-%d"},"value":[1800000000,"1"]}`, i)
	}
	body.WriteString(`]}}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/query_range") {
			w.Write([]byte(`{"status":"success","data":{"resultType":"matrix","result":[]}}`))
			return
		}
		w.Write(body.Bytes())
	}))
	defer srv.Close()
	client, err := promapi.New(srv.URL, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(client, Config{}).Read(t.Context(), What{Top: true}); err != nil {
		t.Errorf("under the default budget: %v", err)
	}
	_, err = New(client, Config{MaxAnswerBytes: 4 << 20}).Read(t.Context(), What{Top: true})
	if !errors.Is(err, promapi.ErrTooLarge) || !strings.Contains(err.Error(), "larger than 4 MiB in all") {
		t.Errorf("under a budget of 4 MiB: %v", err)
	}
}
