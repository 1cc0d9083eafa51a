package server

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/configfile"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"
)

func TestMetricsPath(t *testing.T) {
	for _, ok := range []string{"/metrics", "/", "/metrics/", "/gpu/metrics"} {
		if err := CheckMetricsPath(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"metrics", "", "/healthz", "/readyz", "/metrics?format=text", "/metrics#x",
		"/a/../metrics", "//metrics", "/metrics/.", "GET /metrics", "/{x}"} {
		if err := CheckMetricsPath(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// writeWebConfig writes a web configuration with a self-signed certificate and the given extra lines.
func writeWebConfig(t *testing.T, extra string) string {
	t.Helper()
	dir := t.TempDir()
	cert, key := testkit.WriteSelfSignedCert(t, dir)
	path := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(path, []byte("tls_server_config:\n  cert_file: "+cert+"\n  key_file: "+key+"\n"+extra), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// HTTP/2 requires an AES-128-GCM suite: with HTTP/2 on, a configuration without one fails the startup check, as it
// would fail at listen; with HTTP/2 off (the default), it is served.
func TestWebConfigCheck(t *testing.T) {
	cbc := "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA]\n"
	if err := CheckWebConfig(writeWebConfig(t, cbc+"http_server_config:\n  http2: true\n")); err == nil ||
		!strings.Contains(err.Error(), "HTTP/2-required") {
		t.Errorf("CBC suites only, HTTP/2 on: %v, want the HTTP/2 server's refusal", err)
	}
	if err := CheckWebConfig(writeWebConfig(t, cbc)); err != nil {
		t.Errorf("CBC suites only, HTTP/2 off: %v", err)
	}
	gcm := "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\nhttp_server_config:\n  http2: true\n"
	if err := CheckWebConfig(writeWebConfig(t, gcm)); err != nil {
		t.Errorf("a GCM suite, HTTP/2 on: %v", err)
	}
	c, err := loadWebConfig(writeWebConfig(t, ""))
	if err != nil || c.HTTPConfig.HTTP2 {
		t.Errorf("without http_server_config: HTTP/2 %v (%v), want off", c.HTTPConfig.HTTP2, err)
	}
}

// Behind the guard: no credentials 401, a right password 200 (and the configured headers), wrong passwords 401
// until the client's budget of failed checks is spent, then 429 with Retry-After; the right password still works.
func TestGuard(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "web.yml")
	cfg := "basic_auth_users:\n  prometheus: " + string(hash) + "\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	wc := &webConfigFile{path: path}
	first, err := wc.current()
	if err != nil {
		t.Fatal(err)
	}
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "metrics") })
	srv := httptest.NewServer(newGuard(wc, first, next, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	get := func(user, password string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL, nil)
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := get("", ""); resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") != "Basic" {
		t.Errorf("no credentials: %s %v", resp.Status, resp.Header)
	}
	if resp := get("prometheus", "s3cret"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Frame-Options") != "deny" {
		t.Errorf("right password: %s %v", resp.Status, resp.Header)
	}
	var statuses []int
	for range 8 {
		statuses = append(statuses, get("prometheus", "guess").StatusCode)
	}
	if want := []int{401, 401, 401, 401, 401, 429, 429, 429}; !slices.Equal(statuses, want) {
		t.Errorf("wrong passwords: %v, want %v", statuses, want)
	}
	if resp := get("nobody", "guess"); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("an unknown user from the refused client: %s %v", resp.Status, resp.Header)
	}
	if resp := get("prometheus", "s3cret"); resp.StatusCode != http.StatusOK {
		t.Errorf("right password after the flood: %s", resp.Status)
	}
}

// A scraper that shares its address with a client that spent the address's budget of failed checks is refused at
// its first ask, and let in when it asks again on the same keep-alive connection: the server gives each connection's
// requests what the password checks remember of it.
func TestGuardRemembersTheConnection(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Config{
		MetricsPath: "/metrics",
		Metrics:     http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "metrics") }),
		Ready:       func(context.Context) error { return nil }, Registry: prometheus.NewRegistry(),
		WebConfigFile:  writeWebConfig(t, "basic_auth_users:\n  prometheus: "+string(hash)+"\n"),
		MaxConnections: 16, CollectionTimeout: time.Second, Logger: slog.New(slog.DiscardHandler),
	}, Listeners{Main: []net.Listener{l}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer func() { stop(); s.Wait(ctx) }()
	url := "https://" + l.Addr().String() + "/metrics"
	get := func(client *http.Client, password string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		req.SetBasicAuth("prometheus", password)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	connection := func() *http.Client { // its own keep-alive connection
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	}
	attacker, scraper := connection(), connection()
	for range 6 {
		get(attacker, "guess")
	}
	if got := get(scraper, "s3cret"); got != http.StatusTooManyRequests {
		t.Fatalf("the scraper's first ask from the spent address: %d, want 429", got)
	}
	if got := get(scraper, "s3cret"); got != http.StatusOK {
		t.Errorf("the scraper asking again on its connection: %d, want 200", got)
	}
}

func lines(b *testkit.SyncBuffer) []string { return strings.Split(strings.TrimSpace(b.String()), "\n") }

// A flood of failed TLS handshakes is one line when it starts and one a minute after, with the count left out;
// another kind of line is not held back by it, and after a quiet minute the next handshake error is logged at once.
func TestServerErrorLogIsRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out testkit.SyncBuffer
		l := errorLog(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			},
		})), time.Minute)
		for i := range 100 {
			l.Printf("http: TLS handshake error from 10.0.0.%d:4000%d: EOF", i%250, i%10)
			time.Sleep(100 * time.Millisecond)
		}
		l.Printf("http: Accept error: accept tcp [::]:9402: too many open files; retrying in 5ms")
		if got := lines(&out); len(got) != 2 || !strings.Contains(got[0], "10.0.0.0:40000") || !strings.Contains(got[1], "Accept error") {
			t.Fatalf("after 10 s of handshake errors and an accept error:\n%s", strings.Join(got, "\n"))
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		got := lines(&out)
		if len(got) != 3 || !strings.Contains(got[2], "10.0.0.99:40009") || !strings.Contains(got[2], "similar_lines_left_out=98") {
			t.Fatalf("a minute later:\n%s", strings.Join(got, "\n"))
		}
		time.Sleep(2 * time.Minute)
		l.Printf("http: TLS handshake error from 10.0.0.7:1: remote error: tls: bad certificate")
		if got := lines(&out); len(got) != 4 || !strings.Contains(got[3], "bad certificate") {
			t.Fatalf("after a quiet interval:\n%s", strings.Join(got, "\n"))
		}
	})
}

// A changed web configuration is read again (a new user is let in without a restart) within a second; one that no
// longer loads is an error, and the file fixed is read again.
func TestWebConfigIsReadAgainWhenChanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "web.yml")
		writeUsers := func(users string) {
			if err := os.WriteFile(path, []byte("basic_auth_users:\n"+users), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		writeUsers("  prometheus: " + string(hash) + "\n")
		wc := &webConfigFile{path: path}
		users := func() []string {
			c, err := wc.current()
			if err != nil {
				return []string{"error"}
			}
			return slices.Sorted(maps.Keys(c.Users))
		}
		if got := users(); !slices.Equal(got, []string{"prometheus"}) {
			t.Fatalf("users %v", got)
		}
		writeUsers("  prometheus: " + string(hash) + "\n  grafana: " + string(hash) + "\n")
		time.Sleep(recheck)
		if got := users(); !slices.Equal(got, []string{"grafana", "prometheus"}) {
			t.Errorf("after a change: users %v", got)
		}
		writeUsers("  prometheus: not-a-hash\n")
		time.Sleep(recheck)
		if got := users(); !slices.Equal(got, []string{"error"}) {
			t.Errorf("after a broken change: users %v, want an error", got)
		}
		writeUsers("  grafana: " + string(hash) + "\n")
		time.Sleep(recheck)
		if got := users(); !slices.Equal(got, []string{"grafana"}) {
			t.Errorf("after the fix: users %v", got)
		}
	})
}

// The web configuration and the TLS files it names are read only if they are regular files within the cap: a FIFO
// would block the start (and, named by a configuration read again, every TLS handshake), a device would be read
// until memory ran out.
func TestWebConfigFilesMustBeRegular(t *testing.T) {
	dir := t.TempDir()
	pipe := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{pipe, "/dev/zero"} {
		if err := testkit.Within(t, 5*time.Second, path, func() error { return CheckWebConfig(path) }); !errors.Is(err, configfile.ErrNotRegular) {
			t.Errorf("the web configuration %s: %v, want a refusal", path, err)
		}
	}
	cert, key := testkit.WriteSelfSignedCert(t, dir)
	for _, c := range []struct{ name, config string }{
		{"cert_file", "tls_server_config:\n  cert_file: " + pipe + "\n  key_file: " + key + "\n"},
		{"key_file", "tls_server_config:\n  cert_file: " + cert + "\n  key_file: /dev/zero\n"},
		{"client_ca_file", "tls_server_config:\n  cert_file: " + cert + "\n  key_file: " + key +
			"\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: " + pipe + "\n"},
	} {
		path := filepath.Join(dir, c.name+".yml")
		if err := os.WriteFile(path, []byte(c.config), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := testkit.Within(t, 5*time.Second, c.name, func() error { return CheckWebConfig(path) }); !errors.Is(err, configfile.ErrNotRegular) {
			t.Errorf("%s: %v, want a refusal", c.name, err)
		}
	}

	// A key file that becomes a FIFO after the start fails the handshakes, and blocks none.
	wc := &webConfigFile{path: writeWebConfig(t, "")}
	c, err := wc.current()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := c.TLSConfig.TLSKeyPath
	tc := wc.tlsConfig(false)
	if _, err := tc.GetConfigForClient(nil); err != nil {
		t.Fatalf("a handshake with the key file in place: %v", err)
	}
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(keyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := testkit.Within(t, 5*time.Second, "a handshake", func() error { _, err := tc.GetConfigForClient(nil); return err }); !errors.Is(err, configfile.ErrNotRegular) {
		t.Errorf("a handshake with a FIFO for the key file: %v, want a refusal", err)
	}
}

// A password check ends at the scrape timeout the scraper sends; a value that is not a positive number of seconds
// up to an hour leaves the request's context as it is.
func TestCheckContextEndsAtTheScrapeTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for value, want := range map[string]time.Duration{"10": 10 * time.Second, "0.5": 500 * time.Millisecond,
			"3600": time.Hour, "": 0, "0": 0, "-1": 0, "NaN": 0, "+Inf": 0, "3601": 0, "10s": 0} {
			r, _ := http.NewRequest("GET", "/metrics", nil)
			if value != "" {
				r.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", value)
			}
			ctx, cancel := checkContext(r)
			deadline, ok := ctx.Deadline()
			cancel()
			if got := time.Until(deadline); ok != (want > 0) || ok && got != want {
				t.Errorf("%q: a deadline %v (%v), want one in %v", value, ok, got, want)
			}
		}
	})
}
