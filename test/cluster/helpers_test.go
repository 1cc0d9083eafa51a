//go:build e2e

package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// startSecurePrometheus runs prometheus with config, serving its API and UI only over TLS to clients with a
// certificate of the test's CA and the password of user gpe (its own --web.config.file). It returns its URL and
// two HTTP client configurations in promtool's format: one with the CA, the client certificate and the password,
// one without the password.
func startSecurePrometheus(t *testing.T, config string) (url, auth, noAuth string) {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not installed (Debian package prometheus; scripts/test.sh installs it)")
	}
	dir := t.TempDir()
	ca := newCA(t, dir)
	ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	ca.issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	hash, err := bcrypt.GenerateFromPassword([]byte("gpu-s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "password"), "gpu-s3cret\n")
	write(t, filepath.Join(dir, "web.yml"), fmt.Sprintf(`tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
basic_auth_users:
  gpe: %s
`, hash))
	tlsConfig := "tls_config:\n  ca_file: ca.crt\n  cert_file: client.crt\n  key_file: client.key\n"
	auth, noAuth = filepath.Join(dir, "http.yml"), filepath.Join(dir, "http-no-password.yml")
	write(t, auth, "basic_auth:\n  username: gpe\n  password_file: password\n"+tlsConfig)
	write(t, noAuth, tlsConfig)
	write(t, filepath.Join(dir, "prometheus.yml"), config)

	addr := e2eutil.FreeAddr(t)
	p := e2eutil.Start(t, exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--web.config.file="+filepath.Join(dir, "web.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr))
	client := ca.client(t, dir)
	url = "https://" + addr
	testkit.WaitFor(t, 60*time.Second, "prometheus to be ready", func() bool {
		if done, err := p.Exited(); done {
			t.Fatalf("prometheus exited before it was ready: %v (its output follows)", err)
		}
		req, _ := http.NewRequest(http.MethodGet, url+"/-/ready", nil)
		req.SetBasicAuth("gpe", "gpu-s3cret")
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return url, auth, noAuth
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T, dir string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpu-pod-exporter test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", der)
	return &testCA{cert: cert, key: key}
}

// issue writes name.crt and name.key, a certificate for 127.0.0.1 of the given use.
func (ca *testCA) issue(t *testing.T, dir, name string, use x509.ExtKeyUsage) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{use},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+".crt"), "CERTIFICATE", der)
	writePEM(t, filepath.Join(dir, name+".key"), "EC PRIVATE KEY", keyDER)
}

// client is an HTTP client that trusts the CA and presents the client certificate.
func (ca *testCA) client(t *testing.T, dir string) *http.Client {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
