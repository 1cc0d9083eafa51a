package deploy

import (
	"cmp"
	"fmt"
	"log/slog"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/basicauth"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime/cri"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// docs/reference.md is the contract users read: every flag of every command is named there.
func TestReferenceNamesEveryFlag(t *testing.T) {
	ref := string(readRepoFile(t, "docs/reference.md"))
	flag := regexp.MustCompile(`(?m)^\s+(?:-\w, )?--(?:\[no-\])?([a-z][a-z0-9.-]*)`)
	seen := map[string]bool{}
	for _, cmd := range []string{"serve", "ps", "top"} {
		out, err := exec.Command(exporterBinary(t), "help", cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("help %s: %v\n%s", cmd, err, out)
		}
		for _, m := range flag.FindAllStringSubmatch(string(out), -1) {
			name := m[1]
			switch name {
			case "help", "help-long", "help-man", "version":
				continue
			}
			seen[name] = true
			if !strings.Contains(ref, "`--"+name+"`") {
				t.Errorf("docs/reference.md does not name --%s (gpu-pod-exporter help %s lists it)", name, cmd)
			}
		}
	}
	if len(seen) < 20 {
		t.Errorf("found only %d flags in the help output: %v", len(seen), seen)
	}
}

// Every metric family the exporter can write is named in docs/reference.md (compatibility families in
// docs/compat.md), and every family that a table of docs/reference.md names exists. The families are those the
// collector describes with every part on (processes, allocations, both compatibility outputs) and the attribution
// and kubelet self-metrics, plus what the real binary serves on the demo node (build information and whatever the
// server registers).
func TestReferenceNamesEveryMetricFamily(t *testing.T) {
	families := map[string]bool{}
	kc, err := kubelet.New(kubelet.Config{Endpoint: "unix:///nonexistent/kubelet.sock"})
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	// A CRI resolver, which is never asked here, so that the resolvers' own self-metrics are described too.
	resolver, err := cri.New(cri.Config{Endpoints: []string{"unix:///nonexistent/containerd.sock"}})
	if err != nil {
		t.Fatal(err)
	}
	attr := attribution.New(attribution.Config{Resolvers: []runtime.Resolver{resolver}})
	reader := reading.New(simulated.Demo(), attr, time.Minute, slog.New(slog.DiscardHandler))
	c := collector.New(reader,
		collector.Options{Processes: true, Compat: []string{collector.CompatNvidiasmi, collector.CompatDCGM}, Allocations: kc},
		attr, kc)
	for _, name := range c.Families() {
		families[name] = true
	}
	// No GPU family has a self-metric's name: the collector would leave the self-metric out and say so.
	if _, err := c.Gather(); err != nil {
		t.Errorf("gathering every part and the self-metrics: %v", err)
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		// The self-metrics; vectors that have no series yet are not served, nor are the series engine's before it
		// drops a series, nor the collector's before it leaves out a value, nor the password checks' without basic
		// auth.
		for _, self := range []prometheus.Collector{reader, attr, kc, series.NewEngine(), basicauth.New(basicauth.Config{})} {
			self.Describe(ch)
		}
		c.DescribeSelf(ch)
		close(ch)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			families[m[1]] = true
		}
	}
	_, served := e2eutil.Scrape(t, e2eutil.StartExporter(t, exporterBinary(t), "--demo", "--compat=nvidiasmi,dcgm").Addr)
	for name := range served {
		families[name] = true
	}
	for _, name := range []string{"gpu_info", "gpu_process_memory_used_bytes", "gpu_pod_exporter_resolver_requests_total",
		"gpu_pod_exporter_kubelet_up", "gpu_pod_exporter_build_info", "DCGM_FI_DEV_FB_USED"} {
		if !families[name] {
			t.Fatalf("%s is not among the exporter's families %v: the test does not see them all", name, families)
		}
	}

	ref := string(readRepoFile(t, "docs/reference.md"))
	compat := string(readRepoFile(t, "docs/compat.md"))
	for name := range families {
		doc, text := "docs/reference.md", ref
		if strings.HasPrefix(name, "DCGM_") || strings.HasPrefix(name, "nvidiasmi_") {
			doc, text = "docs/compat.md", compat
		}
		documented := strings.Contains(text, "`"+name+"`")
		// client_golang's standard Go and process collectors are named by their prefix.
		if prefix, _, _ := strings.Cut(name, "_"); prefix == "go" || prefix == "process" {
			documented = documented || strings.Contains(text, "`"+prefix+"_*`")
		}
		if !documented {
			t.Errorf("%s does not name the metric family %s", doc, name)
		}
	}
	// The first cell of each row of the tables whose first column is "metric".
	var named []string
	inMetricTable := false
	for _, line := range strings.Split(ref, "\n") {
		switch {
		case !strings.HasPrefix(line, "|"):
			inMetricTable = false
		case strings.HasPrefix(line, "| metric |"):
			inMetricTable = true
		case inMetricTable && strings.HasPrefix(line, "| `"):
			name := strings.Trim(strings.TrimSpace(strings.Split(line, "|")[1]), "`")
			if !families[name] {
				t.Errorf("docs/reference.md documents %s, which the exporter does not write", name)
			}
			named = append(named, name)
		}
	}
	if !slices.Contains(named, "gpu_workload_memory_used_bytes") {
		t.Errorf("no metric table rows found in docs/reference.md (found %v)", named)
	}
}

// docs/reference.md's GPU and MIG tables are the device families' table (collector.DeviceFamilies): the same
// families, in its order, with its types and labels.
func TestReferenceListsDeviceFamilies(t *testing.T) {
	ref := string(readRepoFile(t, "docs/reference.md"))
	var documented []collector.Family
	for _, section := range []string{"### GPUs", "### MIG instances"} {
		for _, row := range tableRows(t, ref, section) {
			documented = append(documented, collector.Family{Name: strings.Trim(row[0], "`"), Type: row[1], Labels: labelNames(row[2])})
		}
	}
	want := collector.DeviceFamilies()
	describe := func(f collector.Family) string {
		return fmt.Sprintf("%s (%s; labels %v)", cmp.Or(f.Name, "no row"), f.Type, f.Labels)
	}
	for i := range max(len(documented), len(want)) {
		var got, w collector.Family
		if i < len(documented) {
			got = documented[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if got.Name != w.Name || got.Type != w.Type || !slices.Equal(got.Labels, w.Labels) {
			// The rows after the first difference are shifted: naming them would hide it.
			t.Fatalf("row %d of docs/reference.md's GPU and MIG tables is %s; the device families' table has %s",
				i+1, describe(got), describe(w))
		}
	}
}

// docs/compat.md's table of dcgm-exporter's fields names, for each field that --compat=dcgm writes, the device
// family it is written from.
func TestCompatListsDCGMFields(t *testing.T) {
	compat := string(readRepoFile(t, "docs/compat.md"))
	rows := tableRows(t, compat, "| metric (default-counters.csv) |")
	for _, f := range collector.DeviceFamilies() {
		for _, field := range f.DCGM {
			i := slices.IndexFunc(rows, func(row []string) bool { return slices.Contains(labelNames(row[0]), field) })
			if i < 0 {
				t.Errorf("docs/compat.md has no row for %s", field)
			} else if !strings.Contains(rows[i][2], "`"+f.Name) {
				t.Errorf("docs/compat.md's row for %s does not name %s, which it is written from: %q", field, f.Name, rows[i][2])
			}
		}
	}
}

// docs/reference.md names the identity labels of attribution.IdentityLabels: those of process and workload series
// in its identity label table, those of `ps --output json` among its keys, and no other.
func TestReferenceListsIdentityLabels(t *testing.T) {
	ref := string(readRepoFile(t, "docs/reference.md"))
	named := func(section string) map[string]bool {
		names := make(map[string]bool)
		for _, row := range tableRows(t, ref, section) {
			for _, name := range labelNames(row[0]) {
				names[name] = true
			}
		}
		return names
	}
	labels, keys := named("## Identity labels"), named("## `ps`")
	if !labels["label_<key>"] || !keys["pid"] {
		t.Fatalf("tables not found: identity labels %v, ps keys %v", labels, keys)
	}
	for _, l := range attribution.IdentityLabels {
		if onSeries := l.Use&(attribution.OnProcesses|attribution.OnWorkloads) != 0; labels[l.Name] != onSeries {
			t.Errorf("docs/reference.md's identity label table names %s: %v; it is on series: %v", l.Name, labels[l.Name], onSeries)
		}
		delete(labels, l.Name)
		if inPS := l.Use&attribution.InPS != 0; keys[l.Name] != inPS {
			t.Errorf("docs/reference.md's ps keys name %s: %v; ps writes it: %v", l.Name, keys[l.Name], inPS)
		}
	}
	delete(labels, "label_<key>")
	for name := range labels {
		t.Errorf("docs/reference.md's identity label table names %s, which is not an identity label", name)
	}
}

// tableRows returns the cells of the first table from the line that starts with marker (a heading above the
// table, or the table's header) to the next heading, without the table's header.
func tableRows(t *testing.T, doc, marker string) [][]string {
	t.Helper()
	i := strings.Index(doc, "\n"+marker)
	if i < 0 {
		t.Fatalf("no line starts with %q", marker)
	}
	var rows [][]string
	for n, line := range strings.Split(doc[i+1:], "\n") {
		if strings.HasPrefix(line, "|") {
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			rows = append(rows, cells)
		} else if len(rows) > 0 || n > 0 && strings.HasPrefix(line, "#") {
			break
		}
	}
	if len(rows) < 3 {
		t.Fatalf("no table below %q", marker)
	}
	return rows[2:] // the header and its rule
}

// labelNames are the names in backquotes in a cell, without those in parentheses (a label's values).
func labelNames(cell string) []string {
	var names []string
	depth := 0
	for i, part := range strings.Split(cell, "`") {
		if i%2 == 0 {
			depth += strings.Count(part, "(") - strings.Count(part, ")")
		} else if depth == 0 {
			names = append(names, part)
		}
	}
	return names
}

// The README names the test command CI runs; CONTRIBUTING.md gives a way to test without root, and scripts/test.sh
// (make test) honours it.
func TestTestCommandsDocumented(t *testing.T) {
	if readme := string(readRepoFile(t, "README.md")); !strings.Contains(readme, "`make test`") {
		t.Error("README.md does not name the test command, make test")
	}
	if ci := string(readRepoFile(t, ".ci/run")); !strings.Contains(ci, "make test") {
		t.Error(".ci/run does not run make test, the command README.md names")
	}
	contributing := string(readRepoFile(t, "CONTRIBUTING.md"))
	for _, want := range []string{"needs root", "go test ./...", "E2E=0 make test"} {
		if !strings.Contains(contributing, want) {
			t.Errorf("CONTRIBUTING.md does not say %q", want)
		}
	}
	if script := string(readRepoFile(t, "scripts/test.sh")); !strings.Contains(script, `if [ "${E2E:-1}" != 0 ]; then`) {
		t.Error("scripts/test.sh no longer skips the end-to-end tests for E2E=0, which CONTRIBUTING.md documents")
	}
}
