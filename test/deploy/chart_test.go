package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// rendered is one helm template run, every object decoded strictly into its official Go type.
type rendered struct {
	raw             []byte
	daemonSet       *appsv1.DaemonSet
	service         *corev1.Service
	serviceAccount  *corev1.ServiceAccount
	configMaps      []*corev1.ConfigMap
	namespaces      []*corev1.Namespace
	secrets         []*corev1.Secret
	resourceQuotas  []*corev1.ResourceQuota
	serviceMonitor  *monitoringv1.ServiceMonitor
	prometheusRule  *monitoringv1.PrometheusRule
	kinds           []string
	releaseNS       string
	releaseFullName string
	// drm is whether the values rendered turn drm.enabled on (template's arguments), which adds two capabilities.
	drm bool
}

// nonDefaultValues changes every switch of the chart away from its default.
const nonDefaultValues = `
fullnameOverride: gpe
image:
  repository: registry.example.com/gpu-pod-exporter
  tag: v9.9.9
  pullPolicy: Always
imagePullSecrets: [{name: regcred}]
serviceAccount:
  create: true
  name: gpe-sa
  annotations: {example.com/owner: gpu-team}
nodeSelector:
  node-role.example.com/gpu: ""
gpuNodeSelectorTerms: [] # replaced by affinity anyway
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: nvidia.com/gpu.count, operator: Gt, values: ["0"]}
tolerations:
  - {key: dedicated, operator: Equal, value: gpu, effect: NoExecute}
priorityClassName: gpu-exporters
priorityClassQuota: {create: false}
hostPID: false
runtimeClassName: nvidia
nvidia:
  visibleDevices: all
  driverCapabilities: utility
runtime:
  socketDirectory: /var/run/crio/ # a trailing slash is dropped
  socket: crio.sock
kubelet:
  podResources:
    enabled: true
    directory: /var/lib/kubelet/pod-resources
    endpoint: unix:///var/lib/kubelet/pod-resources/kubelet.sock
podLabelsAsMetricLabels: [app, team]
collectorProcesses: false
logLevel: debug
extraArgs: [--collection.timeout=3s]
extraEnv:
  - {name: GODEBUG, value: "madvdontneed=1"}
extraVolumes:
  - {name: ca, configMap: {name: gpu-ca}}
extraVolumeMounts:
  - {name: ca, mountPath: /etc/gpu-ca, readOnly: true}
hostNetwork: true
webConfig:
  existingSecret: gpe-web
service:
  port: 9500
  annotations: {example.com/internal: "true"}
podAnnotations: {example.com/scrape: "false"}
podLabels: {team: gpu}
resources:
  requests: {cpu: 100m, memory: 128Mi}
  limits: {cpu: "1", memory: 512Mi}
serviceMonitor:
  additionalLabels: {release: kube-prometheus-stack}
  interval: 15s
  scrapeTimeout: 5s
  instanceIsNodeName: false
  relabelings:
    - {sourceLabels: [__meta_kubernetes_pod_node_name], targetLabel: node}
  metricRelabelings:
    - {sourceLabels: [__name__], regex: "gpu_process_.*", action: drop}
  scheme: https
  tlsConfig: {insecureSkipVerify: true}
  basicAuth:
    username: {name: gpe-scrape, key: username}
    password: {name: gpe-scrape, key: password}
prometheusRule:
  additionalLabels: {release: kube-prometheus-stack}
dashboard:
  labelValue: "yes"
  annotations: {grafana_folder: GPU}
  namespace: grafana
`

// minimalValues turns off every optional object and mount.
const minimalValues = `
serviceAccount: {create: false}
runtime: {socketDirectory: ""}
kubelet: {podResources: {enabled: false}}
serviceMonitor: {enabled: false}
prometheusRule: {enabled: false}
dashboard: {enabled: false}
gpuNodeSelectorTerms: []
tolerations: []
priorityClassName: ""
`

func valuesFile(t *testing.T, values string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// template runs helm template with the chart and decodes the result.
func template(t *testing.T, release, namespace string, args ...string) *rendered {
	t.Helper()
	out := run(t, helm(t), append([]string{"template", release, chartDir, "--namespace", namespace,
		"--kube-version", kubeVersion}, args...)...)
	r := decode(t, out, namespace)
	r.drm = drmEnabled(t, args)
	return r
}

// drmEnabled tells whether helm template's arguments turn drm.enabled on, as helm merges them: the values files in
// order, then the --set flags.
func drmEnabled(t *testing.T, args []string) bool {
	t.Helper()
	on := false
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "--values" && args[i] != "-f" {
			continue
		}
		var v struct {
			DRM *struct {
				Enabled *bool `json:"enabled"`
			} `json:"drm"`
		}
		b, err := os.ReadFile(args[i+1])
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", args[i+1], err)
		}
		if v.DRM != nil && v.DRM.Enabled != nil {
			on = *v.DRM.Enabled
		}
	}
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "--set" {
			continue
		}
		for _, kv := range strings.Split(args[i+1], ",") {
			if k, v, _ := strings.Cut(kv, "="); k == "drm.enabled" {
				on = v == "true"
			}
		}
	}
	return on
}

var typeByKind = map[string]func(r *rendered) any{
	"apps/v1/DaemonSet": func(r *rendered) any { r.daemonSet = &appsv1.DaemonSet{}; return r.daemonSet },
	"v1/Service":        func(r *rendered) any { r.service = &corev1.Service{}; return r.service },
	"v1/ServiceAccount": func(r *rendered) any { r.serviceAccount = &corev1.ServiceAccount{}; return r.serviceAccount },
	"v1/ConfigMap": func(r *rendered) any {
		cm := &corev1.ConfigMap{}
		r.configMaps = append(r.configMaps, cm)
		return cm
	},
	"v1/Secret": func(r *rendered) any {
		sec := &corev1.Secret{}
		r.secrets = append(r.secrets, sec)
		return sec
	},
	"v1/ResourceQuota": func(r *rendered) any {
		q := &corev1.ResourceQuota{}
		r.resourceQuotas = append(r.resourceQuotas, q)
		return q
	},
	"v1/Namespace": func(r *rendered) any {
		ns := &corev1.Namespace{}
		r.namespaces = append(r.namespaces, ns)
		return ns
	},
	"monitoring.coreos.com/v1/ServiceMonitor": func(r *rendered) any {
		r.serviceMonitor = &monitoringv1.ServiceMonitor{}
		return r.serviceMonitor
	},
	"monitoring.coreos.com/v1/PrometheusRule": func(r *rendered) any {
		r.prometheusRule = &monitoringv1.PrometheusRule{}
		return r.prometheusRule
	},
}

// decode decodes every document of a manifest stream strictly into the official type of its kind; an unknown
// kind, a misspelt field or a wrong type fails the test.
func decode(t *testing.T, stream []byte, namespace string) *rendered {
	t.Helper()
	r := &rendered{raw: stream, releaseNS: namespace}
	for i, doc := range splitDocs(stream) {
		var tm v1.TypeMeta
		if err := strictYAMLLoose(doc, &tm); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		key := tm.APIVersion + "/" + tm.Kind
		newObj, ok := typeByKind[key]
		if !ok {
			t.Fatalf("document %d: unexpected kind %s\n%s", i, key, doc)
		}
		if err := strictYAML(doc, newObj(r)); err != nil {
			t.Errorf("document %d (%s): strict decoding into the official type: %v\n%s", i, key, err, doc)
		}
		r.kinds = append(r.kinds, tm.Kind)
	}
	if t.Failed() {
		t.FailNow()
	}
	return r
}

// strictYAMLLoose reads only the type meta of a document.
func strictYAMLLoose(doc []byte, tm *v1.TypeMeta) error {
	var m map[string]any
	if err := strictYAML(doc, &m); err != nil {
		return err
	}
	tm.APIVersion, _ = m["apiVersion"].(string)
	tm.Kind, _ = m["kind"].(string)
	if tm.APIVersion == "" || tm.Kind == "" {
		return fmt.Errorf("no apiVersion or kind")
	}
	return nil
}

func TestHelmLint(t *testing.T) {
	for name, values := range map[string]string{"default": "", "non-default": nonDefaultValues, "minimal": minimalValues} {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}
			if values != "" {
				args = append(args, "--values", valuesFile(t, values))
			}
			out := run(t, helm(t), args...)
			if !bytes.Contains(out, []byte("1 chart(s) linted, 0 chart(s) failed")) {
				t.Fatalf("helm lint:\n%s", out)
			}
		})
	}
}

func TestHelmTemplateDefault(t *testing.T) {
	r := template(t, "gpe", "monitoring")
	checkCommon(t, r)
	ds := r.daemonSet
	pod := ds.Spec.Template.Spec
	c := exporterContainer(t, ds)

	if !pod.HostPID {
		t.Error("hostPID is off by default")
	}
	if hasArgPrefix(c.Args, "--path.procfs") {
		t.Errorf("--path.procfs with hostPID: %v", c.Args)
	}
	// EKS GPU AMIs and AKS make the NVIDIA runtime the default, and they and GKE create no RuntimeClass: a default
	// runtimeClassName would leave every pod unschedulable there.
	if pod.RuntimeClassName != nil {
		t.Errorf("runtimeClassName = %q by default", *pod.RuntimeClassName)
	}
	if len(pod.NodeSelector) != 0 {
		t.Errorf("nodeSelector = %v by default, want the node affinity alone", pod.NodeSelector)
	}
	checkGPUNodeAffinity(t, pod)
	// Every taint: GPU nodes carry nvidia.com/gpu (GPU operator, GKE), sku=gpu (AKS) or a team's own.
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "" || pod.Tolerations[0].Operator != corev1.TolerationOpExists ||
		pod.Tolerations[0].Effect != "" {
		t.Errorf("tolerations = %v, want one that tolerates every taint", pod.Tolerations)
	}
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName = %q, want system-node-critical", pod.PriorityClassName)
	}
	checkCriticalPodsQuota(t, r, "system-node-critical")
	if pod.HostNetwork {
		t.Error("hostNetwork by default")
	}
	if c.Image != imageRepo+":0.1.0" {
		t.Errorf("image = %s, want the chart's appVersion as the tag", c.Image)
	}
	wantMounts := map[string]string{ // mount path → host path
		"/run/containerd":                "/run/containerd",
		"/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources",
	}
	checkHostMounts(t, pod, c, wantMounts)
	checkRuntimeSocketDir(t, pod, c, "/run/containerd")
	if !slices.Contains(c.Args, "--runtime.endpoint=unix:///run/containerd/containerd.sock") {
		t.Errorf("no --runtime.endpoint for the mounted CRI socket: %v", c.Args)
	}
	// The exporter's default endpoint is the mounted directory's socket.
	if hasArgPrefix(c.Args, "--kubelet.pod-resources-endpoint") {
		t.Errorf("--kubelet.pod-resources-endpoint set although the default endpoint is mounted: %v", c.Args)
	}
	if r.serviceMonitor == nil || r.prometheusRule == nil || len(r.configMaps) != 1 || r.serviceAccount == nil || len(r.secrets) != 0 {
		t.Fatalf("default objects: %v", r.kinds)
	}
	relabel := r.serviceMonitor.Spec.Endpoints[0].RelabelConfigs
	if len(relabel) != 1 || relabel[0].TargetLabel != "instance" ||
		!reflect.DeepEqual(relabel[0].SourceLabels, []monitoringv1.LabelName{"__meta_kubernetes_pod_node_name"}) {
		t.Errorf("relabelings = %+v, want instance from the node name", relabel)
	}
	if r.configMaps[0].Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard labels = %v, want grafana_dashboard=1 for Grafana's sidecar", r.configMaps[0].Labels)
	}
	checkArgsAccepted(t, c.Args)
}

func TestHelmTemplateNonDefault(t *testing.T) {
	r := template(t, "other", "gpu", "--values", valuesFile(t, nonDefaultValues))
	checkCommon(t, r)
	ds := r.daemonSet
	pod := ds.Spec.Template.Spec
	c := exporterContainer(t, ds)

	if ds.Name != "gpe" || r.service.Name != "gpe" {
		t.Errorf("fullnameOverride: DaemonSet %s, Service %s", ds.Name, r.service.Name)
	}
	if pod.HostPID {
		t.Error("hostPID: false still sets hostPID")
	}
	if !slices.Contains(c.Args, "--path.procfs=/host/proc") {
		t.Errorf("no --path.procfs=/host/proc without hostPID: %v", c.Args)
	}
	checkHostMounts(t, pod, c, map[string]string{
		"/host/proc":                     "/proc",
		"/var/run/crio":                  "/var/run/crio",
		"/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources",
	})
	checkRuntimeSocketDir(t, pod, c, "/var/run/crio")
	if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" {
		t.Errorf("runtimeClassName = %v, want nvidia", pod.RuntimeClassName)
	}
	if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v, dnsPolicy %q, want true and ClusterFirstWithHostNet", pod.HostNetwork, pod.DNSPolicy)
	}
	if len(r.resourceQuotas) != 0 {
		t.Errorf("a ResourceQuota for priority class %s", pod.PriorityClassName)
	}
	if !slices.Contains(c.Args, "--web.config.file=/etc/gpu-pod-exporter/web/web-config.yml") {
		t.Errorf("no --web.config.file with webConfig.existingSecret: %v", c.Args)
	}
	if i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "web-config" }); i < 0 ||
		pod.Volumes[i].Secret == nil || pod.Volumes[i].Secret.SecretName != "gpe-web" {
		t.Errorf("no volume of the existing web-config Secret gpe-web: %+v", pod.Volumes)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "ca" && m.MountPath == "/etc/gpu-ca" }) ||
		!slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "ca" && v.ConfigMap != nil }) {
		t.Errorf("extraVolumes/extraVolumeMounts not rendered: %+v %+v", pod.Volumes, c.VolumeMounts)
	}
	if len(r.secrets) != 0 {
		t.Errorf("a web-config Secret although existingSecret is set")
	}
	for _, want := range []string{
		"--runtime.endpoint=unix:///var/run/crio/crio.sock",
		"--kubelet.pod-resources-endpoint=unix:///var/lib/kubelet/pod-resources/kubelet.sock",
		"--kubernetes.pod-labels=app,team",
		"--no-collector.processes",
		"--log.level=debug",
		"--web.listen-address=:9500",
		"--collection.timeout=3s",
	} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %v lack %s", c.Args, want)
		}
	}
	if c.Image != "registry.example.com/gpu-pod-exporter:v9.9.9" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %s %s", c.Image, c.ImagePullPolicy)
	}
	if _, ok := pod.NodeSelector["node-role.example.com/gpu"]; !ok || len(pod.NodeSelector) != 1 {
		t.Errorf("nodeSelector = %v", pod.NodeSelector)
	}
	if pod.Affinity == nil || pod.Affinity.NodeAffinity == nil {
		t.Error("affinity not rendered")
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "dedicated" {
		t.Errorf("tolerations = %v", pod.Tolerations)
	}
	if pod.PriorityClassName != "gpu-exporters" || pod.ServiceAccountName != "gpe-sa" ||
		r.serviceAccount.Name != "gpe-sa" || len(pod.ImagePullSecrets) != 1 {
		t.Errorf("priorityClassName %q, serviceAccountName %q (%s), pull secrets %v",
			pod.PriorityClassName, pod.ServiceAccountName, r.serviceAccount.Name, pod.ImagePullSecrets)
	}
	if ds.Spec.Template.Labels["team"] != "gpu" || ds.Spec.Template.Annotations["example.com/scrape"] != "false" {
		t.Errorf("pod labels %v, annotations %v", ds.Spec.Template.Labels, ds.Spec.Template.Annotations)
	}
	if c.Resources.Limits.Memory().String() != "512Mi" {
		t.Errorf("memory limit %s", c.Resources.Limits.Memory())
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GODEBUG" }) {
		t.Error("extraEnv not rendered")
	}
	sm := r.serviceMonitor
	if sm.Labels["release"] != "kube-prometheus-stack" || string(sm.Spec.Endpoints[0].Interval) != "15s" ||
		len(sm.Spec.Endpoints[0].RelabelConfigs) != 1 || sm.Spec.Endpoints[0].RelabelConfigs[0].TargetLabel != "node" ||
		len(sm.Spec.Endpoints[0].MetricRelabelConfigs) != 1 || sm.Spec.Endpoints[0].Scheme == nil ||
		*sm.Spec.Endpoints[0].Scheme != "https" || sm.Spec.Endpoints[0].BasicAuth == nil ||
		sm.Spec.Endpoints[0].BasicAuth.Password.Name != "gpe-scrape" {
		t.Errorf("ServiceMonitor: %+v", sm.Spec.Endpoints[0])
	}
	if r.prometheusRule.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule labels %v", r.prometheusRule.Labels)
	}
	cm := r.configMaps[0]
	if cm.Namespace != "grafana" || cm.Labels["grafana_dashboard"] != "yes" || cm.Annotations["grafana_folder"] != "GPU" {
		t.Errorf("dashboard ConfigMap %s/%s labels %v annotations %v", cm.Namespace, cm.Name, cm.Labels, cm.Annotations)
	}
	checkArgsAccepted(t, c.Args)
}

func TestHelmTemplateMinimal(t *testing.T) {
	r := template(t, "gpe", "monitoring", "--values", valuesFile(t, minimalValues))
	checkCommon(t, r)
	if !reflect.DeepEqual(r.kinds, []string{"Service", "DaemonSet"}) {
		t.Errorf("objects = %v, want only the Service and the DaemonSet", r.kinds)
	}
	pod := r.daemonSet.Spec.Template.Spec
	c := exporterContainer(t, r.daemonSet)
	if len(pod.Volumes) != 0 || len(c.VolumeMounts) != 0 {
		t.Errorf("volumes %v, mounts %v with every mount off", pod.Volumes, c.VolumeMounts)
	}
	if hasArgPrefix(c.Args, "--runtime.endpoint") {
		t.Errorf("--runtime.endpoint without a CRI socket: %v", c.Args)
	}
	if pod.ServiceAccountName != "default" {
		t.Errorf("serviceAccountName = %q without a created ServiceAccount", pod.ServiceAccountName)
	}
	checkArgsAccepted(t, c.Args)
}

// TestHelmTemplateMisspeltFieldFails makes sure the strict decoding catches what it is there for.
func TestHelmTemplateMisspeltFieldFails(t *testing.T) {
	r := template(t, "gpe", "monitoring")
	for _, tc := range []struct{ from, to string }{
		{"readOnlyRootFilesystem:", "readOnlyRootFileSystem:"}, // only the case differs
		{"readOnlyRootFilesystem:", "readOnlyRootFS:"},
		{"honorLabels:", "honourLabels:"},
		{"hostPID:", "hostPid:"},
	} {
		doc := bytes.Replace(r.raw, []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(doc, r.raw) {
			t.Fatalf("no %s in the rendered chart", tc.from)
		}
		found := false
		for _, d := range splitDocs(doc) {
			if !bytes.Contains(d, []byte(tc.to)) {
				continue
			}
			found = true
			var obj any = &appsv1.DaemonSet{}
			if bytes.Contains(d, []byte("kind: ServiceMonitor")) {
				obj = &monitoringv1.ServiceMonitor{}
			}
			name := strings.TrimSuffix(tc.to, ":")
			if err := strictYAML(d, obj); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s decoded without an error naming it: %v", name, err)
			}
		}
		if !found {
			t.Fatalf("document with %s not found", tc.to)
		}
	}
}

func exporterContainer(t *testing.T, ds *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "exporter" {
		t.Fatalf("containers = %v, want one named exporter", cs)
	}
	return &cs[0]
}

func hasArgPrefix(args []string, flag string) bool {
	return slices.ContainsFunc(args, func(a string) bool { return a == flag || strings.HasPrefix(a, flag+"=") })
}

// checkCommon checks what every rendering must satisfy: least privilege, and objects that refer to each other
// correctly (selectors, port names, volumes), as the API server and prometheus-operator would need.
func checkCommon(t *testing.T, r *rendered) {
	t.Helper()
	ds, svc := r.daemonSet, r.service
	if ds == nil || svc == nil {
		t.Fatalf("no DaemonSet or Service: %v", r.kinds)
	}
	pod := ds.Spec.Template.Spec
	c := exporterContainer(t, ds)

	// Selectors.
	if !subset(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Errorf("DaemonSet selector %v does not match its pod labels %v", ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	}
	if !subset(svc.Spec.Selector, ds.Spec.Template.Labels) {
		t.Errorf("Service selector %v does not match the pod labels %v", svc.Spec.Selector, ds.Spec.Template.Labels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" {
		t.Errorf("Service ports = %+v, want one named metrics targeting the container port metrics", svc.Spec.Ports)
	}
	webConfig := slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--web.config.file=") })
	wantPorts := 1
	if webConfig {
		wantPorts = 2 // and "health", for the probes
	}
	if len(c.Ports) != wantPorts || c.Ports[0].Name != "metrics" || svc.Spec.Ports[0].Port != c.Ports[0].ContainerPort {
		t.Errorf("container ports = %+v", c.Ports)
	}
	if want := fmt.Sprintf("--web.listen-address=:%d", c.Ports[0].ContainerPort); !slices.Contains(c.Args, want) {
		t.Errorf("args %v lack %s", c.Args, want)
	}
	// /healthz and /readyz; behind a web configuration (basic auth, client certificates), which the kubelet cannot
	// satisfy, on the plain-HTTP listener that serves only them.
	probePort := "metrics"
	if webConfig {
		probePort = "health"
		i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "health" })
		if i < 0 || !slices.Contains(c.Args, fmt.Sprintf("--web.health-listen-address=:%d", c.Ports[i].ContainerPort)) {
			t.Errorf("with --web.config.file, no health port served by --web.health-listen-address: ports %+v, args %v", c.Ports, c.Args)
		}
	}
	for p, path := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.StrVal != probePort || p.HTTPGet.Scheme != "" {
			t.Errorf("probe %+v, want an HTTP GET of %s on port %s", p, path, probePort)
		}
	}

	// Least privilege.
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("no container securityContext")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("root filesystem is writable")
	}
	privileged := sc.Privileged != nil && *sc.Privileged
	if !privileged && (sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation) {
		t.Error("allowPrivilegeEscalation is not false")
	}
	// The API server refuses the pod otherwise.
	if privileged && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		t.Error("privileged with allowPrivilegeEscalation: false, which Kubernetes rejects")
	}
	// Privileged only where nothing else gives the container the GPUs' device nodes: with the driver's directory
	// mounted from the node (GKE's driver installer, presets/gke.yaml), where no NVIDIA container toolkit runs.
	if sc.Privileged != nil && *sc.Privileged {
		if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "nvidia-driver" }) {
			t.Error("privileged without the reason for it, the driver's directory mounted from the node")
		}
	}
	// Nothing added; with drm.enabled, exactly the two that reading other processes' DRM files needs, which with
	// hostPID amount to root on the node (values.yaml, drm).
	var wantAdd []corev1.Capability
	if r.drm {
		wantAdd = []corev1.Capability{"SYS_PTRACE", "DAC_READ_SEARCH"}
	}
	if sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(sc.Capabilities.Add, wantAdd) {
		t.Errorf("capabilities = %+v, want drop [ALL] and add %v (drm.enabled %v)", sc.Capabilities, wantAdd, r.drm)
	}
	if psc := pod.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v, want the RuntimeDefault seccomp profile", psc)
	}
	if pod.HostIPC {
		t.Error("hostIPC")
	}
	if pod.HostNetwork && pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork with dnsPolicy %q: the pod would not resolve cluster names", pod.DNSPolicy)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the API token is mounted; the exporter never calls the API server")
	}
	if r.serviceAccount != nil && (r.serviceAccount.AutomountServiceAccountToken == nil || *r.serviceAccount.AutomountServiceAccountToken) {
		t.Error("the ServiceAccount automounts its token")
	}
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly {
			t.Errorf("mount %s (%s) is writable", m.Name, m.MountPath)
		}
		if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) {
			t.Errorf("mount %s has no volume", m.Name)
		}
	}
	for _, v := range pod.Volumes {
		if v.Secret != nil || v.ConfigMap != nil {
			continue // the web configuration, extraVolumes
		}
		if v.HostPath == nil {
			t.Errorf("volume %s is neither a hostPath, a Secret nor a ConfigMap", v.Name)
			continue
		}
		// Directories, typed. An untyped hostPath creates an empty directory on the node where the path is missing; a
		// socket (or any file) mounted by itself keeps pointing at the old inode once the runtime or the kubelet
		// deletes and recreates it on restart, so the exporter would lose it until its pod restarts. The two files
		// mounted by themselves: /dev/null, the NVIDIA toolkit's device request, and the node's passwd file, because
		// its directory holds shadow.
		want := corev1.HostPathDirectory
		switch v.Name {
		case "nvidia-device-request":
			want = corev1.HostPathCharDev
			if v.HostPath.Path != "/dev/null" {
				t.Errorf("the NVIDIA device request mounts %s, which the toolkit ignores: it reads only /dev/null", v.HostPath.Path)
			}
		case "host-passwd":
			want = corev1.HostPathFile
		}
		if v.HostPath.Type == nil || *v.HostPath.Type != want {
			t.Errorf("hostPath %s has type %v, want %s", v.HostPath.Path, v.HostPath.Type, want)
		}
	}
	if !pod.HostPID && !slices.Contains(c.Args, "--path.procfs=/host/proc") {
		t.Error("neither hostPID nor --path.procfs=/host/proc")
	}

	// Node name and NVIDIA device access without taking a GPU from the workloads.
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["NODE_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME = %+v, want the downward API's spec.nodeName", e)
	}
	if env["NVIDIA_VISIBLE_DEVICES"].Value != "all" || env["NVIDIA_DRIVER_CAPABILITIES"].Value != "utility" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q NVIDIA_DRIVER_CAPABILITIES=%q, want all and utility",
			env["NVIDIA_VISIBLE_DEVICES"].Value, env["NVIDIA_DRIVER_CAPABILITIES"].Value)
	}
	for name := range c.Resources.Limits {
		if strings.HasPrefix(string(name), "nvidia.com/") {
			t.Errorf("the exporter requests %s: it would take a GPU away from the workloads", name)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v, want CPU and memory requests and a memory limit", c.Resources)
	}
	if ds.Spec.Template.Spec.ServiceAccountName == "" {
		t.Error("no serviceAccountName")
	}

	// prometheus-operator objects.
	if sm := r.serviceMonitor; sm != nil {
		if !subset(sm.Spec.Selector.MatchLabels, svc.Labels) {
			t.Errorf("ServiceMonitor selector %v does not match the Service labels %v", sm.Spec.Selector.MatchLabels, svc.Labels)
		}
		if !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, svc.Namespace) {
			t.Errorf("ServiceMonitor namespaces %v lack the Service's %s", sm.Spec.NamespaceSelector.MatchNames, svc.Namespace)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name {
			t.Errorf("ServiceMonitor endpoints %+v, want the Service port %s", sm.Spec.Endpoints, svc.Spec.Ports[0].Name)
		}
		if !sm.Spec.Endpoints[0].HonorLabels {
			t.Error("ServiceMonitor without honorLabels: the workload's namespace/pod labels would be the exporter's")
		}
		// deploy/prometheus/rules.yml's GPUPodExporterDown expects job="gpu-pod-exporter".
		if got := svc.Labels[sm.Spec.JobLabel]; got != "gpu-pod-exporter" {
			t.Errorf("job label from Service label %q = %q, want gpu-pod-exporter", sm.Spec.JobLabel, got)
		}
	}
	if pr := r.prometheusRule; pr != nil {
		var want monitoringv1.PrometheusRuleSpec
		if err := strictYAML(readRepoFile(t, "deploy/prometheus/rules.yml"), &want); err != nil {
			t.Fatalf("deploy/prometheus/rules.yml as a PrometheusRule spec: %v", err)
		}
		if len(want.Groups) == 0 || !reflect.DeepEqual(pr.Spec, want) {
			t.Error("the PrometheusRule's spec differs from deploy/prometheus/rules.yml (run go test ./test/deploy -update)")
		}
	}
	for _, cm := range r.configMaps {
		if len(cm.Data) != len(dashboardFiles) {
			t.Errorf("ConfigMap %s holds %d keys, want the %d dashboards", cm.Name, len(cm.Data), len(dashboardFiles))
		}
		for _, file := range dashboardFiles {
			key := filepath.Base(file)
			body, ok := cm.Data[key]
			if !ok {
				t.Errorf("ConfigMap %s has no %s", cm.Name, key)
				continue
			}
			if !json.Valid([]byte(body)) {
				t.Errorf("ConfigMap %s: %s is not valid JSON", cm.Name, key)
			}
			if want := strings.TrimRight(string(readRepoFile(t, file)), "\n"); body != want {
				t.Errorf("ConfigMap %s: %s differs from %s (run go test ./test/deploy -update)", cm.Name, key, file)
			}
		}
	}
	for _, o := range []v1.Object{ds, svc} {
		if o.GetNamespace() != r.releaseNS {
			t.Errorf("%s is in namespace %q, want %q", o.GetName(), o.GetNamespace(), r.releaseNS)
		}
	}
}

// checkHostMounts checks that exactly the given host paths are mounted, read-only, at the given paths.
// checkRuntimeSocketDir: the runtime's socket directory is mounted read-only from a hostPath of type Directory at the
// same path, and --runtime.endpoint names a socket directly inside it.
func checkRuntimeSocketDir(t *testing.T, pod corev1.PodSpec, c *corev1.Container, dir string) {
	t.Helper()
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == dir {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("no mount at %s: %+v", dir, c.VolumeMounts)
	}
	if !mount.ReadOnly || mount.SubPath != "" || mount.SubPathExpr != "" {
		t.Errorf("runtime socket directory mount %+v, want read-only and no subPath", mount)
	}
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == mount.Name })
	if i < 0 || pod.Volumes[i].HostPath == nil {
		t.Fatalf("mount %s has no hostPath volume", mount.Name)
	}
	hp := pod.Volumes[i].HostPath
	if hp.Path != dir || hp.Type == nil || *hp.Type != corev1.HostPathDirectory {
		t.Errorf("runtime socket volume %s (type %v), want the directory %s (type Directory)", hp.Path, hp.Type, dir)
	}
	var endpoint string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--runtime.endpoint=unix://"); ok {
			endpoint = v
		}
	}
	if filepath.Dir(endpoint) != dir || filepath.Base(endpoint) == "" {
		t.Errorf("--runtime.endpoint socket %q is not directly inside the mounted directory %s: %v", endpoint, dir, c.Args)
	}
}

// TestHelmRuntimeSocketValues: the removed cri.socketPath and a path as runtime.socket fail the install instead of
// silently mounting nothing (or the socket file).
func TestHelmRuntimeSocketValues(t *testing.T) {
	for _, values := range []string{
		"cri: {socketPath: /run/containerd/containerd.sock}\n",
		"runtime: {socketDirectory: /run, socket: containerd/containerd.sock}\n",
		"runtime: {socketDirectory: /run/containerd, socket: \"\"}\n",
	} {
		out, err := runErr(t, helm(t), "template", "gpe", chartDir, "--kube-version", kubeVersion,
			"--values", valuesFile(t, values))
		if err == nil || !strings.Contains(string(out), "runtime.socket") {
			t.Errorf("values %q: err %v, want a failure naming runtime.socket*\n%s", values, err, out)
		}
	}
}

func checkHostMounts(t *testing.T, pod corev1.PodSpec, c *corev1.Container, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				got[m.MountPath] = v.HostPath.Path
				if !m.ReadOnly {
					t.Errorf("%s is mounted writable", m.MountPath)
				}
			}
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("host mounts (container path → host path) = %v, want %v", got, want)
	}
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// exporterBinary builds the exporter once for the tests that run it.
func exporterBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpe-deploy-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath, binErr = e2eutil.BuildBinary(dir)
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// checkArgsAccepted starts the exporter with the rendered arguments (on the demo node, listening on a free
// loopback port) and waits until it listens: an unknown flag or a bad value makes it exit instead.
func checkArgsAccepted(t *testing.T, args []string) {
	t.Helper()
	var a []string
	for _, arg := range args {
		switch {
		case strings.HasPrefix(arg, "--web.listen-address="):
		case strings.HasPrefix(arg, "--web.config.file="):
			// The web configuration is the pod's Secret, absent here: TestHelmWebConfigProbes runs it.
		case strings.HasPrefix(arg, "--web.health-listen-address="):
			a = append(a, "--web.health-listen-address=127.0.0.1:0")
		case arg == "--path.procfs=/host/proc":
			// The exporter checks that procfs exists; /host/proc is the pod's mount of this host's /proc.
			a = append(a, "--path.procfs=/proc")
		default:
			a = append(a, arg)
		}
	}
	a = append(a, "--web.listen-address=127.0.0.1:0", "--demo")
	cmd := exec.Command(exporterBinary(t), a...)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		pr.Close()
	}()
	listening := make(chan bool, 1)
	var log bytes.Buffer
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "Listening on") {
				listening <- true
				return
			}
		}
		listening <- false // the exporter exited
	}()
	select {
	case ok := <-listening:
		if !ok {
			cmd.Wait()
			t.Errorf("the exporter does not accept the chart's arguments %q:\n%s", a, log.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the exporter did not listen within 30s with the chart's arguments %q", a)
	}
}

// TestHelmNotes renders the chart's NOTES.txt with helm. helm install --dry-run needs a cluster and helm template
// does not print notes, so a copy of the chart renders NOTES.txt through tpl into a ConfigMap.
func TestHelmNotes(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "gpu-pod-exporter")
	if out, err := exec.Command("cp", "-a", filepath.Join(repoRoot(t), chartDir), chart).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(chart, "files/notes.txt"), readRepoFile(t, chartDir+"/templates/NOTES.txt"), 0o644); err != nil {
		t.Fatal(err)
	}
	render := `apiVersion: v1
kind: ConfigMap
metadata: {name: notes}
data:
  notes: {{ tpl (.Files.Get "files/notes.txt") . | toJson }}
`
	if err := os.WriteFile(filepath.Join(chart, "templates/zz-notes.yaml"), []byte(render), 0o644); err != nil {
		t.Fatal(err)
	}
	notes := func(args ...string) string {
		out := run(t, helm(t), append([]string{"template", "gpe", chart, "--namespace", "monitoring",
			"--show-only", "templates/zz-notes.yaml"}, args...)...)
		var cm corev1.ConfigMap
		if err := strictYAML(out, &cm); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return cm.Data["notes"]
	}
	if n := notes(); !strings.Contains(n, "honorLabels: true") || !strings.Contains(n, "exported_pod") ||
		!strings.Contains(n, "not the exporter's own pod") || !strings.Contains(n, "port-forward ds/gpe-gpu-pod-exporter 9402") {
		t.Errorf("the notes do not explain honorLabels:\n%s", n)
	}
	// helm install succeeds with 0 pods scheduled (EKS managed node groups): the notes say how to check, and what to do.
	if n := notes(); !strings.Contains(n, "kubectl -n monitoring get ds gpe-gpu-pod-exporter") || !strings.Contains(n, "DESIRED") ||
		!strings.Contains(n, "extraGpuNodeSelectorTerms") || !strings.Contains(n, "presets/eks-managed-node-groups.yaml") {
		t.Errorf("the notes do not say how to check the scheduled pods:\n%s", n)
	}
	// Until the release is published, the default image cannot be pulled: the notes say so, and not when the image
	// is one's own (TestChartNotesSayWhatIsPublished ties the sentence to the install guide).
	if n := notes(); !strings.Contains(n, "The image "+imageRepo+":") || !strings.Contains(n, "is not published yet") {
		t.Errorf("the notes do not say that the default image is not published:\n%s", n)
	}
	if n := notes("--set", "image.repository=registry.example.com/gpu-pod-exporter"); strings.Contains(n, "not published") {
		t.Errorf("the notes say an image of one's own is not published:\n%s", n)
	}
	if n := notes("--set", "serviceMonitor.enabled=false", "--set", "hostPID=false"); !strings.Contains(n, "honor_labels: true") ||
		!strings.Contains(n, "/host/proc") {
		t.Errorf("the notes without a ServiceMonitor or hostPID:\n%s", n)
	}
}
