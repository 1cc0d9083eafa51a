package deploy

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The CloudWatch agent's configuration schema (amazon-cloudwatch-agent translator/config/schema.json: agent,
// logs.metrics_collected.prometheus, emfProcessorDefinition, metricDeclarationDefinition) for the parts the
// example uses, as Go types decoded strictly: the schema sets additionalProperties false on the prometheus section,
// the EMF processor and each metric declaration, so an unknown key there is one the agent rejects.
type cwAgentConfig struct {
	Agent *struct {
		MetricsCollectionInterval int    `json:"metrics_collection_interval,omitempty"`
		Logfile                   string `json:"logfile,omitempty"`
		Region                    string `json:"region,omitempty"`
		Debug                     bool   `json:"debug,omitempty"`
		OmitHostname              bool   `json:"omit_hostname,omitempty"`
	} `json:"agent,omitempty"`
	Logs *struct {
		MetricsCollected struct {
			Prometheus *cwPrometheus `json:"prometheus"`
		} `json:"metrics_collected"`
		LogStreamName      string `json:"log_stream_name,omitempty"`
		ForceFlushInterval int    `json:"force_flush_interval,omitempty"`
		EndpointOverride   string `json:"endpoint_override,omitempty"`
	} `json:"logs"`
}

type cwPrometheus struct {
	ClusterName             string          `json:"cluster_name,omitempty"`
	LogGroupName            string          `json:"log_group_name,omitempty"`
	PrometheusConfigPath    string          `json:"prometheus_config_path"`
	EMFProcessor            *cwEMFProcessor `json:"emf_processor"`
	ECSServiceDiscovery     map[string]any  `json:"ecs_service_discovery,omitempty"`
	DisableMetricExtraction bool            `json:"disable_metric_extraction,omitempty"`
}

type cwEMFProcessor struct {
	MetricDeclarationDedup bool                  `json:"metric_declaration_dedup,omitempty"`
	MetricNamespace        string                `json:"metric_namespace,omitempty"`
	MetricUnit             map[string]string     `json:"metric_unit,omitempty"`
	MetricDeclaration      []cwMetricDeclaration `json:"metric_declaration"`
}

type cwMetricDeclaration struct {
	SourceLabels    []string   `json:"source_labels"`
	LabelMatcher    string     `json:"label_matcher"`
	LabelSeparator  string     `json:"label_separator,omitempty"`
	MetricSelectors []string   `json:"metric_selectors"`
	Dimensions      [][]string `json:"dimensions"`
}

// CloudWatch's standard units (PutMetricData's StandardUnit), which metric_unit values must be.
var cwUnits = []string{"Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes",
	"Terabytes", "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
	"Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second", "Kilobits/Second",
	"Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None"}

func loadCWAgentConfig(t *testing.T) *cwAgentConfig {
	t.Helper()
	var c cwAgentConfig
	if err := strictJSON(readRepoFile(t, "deploy/cloudwatch/cwagent-config.json"), &c); err != nil {
		t.Fatalf("cwagent-config.json against the agent's schema: %v", err)
	}
	return &c
}

func TestCloudWatchAgentConfig(t *testing.T) {
	c := loadCWAgentConfig(t)
	if c.Logs == nil || c.Logs.MetricsCollected.Prometheus == nil || c.Logs.MetricsCollected.Prometheus.EMFProcessor == nil {
		t.Fatal("no logs.metrics_collected.prometheus.emf_processor")
	}
	p := c.Logs.MetricsCollected.Prometheus
	if p.PrometheusConfigPath == "" {
		t.Error("no prometheus_config_path")
	}
	emf := p.EMFProcessor
	for m, unit := range emf.MetricUnit {
		if !slices.Contains(cwUnits, unit) {
			t.Errorf("metric_unit %s: %q is not a CloudWatch unit", m, unit)
		}
	}
	perPod := map[string]bool{}
	for i, d := range emf.MetricDeclaration {
		if len(d.SourceLabels) == 0 || len(d.MetricSelectors) == 0 || len(d.Dimensions) == 0 {
			t.Errorf("metric_declaration[%d] is incomplete: %+v", i, d)
		}
		if _, err := regexp.Compile(d.LabelMatcher); err != nil {
			t.Errorf("metric_declaration[%d].label_matcher: %v", i, err)
		}
		var selected []string
		for _, s := range d.MetricSelectors {
			re, err := regexp.Compile(s)
			if err != nil {
				t.Errorf("metric_declaration[%d].metric_selectors: %v", i, err)
				continue
			}
			// Every selector must match a metric the exporter has (docs/reference.md documents them all).
			for _, m := range []string{"gpu_workload_memory_used_bytes", "gpu_workload_sm_utilization_ratio",
				"gpu_memory_used_bytes", "gpu_utilization_ratio"} {
				if re.MatchString(m) {
					selected = append(selected, m)
				}
			}
		}
		if len(selected) == 0 {
			t.Errorf("metric_declaration[%d] selects none of the exporter's metrics", i)
		}
		for _, dims := range d.Dimensions {
			if len(dims) > 30 {
				t.Errorf("metric_declaration[%d]: more than 30 dimensions", i)
			}
			if slices.Contains(dims, "pod") && slices.Contains(dims, "namespace") {
				for _, m := range selected {
					perPod[m] = true
				}
			}
		}
	}
	for _, m := range []string{"gpu_workload_memory_used_bytes", "gpu_workload_sm_utilization_ratio"} {
		if !perPod[m] {
			t.Errorf("%s is not published with pod and namespace dimensions", m)
		}
	}
}

// TestCloudWatchDeclarationsMatchExporterSeries applies the declarations as the agent does (the source labels'
// values joined by ";" matched against label_matcher; metric_selectors against the name) to the demo exporter's
// series, and checks that per-pod series are selected with every dimension present, and node-level series are not
// published with pod dimensions.
func TestCloudWatchDeclarationsMatchExporterSeries(t *testing.T) {
	c := loadCWAgentConfig(t)
	type series struct {
		name   string
		labels map[string]string
	}
	// Labels as the agent sees them after prometheus-eks.yaml's scrape: job from the job name, ClusterName added by
	// the agent, and the exporter's own labels kept by honor_labels.
	pod := series{"gpu_workload_memory_used_bytes", map[string]string{"job": "gpu-pod-exporter", "ClusterName": "c",
		"instance": "node-1", "gpu": "0", "namespace": "ml-training", "pod": "bert-finetune-7c9d8b6f4-x2kqp", "container": "trainer"}}
	slurm := series{"gpu_workload_memory_used_bytes", map[string]string{"job": "gpu-pod-exporter", "ClusterName": "c",
		"instance": "node-1", "gpu": "4", "namespace": "", "pod": "", "slurm_job_id": "88231"}}
	device := series{"gpu_memory_used_bytes", map[string]string{"job": "gpu-pod-exporter", "ClusterName": "c",
		"instance": "node-1", "gpu": "0"}}
	published := func(s series) [][]string { return cwPublished(t, c, s.name, s.labels) }
	if got := published(pod); !slices.ContainsFunc(got, func(d []string) bool { return slices.Contains(d, "pod") }) {
		t.Errorf("a pod's GPU memory is published with dimensions %v, want pod and namespace", got)
	}
	if got := published(slurm); len(got) != 0 {
		t.Errorf("a Slurm job's series (empty pod) is published with dimensions %v", got)
	}
	if got := published(device); len(got) == 0 || slices.ContainsFunc(got, func(d []string) bool { return slices.Contains(d, "pod") }) {
		t.Errorf("device memory is published with dimensions %v, want node and GPU", got)
	}
}

// cwPublished applies the declarations of c as the agent does to one series (its name and labels as the agent sees
// them): the source labels' values joined by the separator (";") are matched against label_matcher, the name
// against metric_selectors. It returns the dimension sets the series is published with; a dimension that is not a
// label of the series is an error.
func cwPublished(t *testing.T, c *cwAgentConfig, name string, labels map[string]string) [][]string {
	t.Helper()
	var dims [][]string
	for _, d := range c.Logs.MetricsCollected.Prometheus.EMFProcessor.MetricDeclaration {
		sep := d.LabelSeparator
		if sep == "" {
			sep = ";"
		}
		var vals []string
		for _, l := range d.SourceLabels {
			vals = append(vals, labels[l])
		}
		if !regexp.MustCompile(d.LabelMatcher).MatchString(strings.Join(vals, sep)) {
			continue
		}
		if !slices.ContainsFunc(d.MetricSelectors, func(sel string) bool { return regexp.MustCompile(sel).MatchString(name) }) {
			continue
		}
		for _, set := range d.Dimensions {
			for _, dim := range set {
				if _, ok := labels[dim]; !ok {
					t.Errorf("%s: dimension %s is not a label of the series", name, dim)
				}
			}
			dims = append(dims, set)
		}
	}
	return dims
}

// ec2TargetCommand is the command that prometheus-ec2.yaml's comment tells each instance to run: the lines of the
// comment indented by three spaces, joined at their trailing backslashes.
func ec2TargetCommand(t testing.TB) string {
	t.Helper()
	var cmd strings.Builder
	for _, line := range strings.Split(string(readRepoFile(t, "deploy/cloudwatch/prometheus-ec2.yaml")), "\n") {
		if rest, ok := strings.CutPrefix(line, "#   "); ok {
			cmd.WriteString(strings.TrimSuffix(strings.TrimSpace(rest), "\\") + " ")
		}
	}
	if cmd.Len() == 0 {
		t.Fatal("prometheus-ec2.yaml: no command in its comment (lines starting with '#   ')")
	}
	return strings.TrimSpace(cmd.String())
}

// On EC2 every instance runs the same scrape file against its own exporter. A static target there is the same on
// every instance ("localhost:9402" as the instance label), and the per-GPU dimensions (ClusterName, instance, gpu)
// would merge every instance into one metric: each target must name its instance. The file's own target comes from
// a file_sd file that the documented command writes with an instance label (test/deploy's e2e test runs that
// command and the scrape in a real Prometheus).
func TestCloudWatchEC2TargetNamesTheInstance(t *testing.T) {
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			StaticConfigs []struct {
				Targets []string          `json:"targets"`
				Labels  map[string]string `json:"labels"`
			} `json:"static_configs"`
			FileSDConfigs []struct {
				Files []string `json:"files"`
			} `json:"file_sd_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, "deploy/cloudwatch/prometheus-ec2.yaml"), &cfg); err != nil {
		t.Fatal(err)
	}
	for _, job := range cfg.ScrapeConfigs {
		for _, sc := range job.StaticConfigs {
			if sc.Labels["instance"] == "" {
				t.Errorf("job %s: static targets %v have no instance label: every EC2 instance would publish as %q",
					job.JobName, sc.Targets, sc.Targets)
			}
		}
	}
	cmd := ec2TargetCommand(t)
	for _, job := range cfg.ScrapeConfigs {
		written := false
		for _, sd := range job.FileSDConfigs {
			for _, f := range sd.Files {
				written = written || strings.Contains(cmd, ">"+f)
			}
		}
		if len(job.StaticConfigs) == 0 && !written {
			t.Errorf("job %s: the documented command %q writes none of its file_sd files", job.JobName, cmd)
		}
	}
	if !strings.Contains(cmd, `"instance"`) {
		t.Errorf("the documented command %q does not set the instance label", cmd)
	}
}
