//go:build k8s

package k8s

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// kedaNS is where KEDA's objects are (its cluster object namespace).
const kedaNS = "keda"

// kedaBinaries builds (once; cached) KEDA's operator and metrics API server and returns their directory, which
// also holds KEDA's CRDs in crds/.
func kedaBinaries(t *testing.T) string {
	t.Helper()
	return builtTools(t, "GPE_KEDA_BIN", "build-keda.sh", 60*time.Minute)
}

// startKEDA runs KEDA as its manifests do, but as processes of the host like the control plane: its CRDs, the
// operator (which runs the scalers and serves their metrics over mutual TLS gRPC) and the metrics API server (an
// aggregated API server for external.metrics.k8s.io, which the HPA controller reads through the API server). The
// APIService names a Service of type ExternalName for localhost, which is how the aggregator reaches a server on
// the host's loopback: there is no kube-proxy, and Endpoints may not hold loopback addresses.
func startKEDA(t *testing.T, c *cluster, bin string) {
	t.Helper()
	begin := time.Now()
	crds, err := filepath.Glob(filepath.Join(bin, "crds", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no KEDA CRDs in %s/crds (%v)", bin, err)
	}
	for _, f := range crds {
		createYAML(t, c, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", readFile(t, f))
	}
	testkit.WaitFor(t, 60*time.Second, "KEDA's CRDs to be established", func() bool {
		return c.hasCondition("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/scaledobjects.keda.sh", "Established")
	})
	createNamespace(t, c, kedaNS, nil)

	// One certificate for the operator's gRPC server, its client (the metrics API server) and the metrics API
	// server's HTTPS, as KEDA's own certificate rotation makes it: both sides read ca.crt, tls.crt and tls.key.
	certs := filepath.Join(c.dir, "keda-certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	ca := writeCA(t, certs, "ca", "gpu-pod-exporter e2e KEDA CA")
	ca.issue(t, certs, "tls", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "keda"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames: []string{"localhost", "keda-operator.keda.svc.cluster.local", "keda-metrics-apiserver.keda.svc",
			"keda-metrics-apiserver.keda.svc.cluster.local"},
	})

	// KEDA uses the admin's credentials here; its chart's RBAC is not what is tested.
	kubeconfig := filepath.Join(c.dir, "pki/admin.kubeconfig")
	env := []string{"KUBECONFIG=" + kubeconfig, "WATCH_NAMESPACE=", "POD_NAMESPACE=" + kedaNS, "KEDA_CLUSTER_OBJECT_NAMESPACE=" + kedaNS}
	grpcPort, probePort := port(t), port(t)
	operator := c.startEnv(t, "keda-operator", env, filepath.Join(bin, "keda"), "--leader-elect=false",
		"--metrics-bind-address=127.0.0.1:"+port(t), "--health-probe-bind-address=127.0.0.1:"+probePort,
		"--metrics-service-bind-address=127.0.0.1:"+grpcPort, "--cert-dir="+certs, "--ca-dir="+certs,
		"--zap-log-level=info", "--zap-encoder=console")
	t.Cleanup(func() { c.stopDaemon(operator) })
	operator.waitReady(t, 120*time.Second, func() bool {
		_, err := e2eutil.Get("http://127.0.0.1:" + probePort + "/readyz")
		return err == nil
	})
	apiPort := port(t)
	adapter := c.startEnv(t, "keda-metrics-apiserver", env, filepath.Join(bin, "keda-adapter"),
		"--secure-port="+apiPort, "--bind-address=127.0.0.1", "--cert-dir="+certs,
		"--tls-cert-file="+filepath.Join(certs, "tls.crt"), "--tls-private-key-file="+filepath.Join(certs, "tls.key"),
		"--lister-kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
		"--metrics-service-address=127.0.0.1:"+grpcPort, "--port="+port(t), "--zap-log-level=info", "--zap-encoder=console")
	t.Cleanup(func() { c.stopDaemon(adapter) })

	createYAML(t, c, "/api/v1/namespaces/"+kedaNS+"/services", []byte(`
apiVersion: v1
kind: Service
metadata: {name: keda-metrics-apiserver, namespace: keda}
spec: {type: ExternalName, externalName: localhost}
`))
	createYAML(t, c, "/apis/apiregistration.k8s.io/v1/apiservices", []byte(`
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.external.metrics.k8s.io}
spec:
  service: {name: keda-metrics-apiserver, namespace: keda, port: `+apiPort+`}
  group: external.metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  caBundle: `+base64.StdEncoding.EncodeToString(readFile(t, filepath.Join(certs, "ca.crt")))+`
`))
	adapter.waitReady(t, 120*time.Second, func() bool {
		return c.hasCondition("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.external.metrics.k8s.io", "Available")
	})
	t.Logf("KEDA's operator and metrics API server ready, external.metrics.k8s.io available, in %s", time.Since(begin).Round(100*time.Millisecond))
}

// hasCondition reports whether the object at path has the status condition typ, True.
func (c *cluster) hasCondition(path, typ string) bool {
	var obj struct {
		Status struct {
			Conditions []struct{ Type, Status string }
		}
	}
	if c.kube.get(path, &obj) != nil {
		return false
	}
	for _, cond := range obj.Status.Conditions {
		if cond.Type == typ && cond.Status == "True" {
			return true
		}
	}
	return false
}

// createYAML posts an object written in YAML.
func createYAML(t *testing.T, c *cluster, path string, doc []byte) {
	t.Helper()
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.kube.raw("POST", path, j); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
