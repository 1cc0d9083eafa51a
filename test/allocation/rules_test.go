package allocation

import (
	"os"
	"os/exec"
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
