package promapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/config"
)

// secretConfig is an HTTP client configuration with every kind of secret that goes in a request: basic auth and a
// secret header (Mimir's X-Scope-OrgID, an API key), as --http.config.file gives them.
const secretConfig = `
basic_auth: {username: ps, password: hunter2}
http_headers:
  X-Api-Key: {secrets: [k3y]}
  X-Scope-OrgID: {secrets: [tenant-1]}
`

func secretClient(t *testing.T, extra string) *http.Client {
	t.Helper()
	cfg, err := config.LoadHTTPConfig(secretConfig + extra)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.NewClientFromConfig(*cfg, "test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// recorder is a server that records the secrets each request brought, and answers with handler.
type recorder struct {
	mu      sync.Mutex
	secrets []string
}

func (r *recorder) handler(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		if _, pw, ok := req.BasicAuth(); ok {
			r.secrets = append(r.secrets, "password "+pw)
		}
		for _, h := range []string{"X-Api-Key", "X-Scope-OrgID"} {
			if v := req.Header.Get(h); v != "" {
				r.secrets = append(r.secrets, h+" "+v)
			}
		}
		r.mu.Unlock()
		next(w, req)
	}
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.secrets...)
}

func answer(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", jsonType)
	w.Write([]byte(`{"status":"success","data":{"resultType":"vector","result":[]}}`))
}

// A redirect would take the client's credentials wherever it points, for the client adds them to every request it
// sends: to another host or port, and from https down to http, in the clear. Such a redirect is refused, every time
// (301, 302, 307, 308), with one line naming it, and the other server gets nothing; a redirect within the server
// is followed with the credentials, as before.
func TestRedirectsDoNotCarrySecretsElsewhere(t *testing.T) {
	var elsewhere recorder
	other := httptest.NewServer(elsewhere.handler(answer))
	t.Cleanup(other.Close)
	var here recorder
	mux := http.NewServeMux()
	for _, code := range []int{301, 302, 307, 308} {
		mux.HandleFunc("/to-other/"+strconv.Itoa(code)+"/api/v1/query", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/api/v1/query", code)
		})
	}
	mux.HandleFunc("/moved/api/v1/query", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/prometheus/api/v1/query", http.StatusPermanentRedirect)
	})
	mux.HandleFunc("/prometheus/api/v1/query", answer)
	plain := httptest.NewServer(here.handler(mux.ServeHTTP))
	t.Cleanup(plain.Close)
	tlsSrv := httptest.NewTLSServer(here.handler(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/prometheus/api/v1/query", http.StatusTemporaryRedirect) // https to http
	}))
	t.Cleanup(tlsSrv.Close)

	run := func(base string, hc *http.Client) error {
		c, err := New(base, hc)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Query(context.Background(), "up", time.Time{}, func(Sample) error { return nil })
		return err
	}
	hc := secretClient(t, "")
	for _, code := range []int{301, 302, 307, 308} {
		err := run(plain.URL+"/to-other/"+strconv.Itoa(code), hc)
		if err == nil || !strings.Contains(err.Error(), "redirected from "+plain.URL) || !strings.Contains(err.Error(), other.URL) ||
			!strings.Contains(err.Error(), "another port") || strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("%d to another port: %v, want a line naming the redirect", code, err)
		}
	}
	tlsClient := secretClient(t, "tls_config: {insecure_skip_verify: true}\n")
	if err := run(tlsSrv.URL, tlsClient); err == nil || !strings.Contains(err.Error(), "from https to http") {
		t.Errorf("https to http: %v, want the downgrade refused", err)
	}
	if got := elsewhere.got(); len(got) != 0 {
		t.Errorf("the other server got %q", got)
	}
	if got := here.got(); len(got) == 0 {
		t.Fatal("the server asked got no credentials")
	}
	before := len(here.got())
	if err := run(plain.URL+"/moved", hc); err != nil {
		t.Errorf("a redirect within the server: %v", err)
	}
	if got := here.got()[before:]; len(got) != 6 { // two requests, three secrets each
		t.Errorf("within the server, the requests brought %q, want the credentials twice", got)
	}
}

func TestConfigWarnings(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "http.yml")
	password := filepath.Join(dir, "password")
	header := filepath.Join(dir, "org")
	for _, f := range []string{file, password, header} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.LoadHTTPConfig("basic_auth: {username: u, password_file: " + password + "}\n" +
		"http_headers: {X-Scope-OrgID: {files: [" + header + "]}, X-Plain: {values: [v]}}\n")
	if err != nil {
		t.Fatal(err)
	}
	if ws := ConfigWarnings("https://prometheus:9090", cfg, file); len(ws) != 0 {
		t.Errorf("https and files of mode 0600: %q, want nothing", ws)
	}
	if ws := ConfigWarnings("http://localhost:9090", cfg, file); len(ws) != 0 {
		t.Errorf("http:// to this machine (kubectl port-forward): %q, want nothing", ws)
	}
	ws := ConfigWarnings("http://user:pw@prometheus:9090", cfg, file)
	if len(ws) != 1 || !strings.Contains(ws[0], "http://user:xxxxx@prometheus:9090 sends a basic-auth password and the secret header X-Scope-OrgID over http://") {
		t.Errorf("http://: %q, want one warning naming the secrets", ws)
	}
	for _, f := range []string{file, password, header} {
		if err := os.Chmod(f, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ws = ConfigWarnings("https://prometheus:9090", cfg, file)
	if len(ws) != 3 || !strings.Contains(ws[0], file+" holds secrets and every user") || !strings.Contains(ws[0], "0644") ||
		!strings.Contains(ws[1], password) || !strings.Contains(ws[2], header) {
		t.Errorf("files readable by others: %q, want one warning each: the configuration, the password, the header", ws)
	}
	if ws := ConfigWarnings("http://prometheus:9090", &config.HTTPClientConfig{}, ""); len(ws) != 0 {
		t.Errorf("no credentials over http://: %q, want nothing", ws)
	}
}
