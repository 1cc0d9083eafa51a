package deploy

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// imageRepo is the one image name: the chart's default, the manifests', the docs' and the release's.
const imageRepo = "ghcr.io/gpu-pod-exporter/gpu-pod-exporter"

// gpuNodeLabels are the node labels that the default affinity must accept, each alone: a node of each platform
// carries only its own (key → the value it has there; "" where the term only asks that the key exists).
var gpuNodeLabels = map[string]struct{ key, value string }{
	"GPU operator / GPU feature discovery": {"nvidia.com/gpu.present", "true"},
	"node feature discovery":               {"feature.node.kubernetes.io/pci-10de.present", "true"},
	"GKE":                                  {"cloud.google.com/gke-accelerator", "nvidia-h100-80gb"},
	"AKS":                                  {"kubernetes.azure.com/accelerator", "nvidia"},
	"EKS Auto Mode":                        {"eks.amazonaws.com/instance-gpu-manufacturer", "nvidia"},
	"EKS with Karpenter":                   {"karpenter.k8s.aws/instance-gpu-manufacturer", "nvidia"},
	"EKS node groups (Cluster Autoscaler)": {"k8s.amazonaws.com/accelerator", "nvidia-tesla-a10g"},
}

// matchesNodeSelectorTerms evaluates a required node affinity the way the scheduler does for these operators: the
// terms are ORed, the expressions of one term ANDed.
func matchesNodeSelectorTerms(terms []corev1.NodeSelectorTerm, labels map[string]string) bool {
	for _, term := range terms {
		ok := len(term.MatchExpressions) > 0
		for _, e := range term.MatchExpressions {
			v, has := labels[e.Key]
			switch e.Operator {
			case corev1.NodeSelectorOpIn:
				ok = ok && has && slices.Contains(e.Values, v)
			case corev1.NodeSelectorOpExists:
				ok = ok && has
			case corev1.NodeSelectorOpDoesNotExist:
				ok = ok && !has
			case corev1.NodeSelectorOpNotIn:
				ok = ok && !slices.Contains(e.Values, v)
			default:
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// checkGPUNodeAffinity: the pod lands on a GPU node of every platform, and on no node without a GPU label.
func checkGPUNodeAffinity(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	if pod.Affinity == nil || pod.Affinity.NodeAffinity == nil || pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatalf("no required node affinity: %+v", pod.Affinity)
	}
	terms := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for platform, l := range gpuNodeLabels {
		node := map[string]string{"kubernetes.io/os": "linux", l.key: l.value}
		if !matchesNodeSelectorTerms(terms, node) {
			t.Errorf("a %s GPU node (%s=%s) does not match the affinity %+v", platform, l.key, l.value, terms)
		}
	}
	cpuNode := map[string]string{"kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m7i.large",
		"nvidia.com/gpu.present": "false", "kubernetes.azure.com/accelerator": "none"}
	if matchesNodeSelectorTerms(terms, cpuNode) {
		t.Errorf("a node without a GPU label matches the affinity %+v", terms)
	}
}

// checkCriticalPodsQuota: the ResourceQuota that admits system-*-critical pods outside kube-system (GKE).
func checkCriticalPodsQuota(t *testing.T, r *rendered, priorityClass string) {
	t.Helper()
	if len(r.resourceQuotas) != 1 {
		t.Fatalf("%d ResourceQuotas, want one for priority class %s", len(r.resourceQuotas), priorityClass)
	}
	q := r.resourceQuotas[0]
	sel := q.Spec.ScopeSelector
	if q.Namespace != r.releaseNS || sel == nil || len(sel.MatchExpressions) != 1 ||
		sel.MatchExpressions[0].ScopeName != corev1.ResourceQuotaScopePriorityClass ||
		sel.MatchExpressions[0].Operator != corev1.ScopeSelectorOpIn ||
		!reflect.DeepEqual(sel.MatchExpressions[0].Values, []string{priorityClass}) {
		t.Errorf("ResourceQuota %s/%s scope %+v, want PriorityClass In [%s]", q.Namespace, q.Name, sel, priorityClass)
	}
	if pods := q.Spec.Hard[corev1.ResourcePods]; pods.Value() < 1000 || len(q.Spec.Hard) != 1 {
		t.Errorf("ResourceQuota hard %v, want only a generous pods limit", q.Spec.Hard)
	}
}

// TestHelmGPUNodeAffinityOverrides: the documented ways to change where the pods run.
func TestHelmGPUNodeAffinityOverrides(t *testing.T) {
	ownNode := map[string]string{"node-role.example.com/gpu": ""}
	// gpuNodeSelectorTerms replaces the platforms' terms.
	r := template(t, "gpe", "monitoring", "--values", valuesFile(t, `
gpuNodeSelectorTerms:
  - matchExpressions: [{key: nvidia.com/gpu.present, operator: In, values: ["true"]}]
  - matchExpressions: [{key: node-role.example.com/gpu, operator: Exists}]
`))
	terms := r.daemonSet.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if !matchesNodeSelectorTerms(terms, ownNode) || len(terms) != 2 {
		t.Errorf("own term not rendered: %+v", terms)
	}
	// extraGpuNodeSelectorTerms adds to them: every platform's GPU node still matches, and so does one's own.
	extra := valuesFile(t, `
extraGpuNodeSelectorTerms:
  - matchExpressions: [{key: node-role.example.com/gpu, operator: Exists}]
`)
	r = template(t, "gpe", "monitoring", "--values", extra)
	checkGPUNodeAffinity(t, r.daemonSet.Spec.Template.Spec)
	terms = r.daemonSet.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if !matchesNodeSelectorTerms(terms, ownNode) || len(terms) != len(gpuNodeLabels)+1 {
		t.Errorf("extraGpuNodeSelectorTerms did not add its term to the %d defaults: %+v", len(gpuNodeLabels), terms)
	}
	// With no platform terms, the extra terms alone.
	r = template(t, "gpe", "monitoring", "--values", extra, "--set", "gpuNodeSelectorTerms=null")
	terms = r.daemonSet.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || !matchesNodeSelectorTerms(terms, ownNode) {
		t.Errorf("extra terms without platform terms: %+v", terms)
	}
	// affinity replaces both.
	r = template(t, "gpe", "monitoring", "--values", extra, "--values", valuesFile(t, `
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms: [{matchExpressions: [{key: example.com/only, operator: Exists}]}]
`))
	terms = r.daemonSet.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || terms[0].MatchExpressions[0].Key != "example.com/only" {
		t.Errorf("affinity did not replace the terms: %+v", terms)
	}
	// No terms: every node.
	r = template(t, "gpe", "monitoring", "--set", "gpuNodeSelectorTerms=null")
	if a := r.daemonSet.Spec.Template.Spec.Affinity; a != nil {
		t.Errorf("affinity %+v with gpuNodeSelectorTerms=null, want none", a)
	}
	// No system priority class: no quota.
	r = template(t, "gpe", "monitoring", "--set", "priorityClassName=")
	if len(r.resourceQuotas) != 0 || r.daemonSet.Spec.Template.Spec.PriorityClassName != "" {
		t.Errorf("priorityClassName= still renders %q and %d quotas", r.daemonSet.Spec.Template.Spec.PriorityClassName, len(r.resourceQuotas))
	}
}

// The default rendering adds no capability; drm.enabled adds exactly the two that reading other processes' DRM
// files needs (checkCommon checks every rendering so, by its values).
func TestHelmDRMCapabilities(t *testing.T) {
	for _, args := range [][]string{nil, {"--set", "drm.enabled=true"}} {
		r := template(t, "gpe", "monitoring", args...)
		checkCommon(t, r)
		add := exporterContainer(t, r.daemonSet).SecurityContext.Capabilities.Add
		if want := map[bool]int{false: 0, true: 2}[r.drm]; len(add) != want {
			t.Errorf("%v: capabilities added %v, want %d", args, add, want)
		}
	}
}

// On a cluster with NVIDIA nodes and AMD or Intel nodes, two releases as docs/install.md installs them (the NVIDIA
// one leaving the preset's nodes out with excludeNodeLabels) give every GPU node exactly one exporter: NVIDIA-only
// nodes the NVIDIA release's, without capabilities; the AMD or Intel nodes, a node of both vendors included, the
// preset's.
func TestHelmMixedClusterReleases(t *testing.T) {
	terms := func(r *rendered) []corev1.NodeSelectorTerm {
		return r.daemonSet.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	}
	for _, tc := range []struct {
		preset  string
		exclude string
		vendor  map[string]string // the labels of a node with the preset's GPUs
	}{
		{"amd-gpu.yaml", `{"feature.node.kubernetes.io/amd-gpu":["true"],"feature.node.kubernetes.io/amd-vgpu":["true"]}`,
			map[string]string{"feature.node.kubernetes.io/amd-gpu": "true"}},
		{"intel-gpu.yaml", `{"intel.feature.node.kubernetes.io/gpu":["true"]}`,
			map[string]string{"intel.feature.node.kubernetes.io/gpu": "true"}},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			nvidia := template(t, "gpu-pod-exporter", "monitoring", "--set-json", "excludeNodeLabels="+tc.exclude)
			other := template(t, "gpu-pod-exporter-other", "monitoring", "--values", filepath.Join(repoRoot(t), presetsDir, tc.preset))
			checkCommon(t, nvidia)
			checkCommon(t, other)
			if nvidia.drm || !other.drm {
				t.Fatalf("drm.enabled: NVIDIA release %v, preset's %v", nvidia.drm, other.drm)
			}
			for platform, l := range gpuNodeLabels {
				node := map[string]string{"kubernetes.io/os": "linux", l.key: l.value}
				if !matchesNodeSelectorTerms(terms(nvidia), node) || matchesNodeSelectorTerms(terms(other), node) {
					t.Errorf("an NVIDIA node of %s: want the NVIDIA release's alone", platform)
				}
				for k, v := range tc.vendor {
					node[k] = v
				}
				if matchesNodeSelectorTerms(terms(nvidia), node) || !matchesNodeSelectorTerms(terms(other), node) {
					t.Errorf("a node of %s with the preset's GPUs too: want the preset's release alone", platform)
				}
			}
			node := map[string]string{"kubernetes.io/os": "linux"}
			for k, v := range tc.vendor {
				node[k] = v
			}
			if matchesNodeSelectorTerms(terms(nvidia), node) || !matchesNodeSelectorTerms(terms(other), node) {
				t.Errorf("a node with the preset's GPUs alone: want the preset's release alone")
			}
		})
	}
	// [] leaves out every node with the label; with no terms, every node but those.
	r := template(t, "gpe", "monitoring", "--set", "gpuNodeSelectorTerms=null", "--set-json", `excludeNodeLabels={"example.com/elsewhere":[]}`)
	for labels, want := range map[string]bool{"": true, "example.com/elsewhere=": false, "example.com/elsewhere=true": false} {
		node := map[string]string{"kubernetes.io/os": "linux"}
		if k, v, ok := strings.Cut(labels, "="); ok {
			node[k] = v
		}
		if got := matchesNodeSelectorTerms(terms(r), node); got != want {
			t.Errorf("a node labelled %q matches %v, want %v: %+v", labels, got, want, terms(r))
		}
	}
}

// TestHelmValuesSchemaRejectsUnknownKeys: a misspelt key, or a key of dcgm-exporter's chart that this chart does not
// have, fails helm template with a message that names it, instead of being ignored.
func TestHelmValuesSchemaRejectsUnknownKeys(t *testing.T) {
	for _, tc := range []struct{ values, key string }{
		{"nodeSelecter: {gpu: \"true\"}\n", "nodeSelecter"},
		{"serviceMonitor: {intervall: 15s}\n", "intervall"},
		{"webConfig: {config: {tls_server_confg: {cert_file: tls.crt}}}\n", "tls_server_confg"},
		{"resources: {limit: {memory: 1Gi}}\n", "limit"},
		// dcgm-exporter chart values without a counterpart here.
		{"arguments: [\"-f\", \"/etc/dcgm-exporter/dcp-metrics-included.csv\"]\n", "arguments"},
		{"serviceMonitor: {honorLabels: false}\n", "honorLabels"},
		{"extraHostVolumes: [{name: host, hostPath: /opt}]\n", "extraHostVolumes"},
		{"service: {address: \":9400\"}\n", "address"},
		{"kubeletPath: /var/lib/kubelet/pod-resources\n", "kubeletPath"},
		// This chart's former names.
		{"port: 9500\n", "port"},
		{"serviceMonitor: {labels: {release: kube-prometheus-stack}}\n", "labels"},
		{"nvidia: {runtimeClassName: nvidia}\n", "runtimeClassName"},
		// Typos in the compatibility and autoscaling blocks.
		{"compat: {dcgm: {enable: true}}\n", "enable"},
		{"compat: {dcgm: {enabled: true, verison: 4.8.3}}\n", "verison"},
		{"compat: {dcgmExporter: true}\n", "dcgmExporter"},
		{"prometheusAdapter: {enabled: true, namepsace: monitoring}\n", "namepsace"},
	} {
		out, err := runErr(t, helm(t), "template", "gpe", chartDir, "--kube-version", kubeVersion, "--values", valuesFile(t, tc.values))
		if err == nil {
			t.Errorf("values %q rendered without an error", tc.values)
			continue
		}
		if !strings.Contains(string(out), "'"+tc.key+"'") || !strings.Contains(string(out), "not allowed") {
			t.Errorf("values %q: the error does not name %q:\n%s", tc.values, tc.key, out)
		}
	}
	// A dcgm-exporter version that is not one, and a block given the wrong shape.
	for _, values := range []string{"compat: {dcgm: {enabled: true, version: latest}}\n", "compat: {dcgm: true}\n",
		"prometheusAdapter: {enabled: \"yes\"}\n"} {
		if out, err := runErr(t, helm(t), "template", "gpe", chartDir, "--kube-version", kubeVersion, "--values", valuesFile(t, values)); err == nil {
			t.Errorf("values %q rendered without an error:\n%.300s", values, out)
		}
	}
	// Wrong types are rejected too.
	out, err := runErr(t, helm(t), "template", "gpe", chartDir, "--kube-version", kubeVersion, "--set", "service.port=http")
	if err == nil || !strings.Contains(string(out), "port") {
		t.Errorf("service.port=http: err %v\n%s", err, out)
	}
}

// TestHelmDcgmStyleValues: the values that dcgm-exporter's chart users carry over and this chart has, under the same
// names, take effect.
func TestHelmDcgmStyleValues(t *testing.T) {
	r := template(t, "gpe", "monitoring", "--values", valuesFile(t, `
hostNetwork: true
service: {port: 9400}
serviceMonitor:
  additionalLabels: {release: kube-prometheus-stack}
  interval: 15s
  relabelings: [{sourceLabels: [__meta_kubernetes_pod_node_name], targetLabel: node}]
  metricRelabelings: [{sourceLabels: [__name__], regex: "gpu_process_.*", action: drop}]
priorityClassName: system-node-critical
runtimeClassName: nvidia
`))
	checkCommon(t, r)
	pod := r.daemonSet.Spec.Template.Spec
	c := exporterContainer(t, r.daemonSet)
	if !pod.HostNetwork || c.Ports[0].ContainerPort != 9400 || r.service.Spec.Ports[0].Port != 9400 ||
		!slices.Contains(c.Args, "--web.listen-address=:9400") {
		t.Errorf("hostNetwork %v, container port %d, Service port %d, args %v", pod.HostNetwork, c.Ports[0].ContainerPort,
			r.service.Spec.Ports[0].Port, c.Args)
	}
	ep := r.serviceMonitor.Spec.Endpoints[0]
	if r.serviceMonitor.Labels["release"] != "kube-prometheus-stack" || string(ep.Interval) != "15s" ||
		len(ep.RelabelConfigs) != 2 || ep.RelabelConfigs[1].TargetLabel != "node" || len(ep.MetricRelabelConfigs) != 1 {
		t.Errorf("ServiceMonitor labels %v, endpoint %+v", r.serviceMonitor.Labels, ep)
	}
	if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" {
		t.Errorf("runtimeClassName %v", pod.RuntimeClassName)
	}
}

// TestHelmWebConfigProbes renders the chart with TLS and basic auth, runs the real exporter with the web
// configuration from the rendered Secret and the rendered arguments, and runs the rendered probes against it the way
// the kubelet does; they pass although an unauthenticated GET is refused.
func TestHelmWebConfigProbes(t *testing.T) {
	certFile, keyFile := testkit.WriteSelfSignedCert(t, t.TempDir())
	certBytes, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	keyBytes, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM := string(certBytes), string(keyBytes)
	hash, err := bcrypt.GenerateFromPassword([]byte("scrape-secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	values := fmt.Sprintf(`
webConfig:
  config:
    tls_server_config: {cert_file: tls.crt, key_file: tls.key}
    basic_auth_users: {prometheus: %q}
  files:
    tls.crt: %q
    tls.key: %q
serviceMonitor:
  scheme: https
  tlsConfig: {insecureSkipVerify: true}
  basicAuth:
    username: {name: gpe-scrape, key: username}
    password: {name: gpe-scrape, key: password}
`, hash, certPEM, keyPEM)
	r := template(t, "gpe", "monitoring", "--values", valuesFile(t, values))
	checkCommon(t, r)
	if len(r.secrets) != 1 || r.secrets[0].Name != "gpe-gpu-pod-exporter-web-config" {
		t.Fatalf("secrets %v, want the web-config Secret", r.secrets)
	}
	pod := r.daemonSet.Spec.Template.Spec
	c := exporterContainer(t, r.daemonSet)

	// The Secret's files where the pod mounts them, under a temporary root.
	var mountPath string
	for _, m := range c.VolumeMounts {
		if i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }); i >= 0 &&
			pod.Volumes[i].Secret != nil && pod.Volumes[i].Secret.SecretName == r.secrets[0].Name {
			mountPath = m.MountPath
		}
	}
	if mountPath == "" {
		t.Fatalf("the web-config Secret is not mounted: %+v", c.VolumeMounts)
	}
	root := t.TempDir()
	dir := filepath.Join(root, mountPath)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range r.secrets[0].StringData {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o400); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.secrets[0].StringData["tls.key"]; got != keyPEM {
		t.Errorf("tls.key changed on its way through the chart")
	}

	// The exporter with the rendered arguments, the config path moved under root, on free loopback ports: the
	// container's port names map to them.
	addr, healthAddr := e2eutil.FreeAddr(t), e2eutil.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	_, healthPort, _ := net.SplitHostPort(healthAddr)
	ports := map[string]string{"metrics": port, "health": healthPort}
	var args []string
	for _, a := range c.Args {
		switch {
		case strings.HasPrefix(a, "--web.config.file="):
			args = append(args, "--web.config.file="+filepath.Join(root, strings.TrimPrefix(a, "--web.config.file=")))
		case strings.HasPrefix(a, "--web.listen-address="):
			args = append(args, "--web.listen-address="+addr)
		case strings.HasPrefix(a, "--web.health-listen-address="):
			args = append(args, "--web.health-listen-address="+healthAddr)
		default:
			args = append(args, a)
		}
	}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--web.config.file=") }) {
		t.Fatalf("no --web.config.file in %v", c.Args)
	}
	cmd := exec.Command(exporterBinary(t), append(args, "--demo")...)
	proc := e2eutil.Start(t, cmd)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	testkit.WaitFor(t, 30*time.Second, "the exporter to serve TLS", func() bool {
		if done, _ := proc.Exited(); done {
			t.Fatalf("the exporter exited:\n%s", proc.Output())
		}
		resp, err := client.Get("https://" + addr + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})

	// Auth is on: a GET without credentials is refused on the main listener, /healthz included, so probes there
	// would fail; with them /metrics serves.
	for _, path := range []string{"/", "/healthz", "/readyz"} {
		resp, err := client.Get("https://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without credentials: %s, want 401", path, resp.Status)
		}
	}
	req, _ := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
	req.SetBasicAuth("prometheus", "scrape-secret")
	if resp, err := client.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET /metrics with the basic auth user: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}

	// The rendered probes, as the kubelet runs them (readiness once the demo's first reading is done).
	probes := map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe}
	for name, p := range probes {
		var err error
		testkit.WaitFor(t, 30*time.Second, "the "+name+" probe to pass", func() bool {
			err = runProbe(p, ports)
			return err == nil
		})
	}
	// And the probes fail when the exporter is gone: they test something.
	cmd.Process.Kill()
	testkit.WaitFor(t, 10*time.Second, "the exporter to exit", func() bool { done, _ := proc.Exited(); return done })
	for name, p := range probes {
		if err := runProbe(p, ports); err == nil {
			t.Errorf("%s probe passed with the exporter stopped", name)
		}
	}
}

// runProbe runs a probe against 127.0.0.1 as the kubelet does: tcpSocket connects; httpGet succeeds on 200-399,
// without verifying a certificate. ports maps the container's port names to the local ports.
func runProbe(p *corev1.Probe, ports map[string]string) error {
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	switch {
	case p.TCPSocket != nil:
		port, ok := ports[p.TCPSocket.Port.StrVal]
		if !ok {
			return fmt.Errorf("tcpSocket port %v", p.TCPSocket.Port)
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), timeout)
		if err != nil {
			return err
		}
		return conn.Close()
	case p.HTTPGet != nil:
		port, ok := ports[p.HTTPGet.Port.StrVal]
		if !ok {
			return fmt.Errorf("httpGet port %v", p.HTTPGet.Port)
		}
		scheme := strings.ToLower(string(p.HTTPGet.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		client := &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		req, err := http.NewRequest("GET", scheme+"://"+net.JoinHostPort("127.0.0.1", port)+p.HTTPGet.Path, nil)
		if err != nil {
			return err
		}
		for _, h := range p.HTTPGet.HTTPHeaders {
			req.Header.Set(h.Name, h.Value)
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP %s", resp.Status)
		}
		return nil
	}
	return fmt.Errorf("neither tcpSocket nor httpGet")
}

// The compatibility block renders the --compat flags, which the exporter accepts, and nothing while off.
func TestHelmCompatValues(t *testing.T) {
	c := exporterContainer(t, template(t, "gpe", "monitoring").daemonSet)
	for _, arg := range c.Args {
		if strings.HasPrefix(arg, "--compat") {
			t.Errorf("default values render %s; the compatibility outputs are off by default", arg)
		}
	}
	r := template(t, "gpe", "monitoring", "--values", valuesFile(t, `
compat:
  nvidiasmi: true
  dcgm: {enabled: true, version: 4.6.0-4.8.3, grEngineActiveEstimate: true}
`))
	checkCommon(t, r)
	c = exporterContainer(t, r.daemonSet)
	for _, want := range []string{"--compat=nvidiasmi,dcgm", "--compat.dcgm-version=4.6.0-4.8.3", "--compat.dcgm-gr-engine-estimate"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %s", c.Args, want)
		}
	}
	checkArgsAccepted(t, c.Args)
	// The version and the estimate tune --compat=dcgm and are not rendered without it.
	c = exporterContainer(t, template(t, "gpe", "monitoring", "--set", "compat.nvidiasmi=true",
		"--set", "compat.dcgm.version=4.8.3", "--set", "compat.dcgm.grEngineActiveEstimate=true").daemonSet)
	if !slices.Contains(c.Args, "--compat=nvidiasmi") || hasArgPrefix(c.Args, "--compat.dcgm") {
		t.Errorf("with dcgm off, args %q", c.Args)
	}
}

// The prometheus-adapter block renders deploy/prometheus-adapter/config.yaml as a ConfigMap, in the adapter's
// namespace when given, under the key the prometheus-community chart's rules.existing mounts; nothing by default.
func TestHelmPrometheusAdapterValues(t *testing.T) {
	for _, cm := range template(t, "gpe", "monitoring").configMaps {
		if strings.HasSuffix(cm.Name, "-prometheus-adapter") {
			t.Errorf("default values render ConfigMap %s", cm.Name)
		}
	}
	for _, ns := range []string{"", "custom-metrics"} {
		r := template(t, "gpe", "monitoring", "--set", "prometheusAdapter.enabled=true", "--set", "prometheusAdapter.namespace="+ns)
		var found bool
		for _, cm := range r.configMaps {
			if cm.Name != "gpe-gpu-pod-exporter-prometheus-adapter" {
				continue
			}
			found = true
			if want := cmp.Or(ns, "monitoring"); cm.Namespace != want {
				t.Errorf("namespace %q: the ConfigMap is in %q, want %q", ns, cm.Namespace, want)
			}
			if cm.Data["config.yaml"] != strings.TrimRight(string(readRepoFile(t, "deploy/prometheus-adapter/config.yaml")), "\n") {
				t.Errorf("the ConfigMap's config.yaml is not deploy/prometheus-adapter/config.yaml:\n%s", cm.Data["config.yaml"])
			}
		}
		if !found {
			t.Errorf("prometheusAdapter.enabled: no ConfigMap gpe-gpu-pod-exporter-prometheus-adapter among %v", r.kinds)
		}
	}
}
