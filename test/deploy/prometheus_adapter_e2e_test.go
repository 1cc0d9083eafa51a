//go:build e2e

package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	texttemplate "text/template"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// adapterRule is one rule of prometheus-adapter's configuration (its pkg/config's DiscoveryRule), as far as the
// rules of deploy/prometheus-adapter/config.yaml use it.
type adapterRule struct {
	SeriesQuery string `yaml:"seriesQuery"`
	Resources   struct {
		Overrides map[string]struct {
			Resource string `yaml:"resource"`
		} `yaml:"overrides"`
	} `yaml:"resources"`
	Name struct {
		Matches string `yaml:"matches"`
		As      string `yaml:"as"`
	} `yaml:"name"`
	MetricsQuery string `yaml:"metricsQuery"`
}

// TestPrometheusAdapterRules runs each rule of deploy/prometheus-adapter/config.yaml the way prometheus-adapter
// (v0.12) does, in a real Prometheus that scrapes the exporter on the demo node: the series query through the series
// API, the metric name from the series name by the rule's name.matches and name.as (regexp's Expand, as its
// metricNamer does), and the metrics query expanded by a text/template with << >> delimiters, as its metricsQuery
// builds it for a Pods metric of an HPA: Series the series, LabelMatchers namespace="<ns>",pod=~"<a>|<b>", GroupBy
// pod. Each pod gets its own use, the time-sliced GPU's pods their own parts of it, and a pod that holds a GPU and
// runs nothing 0. prometheus-adapter itself is not run: it cannot be built here.
func TestPrometheusAdapterRules(t *testing.T) {
	var cfg struct {
		Rules []adapterRule `yaml:"rules"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, "deploy/prometheus-adapter/config.yaml"), &cfg); err != nil {
		t.Fatal(err)
	}
	addr := e2eutil.StartExporter(t, exporterBinary(t), "--demo").Addr
	prom := e2eutil.StartPrometheus(t, e2eutil.ScrapeConfig(addr))
	testkit.WaitFor(t, 60*time.Second, "the workload and accounting series", func() bool {
		res, err := e2eutil.TryQuery(prom, `gpu_workload_power_watts{pod="llama-eval-0"}`)
		return err == nil && len(res) == 1
	})

	// llama-eval-0 shares GPU 0 with two other pods; hparam-sweep-3 holds GPU 6 and runs nothing; no-gpu-0 has no GPU.
	const namespace = "ml-research"
	pods := []string{"hparam-sweep-3", "llama-eval-0", "no-gpu-0"}
	var names []string
	for _, rule := range cfg.Rules {
		if rule.Resources.Overrides["namespace"].Resource != "namespace" || rule.Resources.Overrides["pod"].Resource != "pod" {
			t.Errorf("rule %s: resources %v, want the namespace and pod labels mapped to their resources", rule.SeriesQuery, rule.Resources.Overrides)
		}
		// Discovery: what the series query finds, and the name it gives the series.
		raw, err := e2eutil.PromAPI(prom, "/api/v1/series", url.Values{"match[]": {rule.SeriesQuery}})
		if err != nil {
			t.Fatalf("series %s: %v", rule.SeriesQuery, err)
		}
		var series []map[string]string
		if err := json.Unmarshal(raw, &series); err != nil {
			t.Fatal(err)
		}
		if len(series) == 0 {
			t.Fatalf("series %s: none", rule.SeriesQuery)
		}
		re := regexp.MustCompile(rule.Name.Matches)
		seriesName := series[0]["__name__"]
		for _, s := range series {
			if s["namespace"] == "" || s["pod"] == "" || s["__name__"] != seriesName {
				t.Errorf("series %s: %v, want one family, every series with its namespace and pod", rule.SeriesQuery, s)
			}
		}
		m := re.FindStringSubmatchIndex(seriesName)
		if m == nil {
			t.Fatalf("%s does not match the rule's name.matches %s", seriesName, rule.Name.Matches)
		}
		name := string(re.ExpandString(nil, rule.Name.As, seriesName, m))
		names = append(names, name)

		// The metrics query for the three pods, as the adapter expands it.
		tmpl := texttemplate.Must(texttemplate.New("metrics-query").Delims("<<", ">>").Parse(rule.MetricsQuery))
		var q bytes.Buffer
		if err := tmpl.Execute(&q, map[string]any{
			"Series":        seriesName,
			"LabelMatchers": fmt.Sprintf("namespace=%q,pod=~%q", namespace, strings.Join(pods, "|")),
			"GroupBy":       "pod",
		}); err != nil {
			t.Fatal(err)
		}
		got := e2eutil.ByLabel(e2eutil.Query(t, prom, q.String()), "pod")
		want := e2eutil.ByLabel(e2eutil.Query(t, prom, fmt.Sprintf(`sum by (pod) (%s{namespace=%q})`, seriesName, namespace)), "pod")
		want["hparam-sweep-3"] = 0
		for pod, w := range want {
			if !slices.Contains(pods, pod) {
				delete(want, pod)
				continue
			}
			if g, ok := got[pod]; !ok || math.Abs(g-w) > 1e-9 {
				t.Errorf("%s (%s) for pod %s = %v (present %v), want %v", name, q.String(), pod, g, ok, w)
			}
		}
		if len(got) != 2 || got["llama-eval-0"] <= 0 {
			t.Errorf("%s: %v, want llama-eval-0's own use and hparam-sweep-3's 0, no value for no-gpu-0", name, got)
		}
	}
	slices.Sort(names)
	if want := []string{"gpu_memory_used_bytes", "gpu_power_watts", "gpu_sm_utilization_ratio"}; !slices.Equal(names, want) {
		t.Errorf("the rules serve %v, want %v (docs/autoscaling.md names them)", names, want)
	}
	// llama-eval-0's SM use is its own 0.22 of the time-sliced GPU 0, not the GPU's 0.71 that a per-GPU metric
	// would give each of its three pods.
	q := `sum by (pod) (gpu_workload_sm_utilization_ratio{namespace="ml-research",pod=~"llama-eval-0"})`
	if got := e2eutil.ByLabel(e2eutil.Query(t, prom, q), "pod")["llama-eval-0"]; math.Abs(got-0.22) > 1e-9 {
		t.Errorf("%s = %v, want the pod's own 0.22", q, got)
	}
}
