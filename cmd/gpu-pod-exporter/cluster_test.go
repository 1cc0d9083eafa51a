package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/promapi"
)

func parsePrometheus(t *testing.T, args ...string) (*prometheusFlags, error) {
	t.Helper()
	app := kingpin.New("test", "")
	f := &prometheusFlags{source: &sourceFlags{}}
	f.register(app.Command("ps", ""))
	if _, err := app.Parse(append([]string{"ps"}, args...)); err != nil {
		return f, err
	}
	return f, f.check()
}

func TestPrometheusFlags(t *testing.T) {
	dir := t.TempDir()
	httpConfig := filepath.Join(dir, "http.yml")
	if err := os.WriteFile(httpConfig, []byte("basic_auth: {username: gpe, password_file: pw}\ntls_config: {insecure_skip_verify: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := parsePrometheus(t, "--prometheus=https://thanos.example.com/", `--prometheus.selector={cluster="prod", instance=~"gpu-.*"}`,
		"--prometheus.node-label=node", "--prometheus.scrape-interval=30s", "--prometheus.time=2026-12-01T03:00:00Z",
		"--http.config.file="+httpConfig)
	if err != nil {
		t.Fatal(err)
	}
	if f.sel.String() != `cluster="prod",instance=~"gpu-.*"` || f.nodeLabel != "node" || f.interval.d != 30*time.Second ||
		!f.atTime.Equal(time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)) || f.timeout != 30*time.Second || f.client == nil {
		t.Errorf("flags %+v", f)
	}

	// Defaults, and the URL from the environment.
	t.Setenv(prometheusEnv, "http://localhost:9090")
	f, err = parsePrometheus(t, "--prometheus.time=1796169600.5")
	if err != nil || f.url != "http://localhost:9090" || f.nodeLabel != "instance" || f.interval.d != 0 ||
		f.atTime.UnixMilli() != 1796169600500 || f.maxAnswer != promapi.DefaultReadingBytes {
		t.Errorf("defaults: %+v, %v", f, err)
	}
}

// The start warns, once, of credentials sent over http:// and of a client configuration others can read.
func TestPrometheusFlagsWarnOfExposedSecrets(t *testing.T) {
	httpConfig := filepath.Join(t.TempDir(), "http.yml")
	if err := os.WriteFile(httpConfig, []byte("basic_auth: {username: gpe, password: pw}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := parsePrometheus(t, "--prometheus=http://prometheus.example.com:9090", "--http.config.file="+httpConfig)
	if err != nil {
		t.Fatal(err)
	}
	if ws := f.warnings(); len(ws) != 2 || !strings.Contains(ws[0], "over http://") || !strings.Contains(ws[1], httpConfig) {
		t.Errorf("warnings %q, want the password over http:// and the file others can read", ws)
	}
}

func TestPrometheusFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "http.yml")
	if err := os.WriteFile(bad, []byte("basic_auth: {username: a}\nauthorization: {credentials: b}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unknown := filepath.Join(dir, "unknown.yml")
	if err := os.WriteFile(unknown, []byte("basic_auth: {user: a}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		flag string
		why  string
	}{
		{[]string{"--prometheus.selector=a=\"b\""}, "prometheus.selector", "needs --prometheus"},
		{[]string{"--http.config.file=" + bad}, "http.config.file", "needs --prometheus"},
		{[]string{"--prometheus.timeout=5s"}, "prometheus.timeout", "needs --prometheus"},
		{[]string{"--prometheus=localhost:9090"}, "prometheus", "want an http:// or https:// URL"},
		{[]string{"--prometheus=http://p/?q=1"}, "prometheus", "without ?query"},
		{[]string{"--prometheus=http://p", "--prometheus.selector=cluster=prod"}, "prometheus.selector", "double-quoted"},
		{[]string{"--prometheus=http://p", "--prometheus.node-label=k8s-node"}, "prometheus.node-label", "not a label name"},
		{[]string{"--prometheus=http://p", "--prometheus.time=noon"}, "prometheus.time", "RFC 3339"},
		{[]string{"--prometheus=http://p", "--http.config.file=" + bad}, "http.config.file", "at most one of"},
		{[]string{"--prometheus=http://p", "--http.config.file=" + unknown}, "http.config.file", "field user not found"},
		{[]string{"--prometheus=http://p", "--http.config.file=" + filepath.Join(dir, "none.yml")}, "http.config.file", "no such file"},
	} {
		_, err := parsePrometheus(t, c.args...)
		if err == nil || !asUsage(err) || !strings.HasPrefix(err.Error(), "--"+c.flag+": ") || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%v: %v, want a usage error naming --%s that says %q", c.args, err, c.flag, c.why)
		}
	}
	// The answers' budget, in a unit or in bytes, within its bounds.
	for arg, want := range map[string]int64{"96MiB": 96 << 20, "2GB": -1, "1073741824": 1 << 30, "0": -1, "512KiB": -1, "lots": -1} {
		f, err := parsePrometheus(t, "--prometheus=http://p", "--prometheus.max-answer-bytes="+arg)
		switch {
		case want < 0 && (err == nil || !strings.HasPrefix(err.Error(), "--prometheus.max-answer-bytes: ")):
			t.Errorf("--prometheus.max-answer-bytes=%s: %v, want it refused", arg, err)
		case want >= 0 && (err != nil || f.maxAnswer != want):
			t.Errorf("--prometheus.max-answer-bytes=%s: %d, %v", arg, f.maxAnswer, err)
		}
	}
	// Duration flags are refused while parsing, naming the flag.
	for _, arg := range []string{"--prometheus.scrape-interval=0s", "--prometheus.timeout=-1s", "--prometheus.timeout=soon"} {
		_, err := parsePrometheus(t, "--prometheus=http://p", arg)
		if err == nil || !strings.Contains(err.Error(), strings.Split(arg, "=")[0]+":") {
			t.Errorf("%s: %v", arg, err)
		}
	}
	// A node source and the cluster are two different things to read.
	app := kingpin.New("test", "")
	f := &prometheusFlags{source: &sourceFlags{demo: true}}
	f.register(app.Command("ps", ""))
	if _, err := app.Parse([]string{"ps", "--prometheus=http://p"}); err != nil {
		t.Fatal(err)
	}
	if err := f.check(); err == nil || !strings.HasPrefix(err.Error(), "--prometheus: ") ||
		!strings.Contains(err.Error(), "--demo") {
		t.Errorf("--prometheus with --demo: %v", err)
	}
}

func TestExplain(t *testing.T) {
	f := &prometheusFlags{url: "http://127.0.0.1:9090", timeout: 30 * time.Second}
	unreachable := classifiedFor(t, promapi.ErrUnreachable)
	if got := f.explain(unreachable).Error(); !strings.HasSuffix(got, "(through kubectl port-forward? it must be running)") {
		t.Errorf("unreachable on loopback: %s", got)
	}
	f.url = "http://prometheus.monitoring:9090"
	if got := f.explain(unreachable).Error(); strings.Contains(got, "port-forward") {
		t.Errorf("unreachable elsewhere: %s", got)
	}
	if got := f.explain(classifiedFor(t, promapi.ErrUnauthorized)).Error(); !strings.HasSuffix(got, "give credentials with --http.config.file") {
		t.Errorf("unauthorized: %s", got)
	}
	f.maxAnswer = 48 << 20
	if got := f.explain(classifiedFor(t, promapi.ErrTooLarge)).Error(); !strings.HasSuffix(got, "or raise --prometheus.max-answer-bytes (48MiB)") {
		t.Errorf("too large: %s", got)
	}
}

// classifiedFor is an error of the class, as promapi returns them.
func classifiedFor(t *testing.T, class error) error {
	t.Helper()
	return errors.Join(errors.New("Prometheus at http://p refused"), class)
}
