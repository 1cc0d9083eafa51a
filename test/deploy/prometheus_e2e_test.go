//go:build e2e

package deploy

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet/fake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// Demo GPUs the fake kubelet allocates (internal/simulated/demo.yaml).
const (
	demoGPU0 = "GPU-f5217cdd-1115-1734-2ef5-22684bb654d2" // time-sliced: bert-finetune, llama-eval, notebook-alice
	demoGPU6 = "GPU-affd221f-d279-17bf-dae8-585d1acebcf2" // idle
	demoGPU7 = "gpu-7"                                    // idle; as NVIDIA's DRA driver names it (by minor number)
)

// TestDashboardQueries runs every query of the Grafana dashboard, with its variables set to All, against a real
// Prometheus that scrapes the real exporter on the demo node. The demo has no kubelet, so a fake kubelet
// (internal/kubelet/fake, the real PodResources gRPC service) allocates GPUs to demo pods: bert-finetune gets GPU 0,
// idle-trainer-0 gets GPU 6 (no process there: an idle allocation), and the other pods on GPU 0 have no allocation
// (unrequested use), and a DRA claim holds GPU 7, idle too. Every panel must return data; none is exempt.
func TestDashboardQueries(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "kubelet.sock")
	kubelet, err := fake.Start(sock, []fake.Device{
		{Namespace: "ml-training", Pod: "bert-finetune-7c9d8b6f4-x2kqp", Container: "trainer", Resource: "nvidia.com/gpu", IDs: []string{demoGPU0}},
		{Namespace: "ml-training", Pod: "idle-trainer-0", Container: "trainer", Resource: "nvidia.com/gpu", IDs: []string{demoGPU6}},
		{Namespace: "search", Pod: "rag-index-0", Container: "indexer", Resource: "gpu.nvidia.com", IDs: []string{demoGPU7},
			Claim: &fake.Claim{Name: "rag-index-gpu", Namespace: "search", Pool: "demo-node"}},
	}, map[string][]string{"nvidia.com/gpu": {demoGPU0, demoGPU6}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kubelet.Stop)

	target := e2eutil.StartExporter(t, exporterBinary(t), "--demo", "--kubelet.pod-resources-endpoint=unix://"+sock,
		"--kubelet.refresh-interval=1s").Addr

	// Two jobs: the dashboard's, scraped the way the chart's ServiceMonitor does (honor_labels, and the target
	// labels prometheus-operator adds naming the exporter's own pod), and one without honor_labels, renamed so that
	// it stays out of the dashboard's queries, to show what honorLabels prevents.
	api := e2eutil.StartPrometheus(t, fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: gpu-pod-exporter
    honor_labels: true
    static_configs:
      - targets: [%[1]q]
        labels: {namespace: monitoring, pod: gpu-pod-exporter-abcde, container: exporter}
  - job_name: without-honor-labels
    static_configs:
      - targets: [%[1]q]
        labels: {namespace: monitoring, pod: gpu-pod-exporter-abcde, container: exporter}
    metric_relabel_configs:
      - {source_labels: [__name__], regex: gpu_workload_memory_used_bytes, action: keep}
      - {source_labels: [__name__], target_label: __name__, replacement: no_honor_gpu_workload_memory_used_bytes}
`, target))

	d := loadDashboard(t)
	type query struct{ panel, expr string }
	var queries []query
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			queries = append(queries, query{p.Title, substitute(tg.Expr)})
		}
	}
	// Wait until every query answers (rates need two samples, allocations a kubelet refresh), then check them all.
	empty := func() []string {
		var out []string
		for _, q := range queries {
			if n, err := instantQuery(api, q.expr); err != nil || n == 0 {
				out = append(out, fmt.Sprintf("%q: %q: %d series, %v", q.panel, q.expr, n, err))
			}
		}
		return out
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		e := empty()
		if len(e) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("panels without data:\n%s", strings.Join(e, "\n"))
		}
		time.Sleep(time.Second)
	}
	t.Logf("%d queries of %d panels returned data", len(queries), len(d.allPanels()))

	// The variables' label_values() queries, as Grafana runs them (the series API with match[]).
	lv := regexp.MustCompile(`^label_values\((.+),\s*([a-z_]+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := lv.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: cannot read %q", v.Name, v.Definition)
			continue
		}
		values, err := labelValues(api, m[2], substitute(m[1]))
		if err != nil || len(values) == 0 {
			t.Errorf("variable %s: %s gave %v, %v", v.Name, v.Definition, values, err)
		}
	}

	// The allocation panels show the right rows.
	rows := func(expr string) []map[string]string {
		r, err := querySeries(api, substitute(expr))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	panelExpr := func(title string) string {
		for _, p := range d.allPanels() {
			if p.Title == title {
				return p.Targets[0].Expr
			}
		}
		t.Fatalf("no panel %q", title)
		return ""
	}
	has := func(rs []map[string]string, want map[string]string) bool {
	next:
		for _, r := range rs {
			for k, v := range want {
				if r[k] != v {
					continue next
				}
			}
			return true
		}
		return false
	}
	unrequested := rows(panelExpr("GPU used without a request"))
	if !has(unrequested, map[string]string{"gpu": "0", "pod": "notebook-alice-0", "namespace": "data-science"}) ||
		has(unrequested, map[string]string{"pod": "bert-finetune-7c9d8b6f4-x2kqp"}) {
		t.Errorf("GPU used without a request: %v, want notebook-alice-0 on GPU 0 and not the allocated bert-finetune", unrequested)
	}
	idle := rows(panelExpr("Idle GPU allocations"))
	if len(idle) != 2 || !has(idle, map[string]string{"gpu": "6", "pod": "idle-trainer-0", "resource": "nvidia.com/gpu", "dra_claim_name": ""}) ||
		!has(idle, map[string]string{"gpu": "7", "pod": "rag-index-0", "resource": "gpu.nvidia.com", "dra_claim_namespace": "search",
			"dra_claim_name": "rag-index-gpu", "dra_device_name": "gpu-7"}) {
		t.Errorf("Idle GPU allocations: %v, want idle-trainer-0 on GPU 6 (device plugin) and rag-index-0 on GPU 7 (DRA claim)", idle)
	}

	// honorLabels: the workload's labels survive, and a series of a Slurm job (no pod) does not get the exporter's
	// pod; without it, the exporter's pod wins and ours are renamed exported_*.
	slurm := rows(`gpu_workload_memory_used_bytes{job="gpu-pod-exporter", slurm_job_id="88231"}`)
	if len(slurm) != 1 || slurm[0]["pod"] != "" || slurm[0]["namespace"] != "" || slurm[0]["container"] != "" {
		t.Errorf("with honor_labels a Slurm job's series has %v, want no namespace, pod or container", slurm)
	}
	bert := rows(`gpu_workload_memory_used_bytes{job="gpu-pod-exporter", pod="bert-finetune-7c9d8b6f4-x2kqp"}`)
	if len(bert) != 1 || bert[0]["namespace"] != "ml-training" || bert[0]["container"] != "trainer" {
		t.Errorf("with honor_labels bert-finetune's series is %v", bert)
	}
	noHonor := rows(`no_honor_gpu_workload_memory_used_bytes{exported_pod="bert-finetune-7c9d8b6f4-x2kqp"}`)
	if len(noHonor) != 1 || noHonor[0]["pod"] != "gpu-pod-exporter-abcde" {
		t.Errorf("without honor_labels: %v, want pod=the exporter's pod and exported_pod=the workload", noHonor)
	}

	// Outside Kubernetes, each line names one workload: the demo's Slurm job, its service, its plain container.
	outside := rows(panelExpr("GPU memory outside Kubernetes"))
	for _, want := range []string{"Slurm job 88231", "ollama.service"} {
		if !has(outside, map[string]string{"workload": want}) {
			t.Errorf("GPU memory outside Kubernetes: %v, want a line %q", outside, want)
		}
	}
	for _, r := range outside {
		if r["workload"] == "" || len(r) != 1 {
			t.Errorf("GPU memory outside Kubernetes has a line without one workload name: %v", r)
		}
	}

	checkVerifyChecklist(t, api, target)
}

// checkVerifyChecklist runs the Prometheus queries and the /readyz check of docs/install.md's "Verify the install"
// on a healthy node (the demo, with a kubelet): each gives the answer the checklist calls healthy.
func checkVerifyChecklist(t *testing.T, api, exporter string) {
	t.Helper()
	install := string(readRepoFile(t, "docs/install.md"))
	i, j := strings.Index(install, "## Verify the install"), strings.Index(install, "## Kubernetes without Helm")
	if i < 0 || j < i {
		t.Fatal("docs/install.md has no Verify the install section")
	}
	section := install[i:j]
	for _, tc := range []struct {
		expr    string
		healthy func(res []e2eutil.Sample) bool
	}{
		{`gpu_pod_exporter_source_up == 0`, func(res []e2eutil.Sample) bool { return len(res) == 0 }},
		{`count(gpu_process_memory_used_bytes{pod_uid!="", pod=""})`, func(res []e2eutil.Sample) bool {
			return len(res) == 0 || res[0].Value == 0
		}},
		{`rate(gpu_pod_exporter_resolver_requests_total{result="error"}[5m])`, func(res []e2eutil.Sample) bool {
			for _, s := range res {
				if s.Value != 0 {
					return false
				}
			}
			return true
		}},
		{`gpu_pod_exporter_kubelet_up`, func(res []e2eutil.Sample) bool { return len(res) == 1 && res[0].Value == 1 }},
		{`gpu_pod_exporter_source_up`, func(res []e2eutil.Sample) bool { return len(res) == 1 && res[0].Value == 1 }},
	} {
		if !strings.Contains(section, "`"+tc.expr+"`") {
			t.Errorf("Verify the install no longer checks %s", tc.expr)
			continue
		}
		res, err := e2eutil.TryQuery(api, tc.expr)
		if err != nil || !tc.healthy(res) {
			t.Errorf("on a healthy node, %s gives %+v (%v), not what the checklist calls healthy", tc.expr, res, err)
		}
	}
	if !strings.Contains(section, "localhost:9402/readyz") {
		t.Error("Verify the install no longer checks /readyz")
	}
	if _, err := e2eutil.Get("http://" + exporter + "/readyz"); err != nil {
		t.Errorf("/readyz on a healthy node: %v", err)
	}
}

// querySeries runs an instant query and returns each result's labels.
func querySeries(api, expr string) ([]map[string]string, error) {
	res, err := e2eutil.TryQuery(api, expr)
	var out []map[string]string
	for _, s := range res {
		out = append(out, s.Metric)
	}
	return out, err
}

func instantQuery(api, expr string) (int, error) {
	r, err := e2eutil.TryQuery(api, expr)
	return len(r), err
}

func labelValues(api, label, match string) ([]string, error) {
	data, err := e2eutil.PromAPI(api, "/api/v1/label/"+label+"/values", url.Values{"match[]": {match}})
	if err != nil {
		return nil, err
	}
	var values []string
	err = json.Unmarshal(data, &values)
	return values, err
}

// TestCloudWatchScrapeConfigs checks the CloudWatch agent's Prometheus scrape files with promtool. Debian's
// Prometheus is built without Kubernetes service discovery, so in prometheus-eks.yaml each kubernetes_sd_configs
// entry is checked against the fields Prometheus documents for it and replaced by a static target before promtool
// checks the rest (relabelling included).
func TestCloudWatchScrapeConfigs(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not installed (Debian package prometheus; scripts/test.sh installs it)")
	}
	dir := t.TempDir()
	for _, name := range []string{"prometheus-ec2.yaml", "prometheus-eks.yaml"} {
		var cfg map[string]any
		if err := strictYAML(readRepoFile(t, "deploy/cloudwatch/"+name), &cfg); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		jobs, _ := cfg["scrape_configs"].([]any)
		if len(jobs) == 0 {
			t.Fatalf("%s: no scrape_configs", name)
		}
		for _, j := range jobs {
			job := j.(map[string]any)
			if job["honor_labels"] != true {
				t.Errorf("%s: job %v without honor_labels: the pod dimension would name the exporter", name, job["job_name"])
			}
			sds, ok := job["kubernetes_sd_configs"].([]any)
			if !ok {
				continue
			}
			for _, sd := range sds {
				b, _ := json.Marshal(sd)
				var k8s struct {
					Role       string `json:"role"`
					APIServer  string `json:"api_server,omitempty"`
					Namespaces *struct {
						OwnNamespace bool     `json:"own_namespace,omitempty"`
						Names        []string `json:"names,omitempty"`
					} `json:"namespaces,omitempty"`
					Selectors []map[string]string `json:"selectors,omitempty"`
				}
				if err := strictJSON(b, &k8s); err != nil {
					t.Errorf("%s: kubernetes_sd_configs: %v", name, err)
				}
				switch k8s.Role {
				case "pod", "node", "service", "endpoints", "endpointslice", "ingress":
				default:
					t.Errorf("%s: kubernetes_sd_configs role %q", name, k8s.Role)
				}
			}
			delete(job, "kubernetes_sd_configs")
			job["static_configs"] = []any{map[string]any{"targets": []any{"node-1:9402"}}}
		}
		b, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil { // JSON is YAML
			t.Fatal(err)
		}
		if out, err := exec.Command(promtool, "check", "config", p).CombinedOutput(); err != nil {
			t.Errorf("promtool check config %s: %v\n%s", name, err, out)
		}
	}
	// The agent reads the file that cwagent-config.json names; the examples say where to mount it.
	if p := loadCWAgentConfig(t).Logs.MetricsCollected.Prometheus.PrometheusConfigPath; p != "/etc/prometheusconfig/prometheus.yaml" {
		t.Errorf("prometheus_config_path %s", p)
	}
}

// TestCloudWatchEC2InstancesStaySeparate runs prometheus-ec2.yaml as two EC2 instances would: each runs the
// command its comment documents (with a stand-in cloud-init that knows the instance's ID) to write its target
// file, then scrapes its own exporter with the file's scrape configuration (every second instead of every minute)
// in a real Prometheus. The series must carry the instance's ID, and cwagent-config.json's per-GPU declaration
// must publish the two instances as distinct CloudWatch metrics. (AWS's own EC2 example uses file_sd_configs the
// same way: CloudWatch-Agent-PrometheusEC2 in the CloudWatch user guide.)
func TestCloudWatchEC2InstancesStaySeparate(t *testing.T) {
	c := loadCWAgentConfig(t)
	const sdDir = "/etc/prometheusconfig/"
	cmd := ec2TargetCommand(t)
	if !strings.Contains(cmd, sdDir) || !strings.Contains(cmd, "localhost:9402") {
		t.Fatalf("the documented command %q does not write into %s or name localhost:9402", cmd, sdDir)
	}
	metricsByInstance := map[string]map[string]bool{} // instance ID → published per-GPU dimension values
	for _, id := range []string{"i-0aaaaaaaaaaaaaaa1", "i-0bbbbbbbbbbbbbbb2"} {
		addr := e2eutil.StartExporter(t, exporterBinary(t), "--demo").Addr
		dir := t.TempDir()
		bin := filepath.Join(dir, "bin")
		if err := os.Mkdir(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		// cloud-init query v1.instance_id prints the instance's ID; this one prints the ID of the instance it plays.
		fake := fmt.Sprintf("#!/bin/sh\n[ \"$*\" = \"query v1.instance_id\" ] || exit 1\necho %s\n", id)
		if err := os.WriteFile(filepath.Join(bin, "cloud-init"), []byte(fake), 0o755); err != nil {
			t.Fatal(err)
		}
		// The exporter of this "instance" listens on its own loopback port rather than 9402.
		script := strings.NewReplacer(sdDir, dir+"/", "localhost:9402", addr).Replace(cmd)
		sh := exec.Command("sh", "-c", script)
		sh.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
		if out, err := sh.CombinedOutput(); err != nil {
			t.Fatalf("the documented command (%s): %v\n%s", script, err, out)
		}
		cfg := strings.ReplaceAll(string(readRepoFile(t, "deploy/cloudwatch/prometheus-ec2.yaml")), sdDir, dir+"/")
		cfg = strings.Replace(cfg, "scrape_interval: 1m", "scrape_interval: 1s", 1)
		cfg = strings.Replace(cfg, "scrape_timeout: 10s", "scrape_timeout: 1s", 1)
		p := filepath.Join(dir, "prometheus.yaml")
		if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("promtool", "check", "config", p).CombinedOutput(); err != nil {
			t.Errorf("promtool check config (with %s's target file): %v\n%s", id, err, out)
		}
		prom := e2eutil.StartPrometheus(t, cfg)
		var res []e2eutil.Sample
		testkit.WaitFor(t, 60*time.Second, id+"'s GPU series in Prometheus", func() bool {
			res, _ = e2eutil.TryQuery(prom, "gpu_memory_used_bytes")
			return len(res) > 0
		})
		metricsByInstance[id] = map[string]bool{}
		for _, s := range res {
			if s.Metric["instance"] != id {
				t.Errorf("%s: series %v, want instance=%q", id, s.Metric, id)
			}
			labels := map[string]string{"ClusterName": "my-gpu-cluster"} // the agent adds it from cluster_name
			for k, v := range s.Metric {
				labels[k] = v
			}
			for _, dims := range cwPublished(t, c, "gpu_memory_used_bytes", labels) {
				var vals []string
				for _, d := range dims {
					vals = append(vals, d+"="+labels[d])
				}
				metricsByInstance[id][strings.Join(vals, ",")] = true
			}
		}
		if len(metricsByInstance[id]) == 0 {
			t.Errorf("%s: gpu_memory_used_bytes is not published", id)
		}
	}
	for m := range metricsByInstance["i-0aaaaaaaaaaaaaaa1"] {
		if metricsByInstance["i-0bbbbbbbbbbbbbbb2"][m] {
			t.Errorf("both instances publish the CloudWatch metric %s: one instance's values overwrite the other's", m)
		}
	}
}

// TestChartPrometheusRuleWithPromtool checks the rules the chart renders into its PrometheusRule with promtool.
func TestChartPrometheusRuleWithPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not installed (Debian package prometheus; scripts/test.sh installs it)")
	}
	r := template(t, "gpe", "monitoring")
	b, err := json.Marshal(r.prometheusRule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "rules.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", p).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the chart's PrometheusRule: %v\n%s", err, out)
	}
}

// TestInstallGuidePrometheusConfig checks the Prometheus configuration that docs/install.md has newcomers write for
// the demo, with promtool (rules file included), as the shell would expand it in the clone's directory.
func TestInstallGuidePrometheusConfig(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not installed (Debian package prometheus; scripts/test.sh installs it)")
	}
	doc := string(readRepoFile(t, "docs/install.md"))
	m := regexp.MustCompile(`(?s)cat > /tmp/gpe-prometheus.yml <<EOF\n(.*?)\nEOF\n`).FindStringSubmatch(doc)
	if m == nil {
		t.Fatal("docs/install.md has no Prometheus configuration for the demo")
	}
	cfg := strings.ReplaceAll(m[1], "$PWD", repoRoot(t))
	if strings.Contains(cfg, "$") {
		t.Fatalf("unexpanded shell variable in the guide's configuration:\n%s", cfg)
	}
	p := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "config", p).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "rules found") {
		t.Errorf("promtool check config on the guide's configuration: %v\n%s", err, out)
	}
}
