//go:build e2e

// Package cluster runs `ps --prometheus` and `top --prometheus` end to end: three exporters on three simulated
// nodes (one with MIG, one with an unrequested use, one whose kubelet holds a GPU idle), scraped by a real
// Prometheus that serves its API only over TLS with a client certificate and basic auth, and the real binary
// reading it as a person would, in tmux for top.
package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/config"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/cluster"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/configfile"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet/fake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/promapi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/tmuxterm"
)

var binary string

func TestMain(m *testing.M) { e2eutil.Main(m, &binary) }

// interval is Prometheus' scrape interval here.
const interval = time.Second

// fleet is the running cluster: the exporters by node, their node files, and Prometheus with the client
// configurations that reach it.
type fleet struct {
	prom      string // https://127.0.0.1:port
	auth      string // HTTP client configuration with the CA, a client certificate and the password
	noAuth    string // the same without the password
	exporters map[string]*e2eutil.Exporter
	files     map[string]string
}

func startFleet(t *testing.T) *fleet {
	dir := testkit.SocketDir(t)
	f := &fleet{exporters: map[string]*e2eutil.Exporter{}, files: map[string]string{}}
	for node, body := range map[string]string{"gpu-a": gpuA, "gpu-b": gpuB, "gpu-c": gpuC} {
		f.files[node] = filepath.Join(dir, node+".yaml")
		write(t, f.files[node], body)
	}
	// gpu-c's kubelet: vllm-0 holds GPU 0 and runs on it; idle-0 holds GPU 1 and runs nothing.
	sock := filepath.Join(dir, "kubelet.sock")
	kubelet, err := fake.Start(sock, []fake.Device{
		{Namespace: "inference", Pod: "vllm-0", Container: "server", Resource: "nvidia.com/gpu", IDs: []string{"GPU-cccccccc-0000-4000-8000-000000000000"}},
		{Namespace: "ml", Pod: "idle-0", Container: "notebook", Resource: "nvidia.com/gpu", IDs: []string{"GPU-cccccccc-1111-4000-8000-000000000000"}},
	}, map[string][]string{"nvidia.com/gpu": {"GPU-cccccccc-0000-4000-8000-000000000000", "GPU-cccccccc-1111-4000-8000-000000000000"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kubelet.Stop)
	for _, node := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		args := []string{"--gpu.simulated-config=" + f.files[node]}
		if node == "gpu-c" {
			args = append(args, "--kubelet.pod-resources-endpoint=unix://"+sock, "--kubelet.refresh-interval=200ms")
		}
		f.exporters[node] = e2eutil.StartExporter(t, binary, args...)
	}
	var targets strings.Builder
	for _, node := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		// The node's name as instance, as the chart's ServiceMonitor writes it.
		fmt.Fprintf(&targets, "      - {targets: [%q], labels: {instance: %s, cluster: lab}}\n", f.exporters[node].Addr, node)
	}
	// gpu-a is scraped twice more, as a ServiceMonitor and annotation-based discovery both would: one job names it
	// by its address, another by its name as the first job does (its series twice under one instance).
	config := fmt.Sprintf("global:\n  scrape_interval: %s\nscrape_configs:\n  - job_name: gpu-pod-exporter\n    static_configs:\n%s"+
		"  - job_name: annotations\n    static_configs:\n      - {targets: [%q], labels: {cluster: lab}}\n"+
		"  - job_name: same-instance\n    static_configs:\n      - {targets: [%q], labels: {instance: gpu-a, cluster: lab}}\n",
		interval, targets.String(), f.exporters["gpu-a"].Addr, f.exporters["gpu-a"].Addr)
	f.prom, f.auth, f.noAuth = startSecurePrometheus(t, config)
	return f
}

// ps runs `ps --prometheus` with the client configuration and args, and returns stdout, stderr and the exit status.
func (f *fleet) ps(t *testing.T, httpConfig string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	args = append([]string{"ps", "--prometheus=" + f.prom}, args...)
	if httpConfig != "" {
		args = append(args, "--http.config.file="+httpConfig)
	}
	return run(t, args...)
}

func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("%v: %v", args, err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

func TestClusterThroughPrometheus(t *testing.T) {
	f := startFleet(t)
	// Every node scraped (gpu-a by both jobs), and its allocations read: a cluster ps without a warning.
	var last string
	testkit.WaitFor(t, 30*time.Second, "the three nodes in Prometheus", func() bool {
		out, errOut, code := f.ps(t, f.auth, "-o", "json")
		last = errOut
		return code == 0 && !strings.Contains(errOut, "warning:") && strings.Count(out, `"node": "gpu-`) == 7 &&
			strings.Contains(errOut, "read twice")
	})
	if t.Failed() {
		t.Fatalf("last stderr: %s", last)
	}

	t.Run("ps is the nodes' ps with their node", func(t *testing.T) { testPS(t, f) })
	t.Run("a node scraped twice under one instance is counted once", func(t *testing.T) { testOneInstanceTwice(t, f) })
	t.Run("credentials", func(t *testing.T) { testCredentials(t, f) })
	term := tmuxterm.Start(t, 120, 40, "sh", "-c", `"$0" "$@"; echo "top exited $?"; read -r done`, binary, "top",
		"--prometheus="+f.prom, "--http.config.file="+f.auth, "--interval=300ms", "--prometheus.scrape-interval="+interval.String())
	t.Run("top", func(t *testing.T) { testTop(t, term) })
	t.Run("a stopped exporter's node is stale", func(t *testing.T) { testStale(t, f, term) })
	term.Keys("q")
	term.WaitForText("top exited 0")
}

// `ps --prometheus -o json` is the union of the three nodes' own `ps -o json`, each row with its node first,
// the keys in the same order, the values the same; `runtime` is the one key Prometheus does not carry. gpu-a,
// scraped by two jobs, is there once, by its name; the notes on stderr say so, and say the GPUs' health as the
// nodes' own ps say it.
func testPS(t *testing.T, f *fleet) {
	out, errOut, code := f.ps(t, f.auth, "-o", "json")
	if code != 0 || strings.Contains(errOut, "warning:") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	wantNotes := "# simulated GPU data (--demo or --gpu.simulated-config)\n" +
		"# GPU 0 of gpu-b: needs GPU reset, XID 48\n" +
		"# GPU 1 of gpu-c: PCIe x8 of x16\n"
	if !strings.HasPrefix(errOut, wantNotes) || !regexp.MustCompile(`\n# \d+ series read twice \(a node scraped by two jobs\): each is shown once\n$`).MatchString(errOut) {
		t.Errorf("notes:\n%s\nwant them to start with\n%s", errOut, wantNotes)
	}
	for _, node := range []string{"gpu-b", "gpu-c"} {
		_, nodeErr, _ := run(t, "ps", "--gpu.simulated-config="+f.files[node])
		for _, l := range strings.Split(nodeErr, "\n") {
			if strings.HasPrefix(l, "# GPU ") && !strings.Contains(errOut, strings.Replace(l, ":", " of "+node+":", 1)+"\n") {
				t.Errorf("%s's ps says %q; the cluster's does not", node, l)
			}
		}
	}
	cluster := decodeRows(t, out)
	var want []map[string]any
	var wantKeys [][]string
	for _, node := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		nodeOut, nodeErr, code := run(t, "ps", "-o", "json", "--gpu.simulated-config="+f.files[node])
		if code != 0 {
			t.Fatalf("ps on %s: exit %d: %s", node, code, nodeErr)
		}
		for _, row := range decodeRows(t, nodeOut) {
			row.values["node"] = node
			if row.values["runtime"] != "" {
				if node != "gpu-a" || row.values["runtime"] != "containerd" {
					t.Errorf("a runtime the node file does not set: %v", row.values)
				}
				row.values["runtime"] = "" // not on the process series
			}
			want = append(want, row.values)
			wantKeys = append(wantKeys, append([]string{"node"}, row.keys...))
		}
	}
	if len(cluster) != len(want) {
		t.Fatalf("%d rows from Prometheus, %d from the nodes:\n%s", len(cluster), len(want), out)
	}
	for i, row := range cluster {
		if !reflect.DeepEqual(row.values, want[i]) {
			t.Errorf("row %d:\n%v\nwant\n%v", i, row.values, want[i])
		}
		if !reflect.DeepEqual(row.keys, wantKeys[i]) {
			t.Errorf("row %d keys %v, want %v", i, row.keys, wantKeys[i])
		}
	}

	// The table: a NODE column, the filters as on a node, and the selector narrowing every query.
	out, errOut, code = f.ps(t, f.auth, "--namespace=vision")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 ||
		!regexp.MustCompile(`^NODE +GPU +PID +PROCESS +MEMORY +SM +OWNER$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^gpu-a +0:1/0 +9000101 +python3 +8\.0 GiB +35% +pod vision/resnet-train-0/train$`).MatchString(lines[1]) {
		t.Errorf("ps --namespace=vision: exit %d\n%s%s", code, out, errOut)
	}
	out, _, _ = f.ps(t, f.auth, "--owner=slurm", "--no-headers", `--prometheus.selector=cluster="lab",instance=~"gpu-[ab]"`)
	if !regexp.MustCompile(`^gpu-a +1 +9000201 +lmp +60\.0 GiB +91% +slurm job 88231\n$`).MatchString(out) {
		t.Errorf("ps --owner=slurm with a selector:\n%s", out)
	}
	out, _, _ = f.ps(t, f.auth, "--user=nobody", "--gpu=1", "--no-headers")
	if out != "" {
		t.Errorf("ps --user=nobody:\n%s", out)
	}
	out, _, _ = f.ps(t, f.auth, "--gpu=1", "--no-headers", "--sort=memory", "-o", "custom-columns=NODE:node,PID:pid,OWNER:owner")
	if want := "gpu-a  9000201  slurm job 88231\n"; out != want {
		t.Errorf("ps --gpu=1 -o custom-columns:\n%s\nwant\n%s", out, want)
	}
	out, errOut, code = f.ps(t, f.auth, `--prometheus.selector=cluster="elsewhere"`)
	if code != 1 || out != "" || !strings.Contains(errOut, `gpu_pod_exporter_build_info{cluster="elsewhere"}`) ||
		!strings.HasSuffix(errOut, "found nothing\n") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("a selector that matches nothing: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// gpu-a, scraped by two jobs under one instance, has each series twice: its MIG GPU counts its 2 instances, not 4,
// and each workload's SM history is its processes' summed SM utilization (the grouped view's ΣSM), not twice it.
func testOneInstanceTwice(t *testing.T, f *fleet) {
	cfg, err := configfile.HTTPClient(f.auth)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := config.NewClientFromConfig(*cfg, "test")
	if err != nil {
		t.Fatal(err)
	}
	client, err := promapi.New(f.prom, hc)
	if err != nil {
		t.Fatal(err)
	}
	reader := cluster.New(client, cluster.Config{Selector: mustSelector(t, `instance="gpu-a"`), ScrapeInterval: interval})
	if problems := testkit.Eventually(30*time.Second, func() []string {
		v, err := reader.Read(t.Context(), cluster.What{Top: true, Workloads: true})
		if err != nil {
			return []string{err.Error()}
		}
		var problems []string
		for _, g := range v.GPUs {
			if g.MIG && g.MIGInstances != 2 {
				problems = append(problems, fmt.Sprintf("GPU %d: %d MIG instances, want 2", g.Index, g.MIGInstances))
			}
		}
		ws := view.Group(v.Processes, view.Workloads)
		if len(ws) != 3 {
			problems = append(problems, fmt.Sprintf("%d workloads, want 3", len(ws)))
		}
		for _, w := range ws {
			last := math.NaN()
			for _, p := range v.History.Workloads[w.Key] {
				if !math.IsNaN(p) {
					last = p
				}
			}
			if w.SM.Valid && math.Abs(last-w.SM.V) > 1e-9 {
				problems = append(problems, fmt.Sprintf("%s: its SM history ends at %v, its ΣSM is %v", w.Owner, last, w.SM.V))
			}
		}
		return problems
	}); problems != nil {
		t.Errorf("gpu-a scraped twice under one instance:\n%s", strings.Join(problems, "\n"))
	}
}

func mustSelector(t *testing.T, s string) promapi.Selector {
	t.Helper()
	sel, err := promapi.ParseSelector(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// Prometheus refuses a client without the password, and one without the CA and certificate, each with one line
// that says so; bad flags exit 2 naming the flag.
func testCredentials(t *testing.T, f *fleet) {
	for _, c := range []struct {
		name, config string
		want         []string
	}{
		{"no password", f.noAuth, []string{"refused the request: 401 Unauthorized", "check the credentials in " + f.noAuth}},
		{"no client configuration", "", []string{"cannot reach Prometheus at " + f.prom, "certificate"}},
	} {
		out, errOut, code := f.ps(t, c.config)
		if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q: want status 1 and one line", c.name, code, out, errOut)
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%s: %q does not say %q", c.name, errOut, w)
			}
		}
	}
	closed := "http://" + e2eutil.FreeAddr(t)
	_, errOut, code := run(t, "ps", "--prometheus="+closed)
	if code != 1 || !strings.Contains(errOut, "cannot reach Prometheus at "+closed) || !strings.Contains(errOut, "connection refused") ||
		!strings.Contains(errOut, "kubectl port-forward") {
		t.Errorf("a closed port: exit %d: %s", code, errOut)
	}
	// The URL from the environment, as from the flag.
	cmd := exec.Command(binary, "ps", "--http.config.file="+f.auth, "--no-headers")
	cmd.Env = append(os.Environ(), "GPU_POD_EXPORTER_PROMETHEUS_URL="+f.prom)
	if out, err := cmd.Output(); err != nil || strings.Count(string(out), "\n") != 7 {
		t.Errorf("--prometheus from the environment: %v\n%s", err, out)
	}

	bad := filepath.Join(t.TempDir(), "http.yml")
	write(t, bad, "basic_auth: {username: a}\nbearer_token: b\n")
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"ps", "--prometheus=prometheus:9090"}, "--prometheus"},
		{[]string{"ps", "--prometheus=" + f.prom, "--prometheus.selector=cluster=lab"}, "--prometheus.selector"},
		{[]string{"ps", "--prometheus=" + f.prom, `--prometheus.selector=instance=~"gpu-("`}, "--prometheus.selector"},
		{[]string{"top", "--prometheus=" + f.prom, "--prometheus.node-label=node-name"}, "--prometheus.node-label"},
		{[]string{"ps", "--prometheus=" + f.prom, "--prometheus.scrape-interval=0s"}, "--prometheus.scrape-interval"},
		{[]string{"ps", "--prometheus=" + f.prom, "--prometheus.timeout=soon"}, "--prometheus.timeout"},
		{[]string{"ps", "--prometheus=" + f.prom, "--prometheus.time=yesterday"}, "--prometheus.time"},
		{[]string{"ps", "--prometheus=" + f.prom, "--http.config.file=" + bad}, "--http.config.file"},
		{[]string{"ps", "--prometheus=" + f.prom, "--http.config.file=/nonexistent.yml"}, "--http.config.file"},
		{[]string{"ps", "--prometheus.selector=cluster=\"lab\""}, "--prometheus.selector"},
		{[]string{"top", "--http.config.file=" + f.auth}, "--http.config.file"},
		{[]string{"ps", "--demo", "--prometheus=" + f.prom}, "--prometheus"},
	} {
		out, errOut, code := run(t, c.args...)
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, c.flag+":") {
			t.Errorf("%v: exit %d, stderr %q: want 2 and one line naming %s", c.args, code, errOut, c.flag)
		}
	}
}

// top shows every node's line, marked where a GPU has a health problem, the signals of the whole cluster by
// severity, each node's GPUs under it with n, and the filter and groups of the node view.
func testTop(t *testing.T, term *tmuxterm.Terminal) {
	term = term.On(t)
	lines := term.WaitForText("3 nodes  5 GPUs  7 processes", "(simulated)", "q quit")
	for _, want := range []string{
		`^  NODE +GPUS BUSY UTIL +MEMORY IDLE UNREQ EXPORTER`,
		`^  gpu-a +2 +2 +93% +72/160G +0 +0 up$`,
		`^✗ gpu-b +1 +1 +71% +26/80G +0 +1 up · 1 GPU ✗$`,
		`^✗ gpu-c +2 +1 +28% +40/90G +1 +0 up · 1 GPU ✗$`,
		`^✗ GPU 0 of gpu-b: needs GPU reset, XID 48 · GPU 1 of gpu-c: PCIe x8 of x16$`,
		`^! unrequested use: data-science/jupyter-bob-0/notebook on GPU 0 of gpu-b$`,
		`^○ idle allocation: ml/idle-0/notebook holds GPU 1 of gpu-c$`,
		`^NODE +GPU +PID PROCESS +MEMORY +SM OWNER`,
		`^gpu-a +0:1/0 +9000101 python3 +8.0 GiB +35% pod vision/resnet-train-0/train$`,
		`^gpu-c +0 +9000402 ollama +2.0 GiB +- service ollama.service$`,
	} {
		if !matchesLine(lines, want) {
			t.Errorf("no line like %s in\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if !strings.Contains(lines[0], "series scraped twice, shown once") {
		t.Errorf("the title does not say gpu-a is scraped twice: %q", lines[0])
	}

	// n: each node's GPUs under its line, with the node view's marks.
	term.Keys("n")
	lines = term.WaitForText("n nodes only")
	for _, want := range []string{
		`^gpu-a  2 GPUs · 2 busy · up$`,
		`^  0 A100-SXM4-80GB .* 12/80G 40°C  250W MIG ×2 +2 pods$`,
		`^  1 A100-SXM4-80GB .* 93% .* 60/80G 66°C  390W 1 workload +none$`,
		`^gpu-b  1 GPU · 1 busy · 1 ✗ · 1 unrequested use · up$`,
		`^✗ 0 H100 80GB HBM3 .* 71% .* shared ×2 +1 pod !$`,
		`^gpu-c  2 GPUs · 1 busy · 1 ✗ · 1 idle allocation · up$`,
		`^✗ 1 L40S .* 0% .* idle +1 pod ○$`,
	} {
		if !matchesLine(lines, want) {
			t.Errorf("by node: no line like %s in\n%s", want, strings.Join(lines, "\n"))
		}
	}
	term.Keys("n")
	term.WaitForText("n by node")

	// A node's name as the filter: that node, its signals and its processes only; node: says it is a node's.
	for _, filter := range []string{"gpu-b", "node:gpu-b"} {
		term.Keys("/", filter, "Enter")
		lines = term.WaitForText("/ filter: " + filter)
		screen := strings.Join(lines, "\n")
		if strings.Contains(screen, "gpu-a") || strings.Contains(screen, "gpu-c") || !strings.Contains(screen, "! unrequested use") ||
			strings.Count(screen, "\ngpu-b ") != 2 || !strings.Contains(screen, "\n✗ gpu-b ") {
			t.Errorf("filtered by %s:\n%s", filter, screen)
		}
		term.Keys("Escape")
		term.WaitForText("· / filter ·")
	}

	// w: by workload (the Slurm job is one row), with its history; then by namespace.
	term.Keys("w", "m")
	lines = term.WaitForText("w namespaces", "sort memory", "HISTORY")
	if !matchesLine(lines, `^gpu-a +1 +9000201 lmp +60.0 GiB +91% .*slurm job 88231$`) ||
		!matchesLine(lines, `^gpu-a +0:1/0 +9000101 python3 +8.0 GiB +35% .*pod vision/resnet-train-0/train$`) {
		t.Errorf("grouped by workload:\n%s", strings.Join(lines, "\n"))
	}
	term.Keys("w")
	lines = term.WaitForText("w ungroup")
	if !matchesLine(lines, `^gpu-a +0:1/0,0:2/0 +2 procs python3 \+1 +12.0 GiB +35% .*namespace vision$`) {
		t.Errorf("grouped by namespace:\n%s", strings.Join(lines, "\n"))
	}
	term.Keys("w", "g")
	term.WaitForText("w group", "sort GPU")
}

// Stopping gpu-c's exporter makes its node stale within two scrape intervals, in ps and in top; it stays listed.
func testStale(t *testing.T, f *fleet, term *tmuxterm.Terminal) {
	term = term.On(t)
	exp := f.exporters["gpu-c"]
	if err := syscall.Kill(exp.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var seen time.Duration
	var errOut string
	if problems := testkit.Eventually(10*interval, func() []string {
		_, errOut, _ = f.ps(t, f.auth, "--prometheus.scrape-interval="+interval.String())
		seen = time.Since(stopped)
		if !strings.Contains(errOut, "warning: node gpu-c: stale: exporter down, last reading ") {
			return []string{errOut}
		}
		return nil
	}); problems != nil {
		t.Fatalf("gpu-c is not stale %s after its exporter stopped; ps says:\n%s", seen, errOut)
	}
	if seen > 2*interval {
		t.Errorf("gpu-c was seen stale %s after its exporter stopped, more than two scrape intervals (%s)", seen, 2*interval)
	}
	if strings.Count(errOut, "warning:") != 1 {
		t.Errorf("ps warns of more than gpu-c:\n%s", errOut)
	}
	// Its age: since its last sample, found by a subquery stepping at the scrape interval.
	var age int
	if _, err := fmt.Sscanf(errOut[strings.Index(errOut, "last reading ")+len("last reading "):], "%ds ago", &age); err != nil || age > 5 {
		t.Errorf("gpu-c's age: %q", errOut)
	}
	t.Logf("gpu-c stale after %s", seen.Round(time.Millisecond))
	lines := term.WaitForText("3 nodes (1 stale)", "× node gpu-c: stale: exporter down, last reading")
	if !matchesLine(lines, `^  gpu-c +- +- +- +- +- +- stale \d+s \(down\)$`) {
		t.Errorf("gpu-c's line:\n%s", strings.Join(lines, "\n"))
	}
	// Its processes are gone with its series; the others stay.
	out, _, _ := f.ps(t, f.auth, "-o", "json")
	if strings.Contains(out, `"node": "gpu-c"`) || strings.Count(out, `"node": "gpu-`) != 5 {
		t.Errorf("rows after gpu-c stopped:\n%s", out)
	}
}

type row struct {
	values map[string]any
	keys   []string
}

// decodeRows reads a ps JSON array, with each object's keys in their order.
func decodeRows(t *testing.T, s string) []row {
	t.Helper()
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		t.Fatalf("%v:\n%s", err, s)
	}
	rows := make([]row, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal(r, &rows[i].values); err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(r))
		dec.Token()
		for dec.More() {
			k, _ := dec.Token()
			rows[i].keys = append(rows[i].keys, k.(string))
			var skip json.RawMessage
			dec.Decode(&skip)
		}
	}
	return rows
}

func matchesLine(lines []string, expr string) bool {
	re := regexp.MustCompile(expr)
	for _, l := range lines {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}
