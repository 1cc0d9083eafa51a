package allocation

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const rulesDir = "../../deploy/prometheus"

// promtool returns the path of promtool; scripts/test.sh installs it (Debian's prometheus package).
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found; scripts/test.sh installs it")
		}
		t.Skip("promtool not found (apt-get install prometheus, or run make test)")
	}
	return path
}

func TestRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = rulesDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// Every alert has a test where it fires and one where it does not, and names what it is about.
func TestEveryAlertIsTestedFiringAndNotFiring(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, rulesDir+"/rules.yml", &rules)
	readYAML(t, rulesDir+"/rules_test.yml", &tests)

	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !firing[r.Alert] {
				t.Errorf("alert %s has no test where it fires", r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("alert %s has no test where it does not fire", r.Alert)
			}
			for _, key := range []string{"summary", "description"} {
				if r.Annotations[key] == "" {
					t.Errorf("alert %s has no %s", r.Alert, key)
				}
			}
		}
	}
	if alerts == 0 {
		t.Fatal("no alerts found in rules.yml")
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// The commented variant of GPUAllocatedIdle in rules.yml (kube-state-metrics' pod phase, against the kubelet listing
// finished pods, kubernetes/kubernetes#119423) is ready to use: put in place of the expr, it passes promtool and
// stays quiet for a Succeeded pod that still holds its GPU, while a running idle pod still fires.
func TestGPUAllocatedIdleRunningPodsVariant(t *testing.T) {
	bin := promtool(t)
	b, err := os.ReadFile(rulesDir + "/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules := string(b)
	const expr = "        expr: gpu_allocation_processes == 0\n"
	var variant string
	for _, line := range strings.Split(rules, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "#   expr: gpu_allocation_processes == 0 and"); ok {
			variant = "        expr: gpu_allocation_processes == 0 and" + v + "\n"
		}
	}
	if variant == "" || strings.Count(rules, expr) != 1 || !strings.Contains(variant, `kube_pod_status_phase{phase="Running"} == 1`) {
		t.Fatalf("rules.yml has no commented GPUAllocatedIdle variant on kube_pod_status_phase (found %q), or not one %q", variant, expr)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), []byte(strings.Replace(rules, expr, variant, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	const tests = `rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'gpu_allocation_processes{instance="node1:9402",job="gpu-pod-exporter",gpu="0",uuid="GPU-0",namespace="ml",pod="done",container="c",resource="nvidia.com/gpu"}'
        values: '0x70'
      - series: 'gpu_allocation_processes{instance="node1:9402",job="gpu-pod-exporter",gpu="1",uuid="GPU-1",namespace="ml",pod="idle",container="c",resource="nvidia.com/gpu"}'
        values: '0x70'
      - series: 'kube_pod_status_phase{instance="ksm:8080",job="kube-state-metrics",namespace="ml",pod="done",uid="u1",phase="Running"}'
        values: '0x70'
      - series: 'kube_pod_status_phase{instance="ksm:8080",job="kube-state-metrics",namespace="ml",pod="done",uid="u1",phase="Succeeded"}'
        values: '1x70'
      - series: 'kube_pod_status_phase{instance="ksm:8080",job="kube-state-metrics",namespace="ml",pod="idle",uid="u2",phase="Running"}'
        values: '1x70'
      - series: 'kube_pod_status_phase{instance="ksm:8080",job="kube-state-metrics",namespace="ml",pod="idle",uid="u2",phase="Succeeded"}'
        values: '0x70'
    alert_rule_test:
      - eval_time: 65m
        alertname: GPUAllocatedIdle
        exp_alerts:
          - exp_labels: {severity: info, instance: "node1:9402", job: gpu-pod-exporter, gpu: "1", uuid: GPU-1, namespace: ml, pod: idle, container: c, resource: nvidia.com/gpu}
            exp_annotations:
              summary: "Pod ml/idle holds GPU 1 on node1:9402 and has not used it"
              description: "Container c of pod ml/idle was allocated nvidia.com/gpu device GPU 1 (GPU-1) on node1:9402, and no process of the pod has run on it for the alert's ` + "`for:`" + ` duration. Other pods cannot be scheduled on it."
`
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yml"), []byte(tests), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v with the variant: %v\n%s", args, err, out)
		}
	}
}
