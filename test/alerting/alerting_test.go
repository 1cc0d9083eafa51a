//go:build e2e

package alerting

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

var binary string

func TestMain(m *testing.M) { e2eutil.Main(m, &binary) }

// node has a pod that uses a GPU it never requested (ml-training, team ml), a pod that holds a GPU and runs
// nothing on it (data-science), a Slurm job of user alice that holds a GPU's memory and runs no kernel, and a
// busy Slurm job of bob, which must not alert.
const node = `driver_version: "580.95.05"
gpus:
  - uuid: GPU-00000000-0000-4000-8000-000000000000
    memory_total_bytes: 85520809984
    processes:
      - {pid: 4001, type: compute, used_memory_bytes: 1073741824, sm_utilization_ratio: 0.3,
         identity: {namespace: ml-training, pod: notebook-7f9c, container: jupyter, pod_uid: 11111111-1111-4111-8111-111111111111}}
  - uuid: GPU-00000000-0000-4000-8000-000000000001
    memory_total_bytes: 85520809984
    processes: []
  - uuid: GPU-00000000-0000-4000-8000-000000000002
    memory_total_bytes: 85520809984
    processes:
      - {pid: 4002, type: compute, used_memory_bytes: 2147483648, sm_utilization_ratio: 0, identity: {slurm_job_id: job_4242, user: alice}}
      - {pid: 4003, type: compute, used_memory_bytes: 2147483648, sm_utilization_ratio: 0.9, identity: {slurm_job_id: job_4243, user: bob}}
allocations:
  - {namespace: data-science, pod: features-0, container: trainer, device_ids: [GPU-00000000-0000-4000-8000-000000000001]}
`

// notification is what Alertmanager's webhook receiver posts (its version 4 payload).
type notification struct {
	Receiver    string            `json:"receiver"`
	GroupLabels map[string]string `json:"groupLabels"`
	Alerts      []struct {
		Status      string            `json:"status"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
		StartsAt    time.Time         `json:"startsAt"`
	} `json:"alerts"`
}

// TestAlertsReachTheirOwners: each alert arrives at the receiver of whoever owns the GPU use, with the labels and
// text that name the pod (or Slurm job and user), the GPU, and since when.
func TestAlertsReachTheirOwners(t *testing.T) {
	dir := t.TempDir()
	nodeFile := filepath.Join(dir, "node.yaml")
	write(t, nodeFile, node)
	exporter := e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+nodeFile, "--collector.process-user").Addr

	// The webhook receiver: every notification, by the receiver it was sent for.
	var mu sync.Mutex
	got := map[string][]notification{}
	hook := listen(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n notification
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err := json.Unmarshal(body, &n); err != nil {
			t.Errorf("webhook: %v: %s", err, body)
		}
		mu.Lock()
		got[strings.TrimPrefix(r.URL.Path, "/")] = append(got[strings.TrimPrefix(r.URL.Path, "/")], n)
		mu.Unlock()
	}))

	am := startAlertmanager(t, dir, hook)
	// The rules as shipped but for their `for:`, which would make the test wait an hour.
	rules := filepath.Join(dir, "rules.yml")
	slurm := filepath.Join(dir, "rules-slurm.yml")
	forClause := regexp.MustCompile(`(?m)^(\s+for:) \S+$`)
	write(t, rules, forClause.ReplaceAllString(string(repoFile(t, "deploy/prometheus/rules.yml")), "$1 2s"))
	write(t, slurm, forClause.ReplaceAllString(string(repoFile(t, "deploy/alertmanager/rules-slurm.yml")), "$1 2s"))
	e2eutil.StartPrometheus(t, e2eutil.ScrapeConfig(exporter)+fmt.Sprintf(`rule_files: [%q, %q]
alerting:
  alertmanagers: [{static_configs: [{targets: [%q]}]}]
`, rules, slurm, am))

	type want struct {
		receiver, alert string
		labels          map[string]string
		text            []string // in the summary or description
	}
	wants := []want{
		{"team-ml", "GPUUsedWithoutRequest", map[string]string{"namespace": "ml-training", "pod": "notebook-7f9c", "container": "jupyter", "gpu": "0"},
			[]string{"ml-training/notebook-7f9c", "GPU 0"}},
		{"team-data-science", "GPUAllocatedIdle", map[string]string{"namespace": "data-science", "pod": "features-0", "container": "trainer", "gpu": "1"},
			[]string{"data-science/features-0", "GPU 1"}},
		{"slurm-users", "GPUSlurmJobIdle", map[string]string{"slurm_job_id": "job_4242", "user": "alice", "gpu": "2"},
			[]string{"job_4242", "alice", "GPU 2"}},
	}
	find := func(w want) (notification, int, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range got[w.receiver] {
			for i, a := range n.Alerts {
				if a.Labels["alertname"] == w.alert && a.Status == "firing" {
					return n, i, true
				}
			}
		}
		return notification{}, 0, false
	}
	testkit.WaitFor(t, 90*time.Second, "every owner's receiver to get its alert", func() bool {
		for _, w := range wants {
			if _, _, ok := find(w); !ok {
				return false
			}
		}
		return true
	})
	for _, w := range wants {
		n, i, _ := find(w)
		a := n.Alerts[i]
		for k, v := range w.labels {
			if a.Labels[k] != v {
				t.Errorf("%s to %s: label %s = %q, want %q (labels %v)", w.alert, w.receiver, k, a.Labels[k], v, a.Labels)
			}
		}
		text := a.Annotations["summary"] + " " + a.Annotations["description"]
		for _, s := range w.text {
			if !strings.Contains(text, s) {
				t.Errorf("%s to %s: the text does not name %q: %s", w.alert, w.receiver, s, text)
			}
		}
		// Since when: the alert's start, which the receiver's template prints, is when it fired, the rule's for:
		// after the condition began.
		if a.StartsAt.IsZero() || a.StartsAt.After(time.Now()) || time.Since(a.StartsAt) > 5*time.Minute {
			t.Errorf("%s to %s: startsAt %v, want when it fired, in this test's last minutes", w.alert, w.receiver, a.StartsAt)
		}
	}
	// The Slurm user's notifications are grouped by user, so that each goes to that user.
	if n, _, _ := find(wants[2]); n.GroupLabels["user"] != "alice" {
		t.Errorf("the Slurm notification is grouped by %v, want the user", n.GroupLabels)
	}
	// Nothing about the owners' alerts went elsewhere, and bob's busy job did not alert.
	mu.Lock()
	defer mu.Unlock()
	for receiver, ns := range got {
		for _, n := range ns {
			for _, a := range n.Alerts {
				name := a.Labels["alertname"]
				owned := name == "GPUUsedWithoutRequest" || name == "GPUAllocatedIdle" || name == "GPUSlurmJobIdle"
				if owned && receiver == "gpu-platform" {
					t.Errorf("%s for %v reached the platform team's receiver, not its owner's", name, a.Labels)
				}
				if a.Labels["user"] == "bob" {
					t.Errorf("%s fired for bob's busy job: %v", name, a.Labels)
				}
			}
		}
	}
}

// startAlertmanager runs Debian's Alertmanager with deploy/alertmanager/alertmanager.yml, its receivers' URLs
// pointed at the webhook server (the receiver's name as the path) and its waits shortened; it returns its address.
func startAlertmanager(t *testing.T, dir, hook string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus-alertmanager")
	if err != nil {
		t.Fatal("prometheus-alertmanager not installed (Debian package prometheus-alertmanager; scripts/test.sh installs it)")
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(repoFile(t, "deploy/alertmanager/alertmanager.yml"), &cfg); err != nil {
		t.Fatal(err)
	}
	for _, r := range cfg["receivers"].([]any) {
		r := r.(map[string]any)
		for _, wh := range r["webhook_configs"].([]any) {
			wh.(map[string]any)["url"] = "http://" + hook + "/" + r["name"].(string)
		}
	}
	route := cfg["route"].(map[string]any)
	route["group_wait"], route["group_interval"] = "1s", "1s"
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "alertmanager.yml"), string(b))
	// The templates file is named relative to the configuration's directory.
	write(t, filepath.Join(dir, "gpu.tmpl"), string(repoFile(t, "deploy/alertmanager/gpu.tmpl")))
	addr := e2eutil.FreeAddr(t)
	p := e2eutil.Start(t, exec.Command(bin, "--config.file="+filepath.Join(dir, "alertmanager.yml"),
		"--storage.path="+filepath.Join(dir, "alertmanager"), "--web.listen-address="+addr, "--cluster.listen-address="))
	testkit.WaitFor(t, 30*time.Second, "alertmanager to be ready", func() bool {
		if done, err := p.Exited(); done {
			t.Fatalf("alertmanager exited: %v\n%s", err, p.Output())
		}
		_, err := e2eutil.Get("http://" + addr + "/-/ready")
		return err == nil
	})
	return addr
}

// listen serves h on a free loopback port until the test ends, and returns the address.
func listen(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

func repoFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e2eutil.RepoRoot(), path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
