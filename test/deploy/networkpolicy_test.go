package deploy

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// renderNetworkPolicy renders only the NetworkPolicy, decoded strictly into its official type.
func renderNetworkPolicy(t *testing.T, values string) *networkingv1.NetworkPolicy {
	t.Helper()
	out := run(t, helm(t), "template", "gpe", chartDir, "--namespace", "monitoring", "--kube-version", kubeVersion,
		"--values", valuesFile(t, values), "--show-only", "templates/networkpolicy.yaml")
	docs := splitDocs(out)
	if len(docs) != 1 {
		t.Fatalf("%d documents, want the NetworkPolicy:\n%s", len(docs), out)
	}
	np := &networkingv1.NetworkPolicy{}
	if err := strictYAML(docs[0], np); err != nil {
		t.Fatalf("strict decoding: %v\n%s", err, docs[0])
	}
	return np
}

// With networkPolicy enabled, only the given peers reach the metrics port; the health port, served with a web
// configuration, is open to the kubelet's probes; nothing leaves the pod. The policy selects the exporter's pods and
// names ports the container has.
func TestHelmNetworkPolicy(t *testing.T) {
	const peers = `
networkPolicy:
  enabled: true
  from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}
      podSelector: {matchLabels: {app.kubernetes.io/name: prometheus}}
`
	for _, webConfig := range []bool{false, true} {
		values := peers
		if webConfig {
			values += "webConfig:\n  config:\n    basic_auth_users: {prometheus: x}\n"
		}
		np := renderNetworkPolicy(t, values)
		r := template(t, "gpe", "monitoring", "--values", valuesFile(t, values), "--show-only", "templates/daemonset.yaml")
		pod := r.daemonSet.Spec.Template
		if !subset(np.Spec.PodSelector.MatchLabels, pod.Labels) || len(np.Spec.PodSelector.MatchLabels) == 0 {
			t.Errorf("web config %v: the policy selects %v, not the exporter's pods %v", webConfig, np.Spec.PodSelector.MatchLabels, pod.Labels)
		}
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) ||
			len(np.Spec.Egress) != 0 {
			t.Errorf("web config %v: policy types %v, egress %v; want ingress and egress, no egress allowed", webConfig,
				np.Spec.PolicyTypes, np.Spec.Egress)
		}
		ports := map[string]bool{}
		for _, p := range exporterContainer(t, r.daemonSet).Ports {
			ports[p.Name] = true
		}
		want := map[string]int{"metrics": 1} // the number of peers
		if webConfig {
			want["health"] = 0 // anyone: the kubelet's probes come from the node
		}
		got := map[string]int{}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port == nil || p.Port.Type != intstr.String || !ports[p.Port.StrVal] || p.Protocol == nil || *p.Protocol != corev1.ProtocolTCP {
					t.Errorf("web config %v: rule port %+v is not a TCP port of the container %v", webConfig, p, ports)
					continue
				}
				got[p.Port.StrVal] = len(rule.From)
			}
		}
		if len(got) != len(want) || got["metrics"] != want["metrics"] || got["health"] != want["health"] {
			t.Errorf("web config %v: ingress (port: peers) %v, want %v", webConfig, got, want)
		}
	}

	out, err := runErr(t, helm(t), "template", "gpe", chartDir, "--kube-version", kubeVersion, "--set", "networkPolicy.enabled=true")
	if err == nil || !strings.Contains(string(out), "networkPolicy.from") {
		t.Errorf("networkPolicy.enabled without from: %v, want a failure naming networkPolicy.from\n%s", err, out)
	}
	if out := run(t, helm(t), "template", "gpe", chartDir, "--kube-version", kubeVersion); strings.Contains(string(out), "NetworkPolicy") {
		t.Error("a NetworkPolicy by default")
	}
}
