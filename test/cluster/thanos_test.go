//go:build e2e

package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/tmuxterm"
)

// The cluster view through Thanos, a real distributed engine: three exporters on three simulated nodes; a pair of
// Prometheus servers, HA replicas (external label replica="0" and "1"), both scraping thanos-a and thanos-b, and a
// third scraping thanos-c; a Thanos sidecar beside each, and Thanos Query in front, deduplicating along replica.
// Thanos is built from its Go module (scripts/e2e/build-thanos.sh, cached).
func TestClusterThroughThanos(t *testing.T) {
	thanos := thanosBinary(t)
	dir := testkit.SocketDir(t)
	files := map[string]string{}
	exporters := map[string]*e2eutil.Exporter{}
	for _, node := range thanosNodes {
		files[node.name] = filepath.Join(dir, node.name+".yaml")
		write(t, files[node.name], node.file)
		exporters[node.name] = e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+files[node.name])
	}
	var stores []*thanosStore
	for _, replica := range []string{"0", "1"} {
		stores = append(stores, startThanosStore(t, thanos, `{cluster: lab, prometheus: pair, replica: "`+replica+`"}`,
			exporters, "thanos-a", "thanos-b"))
	}
	single := startThanosStore(t, thanos, "{cluster: lab, prometheus: single}", exporters, "thanos-c")
	single.labels = `{cluster="lab", prometheus="single"}`
	stores = append(stores, single)
	query := startThanosQuery(t, thanos, stores)

	// What each node's own ps lists: every one of these rows once through Thanos, the replicas' copies merged.
	want := map[string]bool{}
	for _, node := range thanosNodes {
		out, errOut, code := run(t, "ps", "-o", "json", "--gpu.simulated-config="+files[node.name])
		if code != 0 {
			t.Fatalf("ps on %s: exit %d: %s", node.name, code, errOut)
		}
		for _, r := range decodeRows(t, out) {
			want[rowKey(node.name, r)] = true
		}
	}
	ps := func(args ...string) (rows []string, stderr string, code int) {
		t.Helper()
		out, errOut, code := run(t, append([]string{"ps", "--prometheus=" + query, "-o", "json"}, args...)...)
		if code != 0 {
			return nil, errOut, code
		}
		for _, r := range decodeRows(t, out) {
			rows = append(rows, rowKey(r.values["node"].(string), r))
		}
		slices.Sort(rows)
		return rows, errOut, code
	}
	var rows []string
	var errOut string
	var code int
	testkit.WaitFor(t, 60*time.Second, "the three nodes through Thanos Query", func() bool {
		rows, errOut, code = ps()
		return code == 0 && len(warningLines(errOut)) == 0 && len(rows) >= len(want)
	})
	if t.Failed() {
		t.Fatalf("ps through Thanos: exit %d, rows %q, stderr:\n%s", code, rows, errOut)
	}

	t.Run("ps: every node once, the replicas deduplicated", func(t *testing.T) {
		rows, errOut, code := ps()
		if code != 0 || len(warningLines(errOut)) != 0 || !slices.Equal(rows, slices.Sorted(maps.Keys(want))) {
			t.Errorf("exit %d, stderr %q, rows\n%s\nwant the nodes' own, once each:\n%s", code, errOut,
				strings.Join(rows, "\n"), strings.Join(slices.Sorted(maps.Keys(want)), "\n"))
		}
	})

	term := tmuxterm.Start(t, 120, 30, "sh", "-c", `"$0" "$@"; echo "top exited $?"; read -r done`, binary, "top",
		"--prometheus="+query, "--interval=300ms", "--prometheus.scrape-interval="+interval.String())
	t.Run("top: every node once", func(t *testing.T) {
		term := term.On(t)
		lines := term.WaitForText(fmt.Sprintf("3 nodes  3 GPUs  %d processes", len(want)), "q quit")
		for _, node := range thanosNodes {
			if n := countLines(lines, `^ *`+node.name+` +1 +[01] +\d+% .* up$`); n != 1 {
				t.Errorf("%d lines for node %s:\n%s", n, node.name, strings.Join(lines, "\n"))
			}
		}
		if n := countLines(lines, `^warning: `); n != 0 {
			t.Errorf("warnings with every store up:\n%s", strings.Join(lines, "\n"))
		}
	})

	// thanos-c's only store stops: Thanos Query answers with the other stores' series and a warning for the one it
	// could not reach (its partial response). The view shows what it has and says so in one line, once for all its
	// queries: not thanos-c missing without a word.
	if err := syscall.Kill(single.sidecar.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Run("ps: a stopped store is a partial response, in one line", func(t *testing.T) { testStoppedStore(t, ps, want, single) })
	// Once Thanos's health check has found the store down, a store that is not a strict endpoint would be left out of
	// every answer without a word; a strict one is still asked, and still warned about.
	testkit.WaitFor(t, 30*time.Second, "Thanos Query to find "+single.grpc+" down", func() bool {
		return storeDown(t, query, single.grpc)
	})
	t.Run("ps: a store found down is still a partial response", func(t *testing.T) { testStoppedStore(t, ps, want, single) })
	t.Run("top: a stopped store is a partial response, in one line", func(t *testing.T) {
		term := term.On(t)
		lines := term.WaitFor("thanos-c gone", func(lines []string) bool {
			return countLines(lines, `^ *thanos-c `) == 0 && countLines(lines, `^warning: `) > 0
		})
		var warnings []string
		for _, l := range lines {
			if strings.HasPrefix(l, "warning: ") {
				warnings = append(warnings, l)
			}
		}
		if len(warnings) != 1 || !strings.Contains(warnings[0], single.labels) {
			t.Errorf("want one warning line that names the store that did not answer, %s:\n%s", single.labels,
				strings.Join(lines, "\n"))
		}
		for _, node := range []string{"thanos-a", "thanos-b"} {
			if n := countLines(lines, `^ *`+node+` +1 +[01] +\d+% .* up$`); n != 1 {
				t.Errorf("%d lines for node %s:\n%s", n, node, strings.Join(lines, "\n"))
			}
		}
	})
	term.Keys("q")
	term.WaitForText("top exited 0")
}

// testStoppedStore: with single's sidecar stopped, ps lists the rows of the other stores' nodes once each, exits 0,
// and says in one warning line which store did not answer.
func testStoppedStore(t *testing.T, ps func(...string) ([]string, string, int), want map[string]bool, single *thanosStore) {
	t.Helper()
	var rows []string
	var errOut string
	var code int
	if problems := testkit.Eventually(30*time.Second, func() []string {
		rows, errOut, code = ps()
		for _, r := range rows {
			if strings.HasPrefix(r, "thanos-c ") {
				return []string{"thanos-c still listed"}
			}
		}
		if len(warningLines(errOut)) == 0 {
			return []string{"no warning"}
		}
		return nil
	}); problems != nil {
		t.Fatalf("after thanos-c's store stopped: %v; exit %d, rows %q, stderr:\n%s", problems, code, rows, errOut)
	}
	var others []string
	for _, r := range slices.Sorted(maps.Keys(want)) {
		if !strings.HasPrefix(r, "thanos-c ") {
			others = append(others, r)
		}
	}
	if code != 0 || !slices.Equal(rows, others) {
		t.Errorf("exit %d, rows\n%s\nwant those of thanos-a and thanos-b once each:\n%s", code, strings.Join(rows, "\n"),
			strings.Join(others, "\n"))
	}
	if w := warningLines(errOut); len(w) != 1 || !strings.Contains(w[0], single.labels) || !strings.Contains(w[0], single.grpc) {
		t.Errorf("stderr:\n%s\nwant one warning line that names the store that did not answer, %s at %s", errOut,
			single.labels, single.grpc)
	}
}

// warningLines are ps's lines on stderr that say what could not be read; its other notes (a simulated node, a GPU's
// health) are not about the answer.
func warningLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "warning: ") {
			out = append(out, l)
		}
	}
	return out
}

// storeDown reports whether Thanos Query's last health check of the store at addr failed.
func storeDown(t *testing.T, query, addr string) bool {
	t.Helper()
	body, err := e2eutil.Get(query + "/api/v1/stores")
	if err != nil {
		return false
	}
	var resp struct {
		Data map[string][]struct {
			Name      string  `json:"name"`
			LastError *string `json:"lastError"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	for _, stores := range resp.Data {
		for _, s := range stores {
			if s.Name == addr && s.LastError != nil {
				return true
			}
		}
	}
	return false
}

// thanosNodes are the three simulated nodes, each with its own GPU UUIDs and owners. PIDs are above the kernel's
// largest pid_max, so that no process of this host lends them its name.
var thanosNodes = []struct{ name, file string }{
	{"thanos-a", `
gpus:
  - uuid: GPU-a0a0a0a0-0000-4000-8000-000000000000
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
    utilization_ratio: 0.8
    processes:
      - {pid: 9100101, name: python3, type: compute, used_memory_bytes: 21474836480, sm_utilization_ratio: 0.6,
         identity: {namespace: ml-training, pod: llama-ft-0, container: trainer, pod_uid: a0a0a0a0-0000-4000-8000-000000000001}}
      - {pid: 9100102, name: python3, type: compute, used_memory_bytes: 4294967296, sm_utilization_ratio: 0.1,
         identity: {namespace: ml-training, pod: llama-eval-0, container: eval, pod_uid: a0a0a0a0-0000-4000-8000-000000000002}}
`},
	{"thanos-b", `
gpus:
  - uuid: GPU-b0b0b0b0-0000-4000-8000-000000000000
    name: NVIDIA A100-SXM4-80GB
    memory_total_bytes: 85899345920
    utilization_ratio: 0.9
    processes:
      - {pid: 9100201, name: lmp, type: compute, used_memory_bytes: 64424509440, sm_utilization_ratio: 0.9,
         identity: {slurm_job_id: "4242"}}
`},
	{"thanos-c", `
gpus:
  - uuid: GPU-c0c0c0c0-0000-4000-8000-000000000000
    name: NVIDIA L40S
    memory_total_bytes: 48305799168
    utilization_ratio: 0.3
    processes:
      - {pid: 9100301, name: ollama, type: compute, used_memory_bytes: 8589934592, sm_utilization_ratio: 0.3,
         identity: {systemd_unit: ollama.service}}
`},
}

// rowKey is what a ps row is known by: its node, GPU, PID and owner.
func rowKey(node string, r row) string {
	key := []string{node}
	for _, k := range []string{"gpu", "pid", "namespace", "pod", "container", "slurm_job_id", "systemd_unit"} {
		switch v := r.values[k].(type) {
		case float64:
			key = append(key, strconv.FormatFloat(v, 'f', -1, 64))
		default:
			key = append(key, fmt.Sprint(v))
		}
	}
	return strings.Join(key, " ")
}

func countLines(lines []string, expr string) int {
	re := regexp.MustCompile(expr)
	n := 0
	for _, l := range lines {
		if re.MatchString(l) {
			n++
		}
	}
	return n
}

// thanosBinary is Thanos, built once from its Go module by scripts/e2e/build-thanos.sh and cached.
func thanosBinary(t *testing.T) string {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("bash", filepath.Join(e2eutil.RepoRoot(), "scripts/e2e/build-thanos.sh"))
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr // the build's progress, when there is one
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/e2e/build-thanos.sh: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if d := time.Since(start); d > 10*time.Second {
		t.Logf("thanos ready in %s", d.Round(time.Second))
	}
	return lines[len(lines)-1]
}

// thanosStore is a Prometheus with a Thanos sidecar, whose StoreAPI answers on grpc for the external labels.
type thanosStore struct {
	grpc    string
	labels  string // as Thanos names the store: {cluster="lab", prometheus="single"}
	sidecar *e2eutil.Process
}

// startThanosStore runs a Prometheus with externalLabels (a YAML map) scraping nodes' exporters every interval,
// each target's instance its node's name as the chart's ServiceMonitor writes it, and a sidecar in front of it.
func startThanosStore(t *testing.T, thanos, externalLabels string, exporters map[string]*e2eutil.Exporter, nodes ...string) *thanosStore {
	t.Helper()
	var targets strings.Builder
	for _, node := range nodes {
		fmt.Fprintf(&targets, "      - {targets: [%q], labels: {instance: %s}}\n", exporters[node].Addr, node)
	}
	prom := e2eutil.StartPrometheus(t, fmt.Sprintf("global:\n  scrape_interval: %s\n  external_labels: %s\n"+
		"scrape_configs:\n  - job_name: gpu-pod-exporter\n    static_configs:\n%s", interval, externalLabels, targets.String()))
	s := &thanosStore{grpc: e2eutil.FreeAddr(t)}
	httpAddr := e2eutil.FreeAddr(t)
	s.sidecar = e2eutil.Start(t, exec.Command(thanos, "sidecar", "--prometheus.url=http://"+prom,
		"--tsdb.path="+t.TempDir(), "--grpc-address="+s.grpc, "--http-address="+httpAddr))
	waitReady(t, "thanos sidecar", s.sidecar, "http://"+httpAddr+"/-/ready")
	return s
}

// startThanosQuery runs Thanos Query in front of the stores, deduplicating along the replica label, and returns
// its URL. The stores are strict endpoints, as docs/top.md advises: Thanos queries a strict endpoint even when it
// is down, and says so in the answer's warnings, where it leaves a store that fails its health check out of every
// answer without a word.
func startThanosQuery(t *testing.T, thanos string, stores []*thanosStore) string {
	t.Helper()
	var endpoints strings.Builder
	endpoints.WriteString("endpoints:\n")
	for _, s := range stores {
		fmt.Fprintf(&endpoints, "  - {address: %q, strict: true}\n", s.grpc)
	}
	httpAddr := e2eutil.FreeAddr(t)
	q := e2eutil.Start(t, exec.Command(thanos, "query", "--http-address="+httpAddr, "--grpc-address="+e2eutil.FreeAddr(t),
		"--query.replica-label=replica", "--endpoint.sd-config="+endpoints.String()))
	waitReady(t, "thanos query", q, "http://"+httpAddr+"/-/ready")
	return "http://" + httpAddr
}

func waitReady(t *testing.T, what string, p *e2eutil.Process, url string) {
	t.Helper()
	testkit.WaitFor(t, 60*time.Second, what+" to be ready", func() bool {
		if done, err := p.Exited(); done {
			t.Fatalf("%s exited before it was ready: %v (its output follows)", what, err)
		}
		_, err := e2eutil.Get(url)
		return err == nil
	})
}
