package deploy

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const accountingDashboardPath = "deploy/grafana/gpu-accounting.json"

func loadAccountingDashboard(t testing.TB) *dashboard {
	t.Helper()
	var d dashboard
	if err := strictJSON(readRepoFile(t, accountingDashboardPath), &d); err != nil {
		t.Fatalf("%s: %v", accountingDashboardPath, err)
	}
	return &d
}

// substituteAccounting replaces the accounting dashboard's variables as Grafana does with the node variable set to
// All and the default price; $__range is the range the e2e test's data covers.
func substituteAccounting(expr string) string {
	return strings.NewReplacer("${node}", ".*", "$node", ".*", "${price}", "0.15", "$price", "0.15",
		"${slurm_job}", ".*", "$slurm_job", ".*", "${user}", ".*", "$user", ".*", "$__range", "1m").Replace(expr)
}

func TestAccountingDashboardModel(t *testing.T) {
	d := loadAccountingDashboard(t)
	checkImportable(t, accountingDashboardPath, d)
	checkWorkloadFilters(t, d)
	if d.UID == "" || d.UID == loadDashboard(t).UID || d.Title != "GPU accounting" || d.SchemaVersion < 36 {
		t.Errorf("uid %q (must differ from the main dashboard's), title %q, schemaVersion %d", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || v.Query != "prometheus" {
		t.Errorf("datasource variable = %+v", v)
	}
	for _, name := range []string{"node", "slurm_job", "user"} {
		if v := vars[name]; v.Type != "query" || !v.IncludeAll || !v.Multi || v.AllValue != ".*" || !strings.HasPrefix(v.Definition, "label_values(") {
			t.Errorf("%s variable = %+v", name, v)
		}
	}
	if v := vars["price"]; v.Type != "textbox" || !regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`).MatchString(v.Query.(string)) {
		t.Errorf("price variable = %+v, want a textbox with a number", v)
	}

	titles := checkPanels(t, d, substituteAccounting)
	usesPrice := false
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			usesPrice = usesPrice || strings.Contains(tg.Expr, "$price")
		}
	}
	if !usesPrice {
		t.Error("no query uses the price per kWh")
	}
	for _, want := range []string{"Top consumers", "By namespace", "By Slurm job", "By user", "Energy per hour", "Power by namespace"} {
		if _, ok := titles[want]; !ok {
			t.Errorf("no panel %q", want)
		}
	}
	// Unattributed energy is its own line.
	unattributed := false
	for _, tg := range titles["Energy per hour"].Targets {
		unattributed = unattributed || strings.Contains(tg.Expr, "unattributed") && tg.LegendFormat == "unattributed"
	}
	if !unattributed {
		t.Error("Energy per hour has no unattributed line")
	}
}

// Every metric the accounting dashboard queries is documented in docs/reference.md, and every recording rule it uses
// is in deploy/prometheus/rules.yml.
func TestAccountingDashboardNamesExist(t *testing.T) {
	ref := string(readRepoFile(t, "docs/reference.md"))
	rules := string(readRepoFile(t, "deploy/prometheus/rules.yml"))
	name := regexp.MustCompile(`[a-z_]*:?gpu_[a-z0-9_]+(:[a-z0-9_]+)?`)
	seen := map[string]bool{}
	for _, p := range loadAccountingDashboard(t).allPanels() {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				if seen[n] {
					continue
				}
				seen[n] = true
				if strings.Contains(n, ":") {
					if !strings.Contains(rules, "record: "+n+"\n") {
						t.Errorf("the accounting dashboard uses the recording rule %s, which rules.yml does not define", n)
					}
				} else if !strings.Contains(ref, "`"+n+"`") {
					t.Errorf("the accounting dashboard uses %s, which docs/reference.md does not document", n)
				}
			}
		}
	}
	if len(seen) < 8 {
		t.Errorf("found only %v in the dashboard's queries", slices.Sorted(maps.Keys(seen)))
	}
}

func TestAccountingRulesPromtool(t *testing.T) {
	bin, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found; scripts/test.sh installs it")
		}
		t.Skip("promtool not found (apt-get install prometheus, or run make test)")
	}
	cmd := exec.Command(bin, "test", "rules", "accounting_rules_test.yml")
	cmd.Dir = filepath.Join(repoRoot(t), "deploy/prometheus")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules accounting_rules_test.yml: %v\n%s", err, out)
	}
}
