package deploy

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

const dashboardPath = "deploy/grafana/gpu-pod-exporter.json"

// dashboardFiles are the dashboards the chart ships, each as a key of its dashboard ConfigMap.
var dashboardFiles = []string{dashboardPath, accountingDashboardPath}

// The parts of Grafana's dashboard model (schemaVersion 39) that the dashboard uses; decoding is strict, so a
// misspelt key fails.
type dashboard struct {
	Inputs        []input        `json:"__inputs"`
	Requires      []requirement  `json:"__requires"`
	Title         string         `json:"title"`
	UID           string         `json:"uid"`
	Description   string         `json:"description"`
	Tags          []string       `json:"tags"`
	Editable      bool           `json:"editable"`
	SchemaVersion int            `json:"schemaVersion"`
	Version       int            `json:"version"`
	Time          map[string]any `json:"time"`
	Refresh       string         `json:"refresh"`
	Timezone      string         `json:"timezone"`
	GraphTooltip  int            `json:"graphTooltip"`
	Annotations   map[string]any `json:"annotations"`
	Links         []any          `json:"links"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

// input is a value Grafana asks for when the dashboard is imported; each "${NAME}" in the JSON is replaced by it.
type input struct {
	Name        string `json:"name"`
	Label       string `json:"label"`
	Description string `json:"description"`
	Type        string `json:"type"`
	PluginID    string `json:"pluginId"`
	PluginName  string `json:"pluginName"`
}

// requirement is what an import needs: Grafana, a plugin, a panel type.
type requirement struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Name    string `json:"name"`
	Version string `json:"version"`
}

type variable struct {
	Name       string         `json:"name"`
	Label      string         `json:"label"`
	Type       string         `json:"type"`
	Datasource any            `json:"datasource"`
	Query      any            `json:"query"`
	Definition string         `json:"definition"`
	Refresh    int            `json:"refresh"`
	IncludeAll bool           `json:"includeAll"`
	Multi      bool           `json:"multi"`
	AllValue   string         `json:"allValue"`
	Current    map[string]any `json:"current"`
	Sort       int            `json:"sort"`
	Options    []any          `json:"options"`
	Hide       int            `json:"hide"`
	Regex      string         `json:"regex"`
}

type panel struct {
	Type            string         `json:"type"`
	Title           string         `json:"title"`
	Description     string         `json:"description"`
	ID              int            `json:"id"`
	Collapsed       bool           `json:"collapsed"`
	Panels          []panel        `json:"panels"`
	Datasource      *datasourceRef `json:"datasource"`
	GridPos         gridPos        `json:"gridPos"`
	Targets         []target       `json:"targets"`
	FieldConfig     map[string]any `json:"fieldConfig"`
	Options         map[string]any `json:"options"`
	Transformations []any          `json:"transformations"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type gridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type target struct {
	Datasource   *datasourceRef `json:"datasource"`
	Expr         string         `json:"expr"`
	RefID        string         `json:"refId"`
	LegendFormat string         `json:"legendFormat"`
	Instant      bool           `json:"instant"`
	Range        bool           `json:"range"`
	Format       string         `json:"format"`
}

func loadDashboard(t testing.TB) *dashboard {
	t.Helper()
	var d dashboard
	if err := strictJSON(readRepoFile(t, dashboardPath), &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return &d
}

// allPanels flattens rows (collapsed rows hold their panels).
func (d *dashboard) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// kubeletPanels need the kubelet's PodResources API: the e2e test feeds them from a fake kubelet.
var kubeletPanels = []string{"GPU used without a request", "Idle GPU allocations", "Allocated GPUs by pod"}

// substitute replaces Grafana's variables the way Grafana does when every variable is set to "All" (allValue .*).
func substitute(expr string) string {
	r := strings.NewReplacer(
		"${node}", ".*", "$node", ".*",
		"${gpu}", ".*", "$gpu", ".*",
		"${namespace}", ".*", "$namespace", ".*",
		"${slurm_job}", ".*", "$slurm_job", ".*",
		"${user}", ".*", "$user", ".*",
		"$__rate_interval", "1m", "$__interval", "15s", "$__range", "5m",
	)
	return r.Replace(expr)
}

var leftoverVariable = regexp.MustCompile(`\$\{?[A-Za-z_]`)

func TestDashboardModel(t *testing.T) {
	d := loadDashboard(t)
	checkImportable(t, dashboardPath, d)
	checkWorkloadFilters(t, d)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, title %q, schemaVersion %d", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || v.Query != "prometheus" {
		t.Errorf("datasource variable = %+v, want a Prometheus data source picker", v)
	}
	for _, name := range []string{"node", "gpu", "namespace", "slurm_job", "user"} {
		v, ok := vars[name]
		if !ok {
			t.Errorf("no %s variable", name)
			continue
		}
		if v.Type != "query" || !v.IncludeAll || !v.Multi || v.AllValue != ".*" {
			t.Errorf("variable %s = %+v, want a multi-value query variable with All = .*", name, v)
		}
		if !strings.HasPrefix(v.Definition, "label_values(") {
			t.Errorf("variable %s: definition %q", name, v.Definition)
		}
	}

	titles := checkPanels(t, d, substitute)
	for _, p := range d.allPanels() {
		if p.Type != "row" && slices.Contains(kubeletPanels, p.Title) != strings.Contains(p.Description, "PodResources") {
			t.Errorf("panel %q: panels that need the kubelet must say so in their description, and only they", p.Title)
		}
	}
	for _, want := range []string{
		"GPU memory by pod", "SM utilization by pod", "GPU processes", "GPU used without a request",
		"Idle GPU allocations", "Temperature", "Power", "XID errors", "GPU utilization by GPU", "GPU memory used by GPU",
	} {
		if _, ok := titles[want]; !ok {
			t.Errorf("no panel %q", want)
		}
	}
	// GPUs sort as numbers (10 after 9): the variable, and every table with a gpu column.
	for _, name := range []string{"gpu", "slurm_job"} {
		if v := vars[name]; v.Sort != 3 && v.Sort != 4 {
			t.Errorf("variable %s sorts %d, want numerically (3 or 4)", name, v.Sort)
		}
	}
	for _, p := range d.allPanels() {
		if p.Type == "table" && slices.ContainsFunc(p.Targets, func(tg target) bool { return regexp.MustCompile(`by \([^)]*\bgpu\b`).MatchString(tg.Expr) }) &&
			!convertsToNumber(p, "gpu") {
			t.Errorf("table %q shows the gpu column as text: 10 sorts before 9", p.Title)
		}
	}
	for _, title := range []string{"GPU utilization by GPU", "GPU memory used by GPU"} {
		p := titles[title]
		if len(p.Targets) == 0 || p.Targets[0].LegendFormat != "{{instance}} GPU {{gpu}}" || strings.Contains(p.Targets[0].Expr, "sum") {
			t.Errorf("panel %q is not one line per GPU: %+v", title, p.Targets)
		}
	}
	for _, p := range d.allPanels() {
		if p.Title == "GPU memory by pod" {
			stacking := fmt.Sprint(p.FieldConfig["defaults"].(map[string]any)["custom"].(map[string]any)["stacking"])
			if !strings.Contains(stacking, "normal") {
				t.Errorf("GPU memory by pod is not stacked: %s", stacking)
			}
		}
		if p.Title == "GPU processes" {
			exprs := ""
			for _, tg := range p.Targets {
				exprs += tg.Expr
			}
			for _, l := range []string{"pod", "namespace", "container", "pid"} {
				if !strings.Contains(exprs, l) {
					t.Errorf("the process table does not show %s", l)
				}
			}
		}
	}
}

// convertsToNumber reports whether a table panel converts a field to a number before it shows it.
func convertsToNumber(p panel, field string) bool {
	for _, tr := range p.Transformations {
		m, _ := tr.(map[string]any)
		if m["id"] != "convertFieldType" {
			continue
		}
		opts, _ := m["options"].(map[string]any)
		conversions, _ := opts["conversions"].([]any)
		for _, c := range conversions {
			c, _ := c.(map[string]any)
			if c["targetField"] == field && c["destinationType"] == "number" {
				return true
			}
		}
	}
	return false
}

// checkImportable: the dashboard imports with a data-source prompt. It declares one Prometheus data source input,
// which the data source variable defaults to; every "${DS_...}" in the file is a declared input, and every panel
// and query uses the variable, so that the dashboard works both imported and loaded by Grafana's sidecar (where no
// input is replaced and the variable falls back to the default data source). __requires names every panel type.
func checkImportable(t *testing.T, path string, d *dashboard) {
	t.Helper()
	if len(d.Inputs) != 1 || d.Inputs[0].Type != "datasource" || d.Inputs[0].PluginID != "prometheus" || d.Inputs[0].Name == "" {
		t.Fatalf("%s: __inputs %+v, want one Prometheus data source", path, d.Inputs)
	}
	in := "${" + d.Inputs[0].Name + "}"
	for _, ref := range regexp.MustCompile(`\$\{DS_[A-Z0-9_]+\}`).FindAllString(string(readRepoFile(t, path)), -1) {
		if ref != in {
			t.Errorf("%s uses %s, which __inputs does not declare", path, ref)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && fmt.Sprint(v.Current["value"]) != in {
			t.Errorf("%s: the data source variable defaults to %v, not to the imported %s", path, v.Current["value"], in)
		}
	}
	required := map[string]bool{}
	for _, r := range d.Requires {
		required[r.Type+"/"+r.ID] = true
	}
	for _, want := range []string{"grafana/grafana", "datasource/prometheus"} {
		if !required[want] {
			t.Errorf("%s: __requires lacks %s", path, want)
		}
	}
	for _, p := range d.allPanels() {
		if p.Type != "row" && !required["panel/"+p.Type] {
			t.Errorf("%s: __requires lacks the panel type %s of %q", path, p.Type, p.Title)
		}
	}
}

// workloadSelector is a selector of a per-workload or per-process series, whose identity labels the Slurm job and
// user variables filter.
var workloadSelector = regexp.MustCompile(`\b(?:gpu_workload_[a-z_]+|gpu_process_[a-z_]+)\{[^}]*\}`)

// alwaysSet are labels every series of a panel carries, so that a legend of them never reads with a gap.
var alwaysSet = map[string]bool{"instance": true, "gpu": true, "type": true, "source": true, "xid": true, "workload": true}

// checkWorkloadFilters: every workload and process query honours the Slurm job and user variables, and a legend
// names only labels its query cannot leave empty (no "job  ollama.service").
func checkWorkloadFilters(t *testing.T, d *dashboard) {
	t.Helper()
	legendLabel := regexp.MustCompile(`\{\{\s*([a-z_]+)\s*\}\}`)
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			for _, sel := range workloadSelector.FindAllString(tg.Expr, -1) {
				if !strings.Contains(sel, `slurm_job_id=~"$slurm_job"`) || !strings.Contains(sel, `user=~"$user"`) {
					t.Errorf("panel %q: %s does not filter by the Slurm job and user variables", p.Title, sel)
				}
			}
			for _, m := range legendLabel.FindAllStringSubmatch(tg.LegendFormat, -1) {
				l := m[1]
				nonEmpty := alwaysSet[l] || strings.Contains(tg.Expr, l+`!=""`) || strings.HasPrefix(tg.Expr, l+":") ||
					(l == "namespace" && strings.Contains(tg.Expr, `pod!=""`)) // a pod always has its namespace
				if !nonEmpty {
					t.Errorf("panel %q: legend %q names %s, which the query can leave empty", p.Title, tg.LegendFormat, l)
				}
			}
		}
	}
}

// dashboardMetrics lists the metric names the dashboard's queries use.
func dashboardMetrics(d *dashboard) []string {
	re := regexp.MustCompile(`\b(gpu_[a-z_]+)\b`)
	set := map[string]bool{}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			for _, m := range re.FindAllStringSubmatch(tg.Expr, -1) {
				set[m[1]] = true
			}
		}
	}
	var names []string
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// TestDashboardMetricsDocumented: every metric a panel uses is one docs/reference.md documents, so that renaming a
// metric without the dashboard fails here.
func TestDashboardMetricsDocumented(t *testing.T) {
	ref := string(readRepoFile(t, "docs/reference.md"))
	for _, m := range dashboardMetrics(loadDashboard(t)) {
		if !strings.Contains(ref, "`"+m+"`") {
			t.Errorf("the dashboard uses %s, which docs/reference.md does not document", m)
		}
	}
}

// checkPanels checks what every dashboard's panels must be, and returns them by title: unique IDs and titles, a
// grid without overlaps, and for each panel that is not a row a description, the ${datasource} variable, queries
// with unique refIds and no variable that substitute leaves, and instant table queries for tables.
func checkPanels(t *testing.T, d *dashboard, substitute func(string) string) map[string]panel {
	t.Helper()
	ids := map[int]string{}
	titles := map[string]panel{}
	occupied := map[[2]int]string{}
	for _, p := range d.allPanels() {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, prev, p.Title)
		}
		ids[p.ID] = p.Title
		if _, dup := titles[p.Title]; dup {
			t.Errorf("two panels titled %q", p.Title)
		}
		titles[p.Title] = p
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
		}
		for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
			for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
				if other, ok := occupied[[2]int{x, y}]; ok {
					t.Errorf("panels %q and %q overlap at %d,%d", other, p.Title, x, y)
					y = p.GridPos.Y + p.GridPos.H
					break
				}
				occupied[[2]int{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Description == "" {
			t.Errorf("panel %q has no description", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: target %+v", p.Title, tg)
			}
			refs[tg.RefID] = true
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: target datasource %+v", p.Title, tg.Datasource)
			}
			if s := substitute(tg.Expr); leftoverVariable.MatchString(s) {
				t.Errorf("panel %q: unknown variable in %q", p.Title, tg.Expr)
			}
			if p.Type == "table" && !(tg.Instant && tg.Format == "table") {
				t.Errorf("panel %q: a table's query should be instant with format table", p.Title)
			}
		}
	}
	return titles
}
