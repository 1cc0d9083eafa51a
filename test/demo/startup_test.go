//go:build e2e

package demo

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// Every flag that cannot work stops the exporter before it starts, with status 2 and one line that names the flag
// (never a panic, never a silent default).
func TestBadFlagsExit2NamingTheFlag(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "nvidia-smi")
	write(t, notExec, "#!/bin/true\n")
	badWeb := filepath.Join(dir, "web.yml")
	write(t, badWeb, "tls_server_config:\n  cert_file: /nonexistent.crt\n")
	// HTTP/2 requires an AES-128-GCM suite, which this configuration leaves out.
	cbcHTTP2 := tlsWebConfig(t, "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA]\nhttp_server_config:\n  http2: true\n")
	cases := []struct {
		args []string
		flag string
	}{
		{[]string{"--web.telemetry-path=metrics"}, "--web.telemetry-path"},
		{[]string{"--web.telemetry-path="}, "--web.telemetry-path"},
		{[]string{"--web.telemetry-path=/healthz"}, "--web.telemetry-path"},
		{[]string{"--web.telemetry-path=/readyz"}, "--web.telemetry-path"},
		{[]string{"--web.telemetry-path=/metrics?format=text"}, "--web.telemetry-path"},
		{[]string{"--web.max-connections=0"}, "--web.max-connections"},
		{[]string{"--web.max-connections=many"}, "--web.max-connections"},
		{[]string{"--web.config.file=" + cbcHTTP2}, "--web.config.file"},
		{[]string{"--collection.timeout=0s"}, "--collection.timeout"},
		{[]string{"--collection.timeout=-1s"}, "--collection.timeout"},
		{[]string{"--collection.timeout=10"}, "--collection.timeout"},
		{[]string{"--nvidia-smi.timeout=0s"}, "--nvidia-smi.timeout"},
		{[]string{"--kubelet.refresh-interval=0s"}, "--kubelet.refresh-interval"},
		{[]string{"--kubelet.timeout=-5s"}, "--kubelet.timeout"},
		{[]string{"--kubelet.pod-resources-endpoint=tcp://10.0.0.1:1"}, "--kubelet.pod-resources-endpoint"},
		{[]string{"--kubelet.gpu-resources=nvidia.com/[gpu"}, "--kubelet.gpu-resources"},
		{[]string{"--gpu.source=cuda"}, "--gpu.source"},
		{[]string{"--log.level=loud"}, "--log.level"},
		{[]string{"--log.format=xml"}, "--log.format"},
		{[]string{"--path.procfs=" + filepath.Join(dir, "missing")}, "--path.procfs"},
		{[]string{"--path.procfs=" + notExec}, "--path.procfs"},
		{[]string{"--web.config.file=" + filepath.Join(dir, "missing.yml")}, "--web.config.file"},
		{[]string{"--web.config.file=" + badWeb}, "--web.config.file"},
		{[]string{"--web.health-listen-address=nocolon"}, "--web.health-listen-address"},
		{[]string{"--docker.host=http://localhost:2375"}, "--docker.host"},
		{[]string{"--gpu.source=nvidia-smi", "--nvidia-smi.path=" + notExec}, "--nvidia-smi.path"},
		{[]string{"--gpu.simulated-config=" + filepath.Join(dir, "none.yaml")}, "--gpu.simulated-config"},
		{[]string{"ps", "--output=yaml"}, "--output"},
		{[]string{"--web.listen-address=9402"}, "--web.listen-address"},
		{[]string{"--web.listen-address=:99999"}, "--web.listen-address"},
		{[]string{"--demo", "--gpu.source=nvml"}, "--gpu.source"},
		{[]string{"--demo", "--gpu.source=nvidia-smi"}, "--gpu.source"},
		{[]string{"ps", "--demo", "--gpu.source=nvidia-smi"}, "--gpu.source"},
		{[]string{"--gpu.source=simulated"}, "--gpu.source"},
		{[]string{"--demo", "--gpu.simulated-config=" + badWeb}, "--gpu.simulated-config"},
	}
	for _, c := range cases {
		// --demo would stand in for the source flags under test; elsewhere it keeps a mistaken start harmless.
		args := c.args
		if !strings.HasPrefix(c.flag, "--gpu.") && !strings.HasPrefix(c.flag, "--nvidia-smi") {
			args = append(args, "--demo")
		}
		if args[0] != "ps" {
			args = append(args, "--web.listen-address=127.0.0.1:0")
		}
		// A flag wrongly accepted starts a server, which must not hold the test up.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, binary, args...)
		out, err := cmd.CombinedOutput()
		cancel()
		code := cmd.ProcessState.ExitCode()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err == nil || code != 2 || len(lines) != 1 || !strings.Contains(lines[0], c.flag+":") {
			t.Errorf("%v: exit %d, want 2 with one line naming %s; output:\n%s", c.args, code, c.flag, out)
		}
		if strings.Contains(string(out), "goroutine") {
			t.Errorf("%v panicked:\n%s", c.args, out)
		}
	}
}

// The demo, ps and top read nothing of the machine's processes, so they run where there is no /proc, as on
// macOS: here, in a mount namespace whose /proc is an empty directory.
func TestDemoRunsWithoutProc(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for a mount namespace")
	}
	for _, args := range [][]string{{"ps", "--demo"}, {"top", "--demo", "--count=1"}} {
		cmd := exec.Command("unshare", append([]string{"--mount", "--", "sh", "-c",
			`mount -t tmpfs none /proc && [ ! -e /proc/self ] && exec "$0" "$@"`, binary}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "OWNER") || strings.Contains(string(out), "warning") {
			t.Errorf("%v without /proc: %v\n%s", args, err, out)
		}
	}
}

// A port taken is one line that names the flag, before anything starts: no "starting" line, no reading.
func TestListenAddressTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, flag := range []string{"--web.listen-address=", "--web.health-listen-address="} {
		args := []string{"--demo", flag + l.Addr().String()}
		if !strings.HasPrefix(flag, "--web.listen-address") {
			args = append(args, "--web.listen-address=127.0.0.1:0")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, binary, args...)
		out, _ := cmd.CombinedOutput()
		cancel()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if code := cmd.ProcessState.ExitCode(); code != 1 || len(lines) != 1 ||
			!strings.Contains(lines[0], strings.TrimSuffix(flag, "=")+": ") || !strings.Contains(lines[0], "address already in use") {
			t.Errorf("%v: exit %d, want 1 with one line naming the flag:\n%s", args, code, out)
		}
	}
}

// A binary built without cgo has no NVML: asked for it, it says why and exits 2; under auto it says so and reads
// the GPUs with nvidia-smi.
func TestWithoutNVML(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gpu-pod-exporter")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gpu-pod-exporter")
	build.Dir = e2eutil.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	const reason = "built without NVML (needs linux and cgo)"
	cmd := exec.Command(bin, "ps", "--gpu.source=nvml")
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.HasPrefix(string(out), "gpu-pod-exporter: --gpu.source: ") ||
		!strings.Contains(string(out), reason) || strings.Count(string(out), "\n") != 1 {
		t.Errorf("--gpu.source=nvml: exit %d, want 2 with one line that says why:\n%s", code, out)
	}
	fixture, _ := filepath.Abs("../../internal/gpu/nvidiasmi/testdata/telegraf__a100-sxm4-v12.xml")
	cmd = exec.Command(bin, "ps", "--nvidia-smi.path="+fakeSMI(t), "--path.procfs="+t.TempDir())
	cmd.Env = append(os.Environ(), "FAKESMI_FILE="+fixture)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ps under auto: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), "warning: NVML not available, reading GPUs with nvidia-smi (reason "+reason+")") {
		t.Errorf("ps did not say that it reads nvidia-smi for want of NVML:\n%s", stderr.String())
	}
	if !strings.Contains(stdout.String(), "OWNER") {
		t.Errorf("ps printed no table:\n%s", stdout.String())
	}
}

// A failing GPU source's error is printed once, whole, with the usual fix, by ps and by top (on a pipe).
func TestSourceErrorPrintedOnce(t *testing.T) {
	t.Setenv("FAKESMI_MODE", "exit")
	t.Setenv("FAKESMI_EXIT", "18")
	t.Setenv("FAKESMI_STDERR", "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95")
	for _, args := range [][]string{{"ps"}, {"top", "--count=1"}} {
		cmd := exec.Command(binary, append(args, "--gpu.source=nvidia-smi", "--nvidia-smi.path="+fakeSMI(t),
			"--path.procfs="+t.TempDir())...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		_ = cmd.Run()
		if n := strings.Count(stderr.String(), "Driver/library version mismatch"); n != 1 ||
			!strings.Contains(stderr.String(), "reboot the node, or reload the nvidia kernel module") {
			t.Errorf("%v: the error %d times, want once with its fix:\n%s", args, n, stderr.String())
		}
		if args[0] == "ps" && cmd.ProcessState.ExitCode() != 1 {
			t.Errorf("ps: exit %d, want 1", cmd.ProcessState.ExitCode())
		}
	}
}

// /healthz serves; /readyz says whether a reading succeeded; with basic auth on, a plain-HTTP probe listener serves
// just those two, so that kubelet probes need no credentials and expose nothing else.
func TestHealthAndReadinessBehindBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	webCfg := filepath.Join(t.TempDir(), "web.yml")
	write(t, webCfg, "basic_auth_users:\n  prometheus: "+string(hash)+"\n")
	probe := e2eutil.FreeAddr(t)
	e := e2eutil.StartExporter(t, binary, "--demo", "--web.config.file="+webCfg, "--web.health-listen-address="+probe)
	testkit.WaitFor(t, 10*time.Second, "the probe listener", func() bool {
		_, err := e2eutil.Get("http://" + probe + "/healthz")
		return err == nil
	})
	for _, path := range []string{"/healthz", "/readyz"} {
		if body, err := e2eutil.Get("http://" + probe + path); err != nil || strings.TrimSpace(body) != "ok" {
			t.Errorf("probe listener %s: %q, %v", path, body, err)
		}
		if status := getStatus(t, "http://"+e.Addr+path); status != http.StatusUnauthorized {
			t.Errorf("main listener %s without credentials: %d, want 401", path, status)
		}
	}
	for _, path := range []string{"/metrics", "/"} {
		if status := getStatus(t, "http://"+probe+path); status != http.StatusNotFound {
			t.Errorf("probe listener serves %s: %d, want 404", path, status)
		}
	}
}

// A node whose GPU source never answers is alive but not ready.
func TestNotReadyWhileNoReadingSucceeds(t *testing.T) {
	hang := filepath.Join(t.TempDir(), "nvidia-smi")
	write(t, hang, "#!/bin/sh\nexec sleep 30\n") // killed after --nvidia-smi.timeout; never left for long
	if err := os.Chmod(hang, 0o755); err != nil {
		t.Fatal(err)
	}
	e := e2eutil.StartExporter(t, binary, "--gpu.source=nvidia-smi", "--nvidia-smi.path="+hang,
		"--nvidia-smi.timeout=1s", "--collection.timeout=1s", "--path.procfs="+t.TempDir())
	if body, err := e2eutil.Get("http://" + e.Addr + "/healthz"); err != nil {
		t.Errorf("/healthz: %q, %v", body, err)
	}
	if status := getStatus(t, "http://"+e.Addr+"/readyz"); status != http.StatusServiceUnavailable {
		t.Errorf("/readyz with a hung source: %d, want 503", status)
	}
}

// The exporter's own process and Go runtime metrics and promhttp's handler metrics are served; the landing page
// links no pprof, which is not served.
func TestSelfMetricsAndLandingPage(t *testing.T) {
	e := e2eutil.StartExporter(t, binary, "--demo")
	_, families := e2eutil.Scrape(t, e.Addr)
	for _, name := range []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes",
		"process_open_fds", "promhttp_metric_handler_requests_total"} {
		if len(families[name].GetMetric()) == 0 {
			t.Errorf("no %s", name)
		}
	}
	page, err := e2eutil.Get("http://" + e.Addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page, "debug/pprof") {
		t.Error("the landing page links /debug/pprof, which is not served")
	}
	if status := getStatus(t, "http://"+e.Addr+"/debug/pprof/heap"); status == http.StatusOK {
		t.Error("/debug/pprof/heap is served")
	}
}

// ps on a node without Kubernetes or runtimes prints its table and no log lines: its stderr has its notes alone.
func TestPSPrintsNoLogLines(t *testing.T) {
	cmd := exec.Command(binary, "ps", "--demo")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ps --demo: %v\n%s", err, stderr.String())
	}
	if logs := withoutNotes(stderr.String()); len(logs) != 0 {
		t.Errorf("ps --demo wrote to stderr:\n%s", strings.Join(logs, "\n"))
	}
	// The log is there to ask for: --log.level=debug is accepted (the demo node has nothing to log at debug).
	stderr.Reset()
	cmd = exec.Command(binary, "ps", "--demo", "--log.level=debug")
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ps --demo --log.level=debug: %v\n%s", err, stderr.String())
	}
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// ps names a runtime socket given by flag that is not there, once, as one plain line.
func TestPSWarnsOnceAboutAMissingSocket(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "docker.sock")
	cmd := exec.Command(binary, "ps", "--demo", "--docker.host=unix://"+missing)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ps: %v\n%s", err, stderr.String())
	}
	lines := withoutNotes(stderr.String())
	if len(lines) != 1 || !strings.Contains(lines[0], "--docker.host: no socket at "+missing) {
		t.Errorf("ps stderr:\n%s\nwant one line naming --docker.host", stderr.String())
	}
}

// withoutNotes are the lines of ps' stderr that are not its notes on the reading ("# simulated GPU data …", a GPU's
// health).
func withoutNotes(stderr string) []string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if l != "" && !strings.HasPrefix(l, "# ") {
			lines = append(lines, l)
		}
	}
	return lines
}

// tlsWebConfig writes a web configuration with a self-signed certificate for 127.0.0.1 and the extra lines.
func tlsWebConfig(t *testing.T, extra string) string {
	t.Helper()
	dir := t.TempDir()
	cert, key := testkit.WriteSelfSignedCert(t, dir)
	path := filepath.Join(dir, "web.yml")
	write(t, path, "tls_server_config:\n  cert_file: "+cert+"\n  key_file: "+key+"\n"+extra)
	return path
}

// negotiate makes a TLS connection offering HTTP/2 and HTTP/1.1, and returns what the server chose.
func negotiate(t *testing.T, addr string, suites ...uint16) (tls.ConnectionState, error) {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"},
		CipherSuites: suites, MaxVersion: map[bool]uint16{true: tls.VersionTLS12, false: tls.VersionTLS13}[len(suites) > 0]})
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer c.Close()
	return c.ConnectionState(), nil
}

// HTTP/2 is off unless the web configuration turns it on; a configuration with CBC suites only, which HTTP/2 would
// refuse, is served over HTTP/1.1.
func TestTLSHTTP2OnlyWhenConfigured(t *testing.T) {
	for _, c := range []struct {
		name, extra string
		suites      []uint16
		want        string
	}{
		{"default", "", nil, "http/1.1"},
		{"http2 on", "http_server_config:\n  http2: true\n", nil, "h2"},
		{"CBC suites only", "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA]\n",
			[]uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}, "http/1.1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := e2eutil.StartExporter(t, binary, "--demo", "--web.config.file="+tlsWebConfig(t, c.extra))
			state, err := negotiate(t, e.Addr, c.suites...)
			if err != nil {
				t.Fatal(err)
			}
			if state.NegotiatedProtocol != c.want {
				t.Errorf("negotiated %q, want %q", state.NegotiatedProtocol, c.want)
			}
		})
	}
}

// A SIGHUP is logged, and the exporter carries on serving.
func TestSIGHUPIsLoggedAndIgnored(t *testing.T) {
	e := e2eutil.StartExporter(t, binary, "--demo")
	if err := syscall.Kill(e.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "a log line about the SIGHUP", func() bool {
		if done, err := e.Exited(); done {
			t.Fatalf("the exporter exited on SIGHUP: %v", err)
		}
		return strings.Contains(e.Output(), "SIGHUP")
	})
	if _, err := e2eutil.Get("http://" + e.Addr + "/healthz"); err != nil {
		t.Errorf("after SIGHUP: %v", err)
	}
}

// Failed TLS handshakes, which any client can cause, are not a log line each.
func TestTLSHandshakeFailuresAreNotALineEach(t *testing.T) {
	e := e2eutil.StartExporter(t, binary, "--demo", "--web.config.file="+tlsWebConfig(t, ""))
	for range 30 {
		c, err := net.Dial("tcp", e.Addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("\x16\x03\x01\x00\x05hello")) // a TLS record that is no ClientHello
		io.Copy(io.Discard, c)
		c.Close()
	}
	// The server logs a failed handshake before it closes the connection, which the copy above waited for; a SIGHUP
	// then logs a line after all of them.
	if err := syscall.Kill(e.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the SIGHUP line", func() bool { return strings.Contains(e.Output(), "SIGHUP") })
	if got := strings.Count(e.Output(), "TLS handshake error"); got != 1 {
		t.Errorf("%d log lines for 30 failed TLS handshakes, want 1 (the rest summed up later):\n%s", got, e.Output())
	}
}

// With --web.max-connections, idle connections make room for new ones: the exporter holds no more than the limit,
// and a scrape on a new connection is answered.
func TestConnectionLimit(t *testing.T) {
	e := e2eutil.StartExporter(t, binary, "--demo", "--web.max-connections=8")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 20 {
		conns = append(conns, e2eutil.IdleConn(t, e.Addr))
	}
	_, families, err := e2eutil.TryScrape(e.Addr)
	if err != nil {
		t.Errorf("a scrape with 20 idle connections open: %v", err)
	}
	// 12 of the 20 and the scrape's own connection each took the place of an idle one.
	for _, m := range families["gpu_pod_exporter_http_connections_evicted_total"].GetMetric() {
		if got := e2eutil.Value(m); e2eutil.Label(m, "listener") != "web" || got != 13 {
			t.Errorf("gpu_pod_exporter_http_connections_evicted_total{listener=%q} %v, want {listener=\"web\"} 13", e2eutil.Label(m, "listener"), got)
		}
	}
	if n := len(families["gpu_pod_exporter_http_connections_evicted_total"].GetMetric()); n != 1 {
		t.Errorf("%d series of gpu_pod_exporter_http_connections_evicted_total, want 1", n)
	}
	// The first connections were closed by the exporter: a read ends at once.
	for i, c := range conns[:8] {
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("idle connection %d still open past the limit of 8: %v", i, err)
		}
	}
	if !strings.Contains(e.Output(), "connection limit reached") {
		t.Errorf("no log line about the connection limit:\n%s", e.Output())
	}
}
