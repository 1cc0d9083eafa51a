//go:build k8s

package k8s

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// nodeName is the kubelet's node.
const nodeName = "gpe-node"

// cluster is the running control plane and node.
type cluster struct {
	work     string // the test's work directory; the runtimes' state is under it too
	dir      string // work/k8s: certificates, kubeconfigs, etcd data, the kubelet's root, logs
	bin      string // the Kubernetes binaries
	apiURL   string // https://127.0.0.1:<port>
	kubelet  string // the kubelet's root directory
	token    string // the admin's bearer token
	kube     *kubeClient
	daemons  map[string]*daemon
	runtimes map[string]string // setup-runtimes.sh's env file
}

// daemon is a process the cluster started, logging to dir/logs/<name>.log.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func (c *cluster) start(t *testing.T, name string, args ...string) *daemon {
	t.Helper()
	return c.startEnv(t, name, nil, args...)
}

// startEnv is start with these variables added to the environment.
func (c *cluster) startEnv(t *testing.T, name string, env []string, args ...string) *daemon {
	t.Helper()
	logPath := filepath.Join(c.dir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	f.Close()
	d := &daemon{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { d.err = cmd.Wait(); close(d.done) }()
	c.daemons[name] = d
	return d
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// stop ends the daemon with SIGTERM, then SIGKILL after 10 s.
func (d *daemon) stop() {
	if d.exited() {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// stopDaemon stops a daemon before the cluster stops, and forgets it, so that alive does not take its exit for a
// crash.
func (c *cluster) stopDaemon(d *daemon) {
	d.stop()
	delete(c.daemons, d.name)
}

// tail is the end of the daemon's log.
func (d *daemon) tail(n int) string {
	b, _ := os.ReadFile(d.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitReady polls ready until it holds, failing the test with the daemon's log if it exits or limit passes.
func (d *daemon) waitReady(t *testing.T, limit time.Duration, ready func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ready() {
		if d.exited() {
			t.Fatalf("%s exited (%v) before it was ready; the end of %s:\n%s", d.name, d.err, d.log, d.tail(40))
		}
		if time.Since(start) > limit {
			t.Fatalf("%s not ready after %s; the end of %s:\n%s", d.name, limit, d.log, d.tail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start)
}

// port is the port of a free loopback address.
func port(t *testing.T) string {
	_, p, _ := net.SplitHostPort(e2eutil.FreeAddr(t))
	return p
}

// startCluster brings up etcd, the control plane and the kubelet, and stops them when the test ends.
func startCluster(t *testing.T, work, bin string, runtimes map[string]string) *cluster {
	c := &cluster{work: work, dir: filepath.Join(work, "k8s"), bin: bin, daemons: map[string]*daemon{}, runtimes: runtimes}
	c.kubelet = filepath.Join(c.dir, "kubelet")
	t.Cleanup(func() { c.stop(t) })
	for _, d := range []string{"logs", "pki", "etcd", "kubelet", "node"} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	pki := filepath.Join(c.dir, "pki")
	writePKI(t, pki)

	// Static tokens: the admin (the test, helm, Prometheus), and one identity per component, so that the Node and
	// RBAC authorizers see the usual users and groups.
	tokens := map[string]string{}
	var csv strings.Builder
	for _, u := range []struct{ name, user, groups string }{
		{"admin", "gpe-admin", "system:masters"},
		{"kubelet", "system:node:" + nodeName, "system:nodes"},
		// With one credential for all its controllers (no per-controller service accounts), the
		// controller-manager needs more than its bootstrap role.
		{"controller-manager", "system:kube-controller-manager", "system:masters"},
		{"scheduler", "system:kube-scheduler", ""},
	} {
		tok := randomToken(t)
		tokens[u.name] = tok
		fmt.Fprintf(&csv, "%s,%s,%s", tok, u.user, u.user)
		if u.groups != "" {
			fmt.Fprintf(&csv, ",%q", u.groups)
		}
		csv.WriteString("\n")
	}
	write(t, filepath.Join(pki, "tokens.csv"), csv.String())
	c.token = tokens["admin"]
	write(t, filepath.Join(pki, "admin.token"), c.token)

	// etcd (Debian's etcd-server).
	etcdClient, etcdPeer := port(t), port(t)
	etcd := c.start(t, "etcd", "etcd", "--name=gpe", "--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:"+etcdClient, "--advertise-client-urls=http://127.0.0.1:"+etcdClient,
		"--listen-peer-urls=http://127.0.0.1:"+etcdPeer, "--initial-advertise-peer-urls=http://127.0.0.1:"+etcdPeer,
		"--initial-cluster=gpe=http://127.0.0.1:"+etcdPeer, "--logger=zap", "--log-level=warn")
	took := etcd.waitReady(t, 30*time.Second, func() bool {
		_, err := e2eutil.Get("http://127.0.0.1:" + etcdClient + "/health")
		return err == nil
	})
	t.Logf("etcd ready in %s", took.Round(100*time.Millisecond))

	apiPort := port(t)
	c.apiURL = "https://127.0.0.1:" + apiPort
	api := c.start(t, "kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:"+etcdClient,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+apiPort,
		"--tls-cert-file="+filepath.Join(pki, "apiserver.crt"), "--tls-private-key-file="+filepath.Join(pki, "apiserver.key"),
		"--client-ca-file="+filepath.Join(pki, "ca.crt"),
		"--token-auth-file="+filepath.Join(pki, "tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+filepath.Join(pki, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(pki, "sa.key"),
		// Services get addresses from this range, but nothing routes them: no kube-proxy, and every pod is on the
		// host network. The endpoint reconciler would publish the loopback address, which Endpoints reject.
		"--service-cluster-ip-range=10.96.0.0/24", "--endpoint-reconciler-type=none",
		"--cert-dir="+filepath.Join(c.dir, "apiserver"), "--profiling=false",
		// The aggregation layer, for KEDA's metrics API server (external.metrics.k8s.io): the API server proxies
		// to it with the front proxy's client certificate and the user in request headers, which it trusts.
		"--requestheader-client-ca-file="+filepath.Join(pki, "front-proxy-ca.crt"),
		"--requestheader-allowed-names=front-proxy-client", "--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file="+filepath.Join(pki, "front-proxy-client.crt"),
		"--proxy-client-key-file="+filepath.Join(pki, "front-proxy-client.key"), "--v=1")
	c.kube = newKubeClient(t, c.apiURL, filepath.Join(pki, "ca.crt"), c.token)
	took = api.waitReady(t, 90*time.Second, func() bool {
		body, err := c.kube.raw("GET", "/readyz", nil)
		return err == nil && strings.TrimSpace(string(body)) == "ok"
	})
	t.Logf("kube-apiserver ready in %s", took.Round(100*time.Millisecond))

	kubeconfig := func(name string) string {
		p := filepath.Join(pki, name+".kubeconfig")
		write(t, p, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: gpe, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: %s, user: {token: %q}}]
contexts: [{name: gpe, context: {cluster: gpe, user: %s}}]
current-context: gpe
`, c.apiURL, filepath.Join(pki, "ca.crt"), name, tokens[name], name))
		return p
	}
	kubeconfig("admin")

	c.start(t, "kube-controller-manager", filepath.Join(bin, "kube-controller-manager"),
		"--kubeconfig="+kubeconfig("controller-manager"), "--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port="+port(t),
		"--root-ca-file="+filepath.Join(pki, "ca.crt"), "--service-account-private-key-file="+filepath.Join(pki, "sa.key"),
		"--use-service-account-credentials=false", "--v=1")
	c.start(t, "kube-scheduler", filepath.Join(bin, "kube-scheduler"),
		"--kubeconfig="+kubeconfig("scheduler"), "--leader-elect=false",
		"--bind-address=127.0.0.1", "--secure-port="+port(t), "--v=1")

	// The kubelet: cgroupfs like the runtimes, swap tolerated, and nothing that needs CAP_SYS_RESOURCE (this
	// machine's root lacks it): no oom_score_adj of its own below 0, no node-allocatable cgroup limits. cgroup v1 is
	// deprecated since 1.35 and refused unless failCgroupV1 is false.
	cfg := filepath.Join(c.dir, "kubelet-config.yaml")
	write(t, cfg, fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %s
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
cgroupsPerQOS: true
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
oomScoreAdj: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %q}
authorization: {mode: AlwaysAllow}
staticPodPath: ""
rotateCertificates: false
serverTLSBootstrap: false
evictionHard: {memory.available: "50Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
`, port(t), port(t), runtimes["GPE_E2E_CONTAINERD_SOCK"], filepath.Join(pki, "ca.crt")))
	// containerd's CRI reports the network ready, and so the kubelet the node Ready, only once it has loaded a CNI
	// network. Every pod here is on the host's network, for which the CRI calls no CNI plugin: a loopback-only
	// network is enough, and is never invoked.
	write(t, filepath.Join(work, "cni/conf/10-gpe-loopback.conflist"),
		`{"cniVersion": "1.0.0", "name": "gpe-loopback", "plugins": [{"type": "loopback"}]}`)

	c.saveHostState(t)
	// The kubelet's device-plugin directory is /var/lib/kubelet/device-plugins whatever its root directory.
	const pluginParent = "/var/lib/kubelet"
	if _, err := os.Stat(pluginParent); os.IsNotExist(err) {
		t.Cleanup(func() { os.RemoveAll(pluginParent) })
	} else {
		t.Cleanup(func() { os.RemoveAll(filepath.Join(pluginParent, "device-plugins")) })
	}
	kubelet := c.start(t, "kubelet", filepath.Join(bin, "kubelet"),
		"--config="+cfg, "--kubeconfig="+kubeconfig("kubelet"), "--root-dir="+c.kubelet,
		"--hostname-override="+nodeName, "--cert-dir="+filepath.Join(c.kubelet, "pki"), "--node-labels=nvidia.com/gpu.present=true", "--v=1")
	took = kubelet.waitReady(t, 120*time.Second, func() bool {
		var node nodeStatus
		if err := c.kube.get("/api/v1/nodes/"+nodeName, &node); err != nil {
			return false
		}
		return node.ready()
	})
	t.Logf("kubelet registered %s, Ready in %s", nodeName, took.Round(100*time.Millisecond))
	return c
}

// stop ends the node, then the control plane, then etcd. When the test failed, the logs are kept in
// <work>-logs (teardown-runtimes.sh removes the work directory).
func (c *cluster) stop(t *testing.T) {
	if t.Failed() {
		keep := c.work + "-logs"
		os.RemoveAll(keep)
		if out, err := exec.Command("cp", "-r", filepath.Join(c.dir, "logs"), keep).CombinedOutput(); err == nil {
			t.Logf("the daemons' logs are in %s", keep)
		} else {
			t.Logf("keeping the logs: %v: %s", err, out)
		}
	}
	for _, name := range []string{"kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		if d := c.daemons[name]; d != nil {
			if t.Failed() {
				t.Logf("the end of %s:\n%s", d.log, d.tail(25))
			}
			d.stop()
		}
	}
}

// kernelTunables are the sysctls the kubelet sets at start as on every node (kernel.panic=10, panic_on_oops=1,
// vm.overcommit_memory=1, ...).
var kernelTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// saveHostState records what the kubelet changes on the host besides cgroups, the sysctls and its iptables chains
// (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT), and puts them back once the kubelet has stopped: this
// machine is shared with other tests.
func (c *cluster) saveHostState(t *testing.T) {
	saved := map[string][]byte{}
	for _, k := range kernelTunables {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			saved[k] = b
		}
	}
	// Where the host has no KUBE- chains of its own, the kubelet's are removed afterwards.
	var clean []string
	for _, tool := range []string{"iptables", "ip6tables"} {
		if out, err := exec.Command(tool + "-save").Output(); err == nil && !bytes.Contains(out, []byte("KUBE-")) {
			clean = append(clean, tool)
		}
	}
	t.Cleanup(func() {
		if d := c.daemons["kubelet"]; d != nil {
			d.stop()
		}
		for k, b := range saved {
			if err := os.WriteFile("/proc/sys/"+k, b, 0o644); err != nil {
				t.Errorf("restoring %s: %v", k, err)
			}
		}
		for _, tool := range clean {
			for _, args := range [][]string{
				{"-D", "INPUT", "-j", "KUBE-FIREWALL"}, {"-D", "OUTPUT", "-j", "KUBE-FIREWALL"},
				{"-t", "filter", "-F", "KUBE-FIREWALL"}, {"-t", "filter", "-X", "KUBE-FIREWALL"},
				{"-t", "mangle", "-X", "KUBE-IPTABLES-HINT"},
				{"-t", "mangle", "-X", "KUBE-KUBELET-CANARY"}, {"-t", "filter", "-X", "KUBE-KUBELET-CANARY"},
				{"-t", "nat", "-X", "KUBE-KUBELET-CANARY"},
			} {
				exec.Command(tool, args...).Run() // absent in one family or the other
			}
			if out, _ := exec.Command(tool + "-save").Output(); bytes.Contains(out, []byte("KUBE-")) {
				t.Errorf("the kubelet's %s chains are still there:\n%s", tool, out)
			}
		}
	})
}

// alive fails the test if a daemon has exited.
func (c *cluster) alive(t *testing.T) {
	t.Helper()
	for _, d := range c.daemons {
		if d.exited() {
			t.Fatalf("%s exited: %v; the end of %s:\n%s", d.name, d.err, d.log, d.tail(40))
		}
	}
}

type nodeStatus struct {
	Status struct {
		Conditions []struct{ Type, Status, Reason, Message string }
		Capacity   map[string]string
	}
}

func (n nodeStatus) ready() bool {
	for _, c := range n.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// --- a minimal API client: JSON over HTTPS with a bearer token --------------------------------------------------

type kubeClient struct {
	base, token string
	http        *http.Client
}

func newKubeClient(t *testing.T, base, caFile, token string) *kubeClient {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &kubeClient{base: base, token: token, http: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}}
}

func (k *kubeClient) raw(method, path string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, k.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+k.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		if method == "PATCH" {
			req.Header.Set("Content-Type", "application/strategic-merge-patch+json")
		}
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return b, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

func (k *kubeClient) do(method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	b, err := k.raw(method, path, body)
	if err != nil {
		return err
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

func (k *kubeClient) get(path string, out any) error { return k.do("GET", path, nil, out) }

// --- certificates and tokens --------------------------------------------------------------------------------------

// writePKI writes a CA, the API server's serving certificate for 127.0.0.1 signed by it, the service-account
// signing key, and the front proxy's CA and client certificate, with which the API server proxies to aggregated API
// servers.
func writePKI(t *testing.T, dir string) {
	writeCA(t, dir, "ca", "gpu-pod-exporter e2e CA").issue(t, dir, "apiserver", &x509.Certificate{
		Subject: pkix.Name{CommonName: "kube-apiserver"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	})
	writeKey(t, filepath.Join(dir, "sa.key"), newKey(t))
	writeCA(t, dir, "front-proxy-ca", "gpu-pod-exporter e2e front proxy CA").issue(t, dir, "front-proxy-client",
		&x509.Certificate{Subject: pkix.Name{CommonName: "front-proxy-client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

// certAuthority is a CA that issues certificates for the test.
type certAuthority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// writeCA creates a CA and writes its certificate to dir/name.crt.
func writeCA(t *testing.T, dir, name, commonName string) *certAuthority {
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: commonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	write(t, filepath.Join(dir, name+".crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	return &certAuthority{cert, key}
}

// issue signs a certificate of the template's subject, names and uses, and writes it and its key to dir/name.crt
// and dir/name.key.
func (ca *certAuthority) issue(t *testing.T, dir, name string, tmpl *x509.Certificate) {
	key := newKey(t)
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, name+".crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeKey(t, filepath.Join(dir, name+".key"), key)
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writeKey(t *testing.T, path string, k *ecdsa.PrivateKey) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	write(t, path, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})))
}

func randomToken(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
