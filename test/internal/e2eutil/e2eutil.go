// Package e2eutil is the plumbing the end-to-end tests share: building and running the real binary, scraping and
// reading its exposition, running a real Prometheus and querying it, and polling with a deadline.
package e2eutil

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// RepoRoot is the module root, found from this file's place in it.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// BuildBinary builds ./cmd/gpu-pod-exporter into dir and returns the binary's path.
func BuildBinary(dir string) (string, error) {
	path := filepath.Join(dir, "gpu-pod-exporter")
	cmd := exec.Command("go", "build", "-o", path, "./cmd/gpu-pod-exporter")
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return path, nil
}

// Main is a TestMain that builds the binary into a temporary directory, sets *binary to its path, runs the tests,
// removes the directory and exits.
func Main(m *testing.M, binary *string) {
	dir, err := os.MkdirTemp("", "gpe-e2e-")
	if err != nil {
		panic(err)
	}
	if *binary, err = BuildBinary(dir); err != nil {
		fmt.Fprintln(os.Stderr, "building the binary:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Process is a command started by Start.
type Process struct {
	Pid    int // its process ID
	out    testkit.SyncBuffer
	exited chan struct{}
	err    error // set when exited is closed
}

// Output is what the process has written so far, stdout and stderr together.
func (p *Process) Output() string { return p.out.String() }

// Exited reports whether the process has ended, and with what.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.exited:
		return true, p.err
	default:
		return false, nil
	}
}

// logLines is how much of a process's output a failed test logs.
const logLines = 100

// Start starts cmd with its output captured. It is killed when the test ends, and the last lines of its output are
// logged if the test failed.
func Start(t testing.TB, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd.Path, err)
	}
	p.Pid = cmd.Process.Pid
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("%s output (last lines):\n%s", filepath.Base(cmd.Path), tail(p.Output(), logLines))
		}
	})
	return p
}

func tail(s string, n int) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// Exporter is a running exporter.
type Exporter struct {
	Addr string // host:port it listens on
	*Process
}

// StartExporter runs binary on a free loopback address with args and waits until it listens. It is stopped when the
// test ends, and its output is logged if the test failed.
func StartExporter(t testing.TB, binary string, args ...string) *Exporter {
	t.Helper()
	addr := FreeAddr(t)
	p := Start(t, exec.Command(binary, append([]string{"--web.listen-address=" + addr}, args...)...))
	WaitListening(t, p, addr, 20*time.Second)
	return &Exporter{Addr: addr, Process: p}
}

// WaitListening waits until something accepts connections on addr, failing the test at once if p exits first.
func WaitListening(t testing.TB, p *Process, addr string, limit time.Duration) {
	t.Helper()
	testkit.WaitFor(t, limit, "a listener on "+addr, func() bool {
		if done, err := p.Exited(); done {
			t.Fatalf("the process exited before listening on %s: %v (its output follows)", addr, err)
		}
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

var client = &http.Client{Timeout: 10 * time.Second}

// Get fetches url and returns its body; a status other than 200 is an error (with the body still returned).
func Get(url string) (string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), err
}

// Scrape fetches http://addr/metrics and parses it; a failure or a status other than 200 fails the test.
func Scrape(t testing.TB, addr string) (body string, families map[string]*dto.MetricFamily) {
	t.Helper()
	body, families, err := TryScrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	return body, families
}

// TryScrape fetches http://addr/metrics and parses it, for tests that poll until the answer is right.
func TryScrape(addr string) (body string, families map[string]*dto.MetricFamily, err error) {
	body, err = Get("http://" + addr + "/metrics")
	if err != nil {
		return body, nil, fmt.Errorf("GET /metrics: %v\n%s", err, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err = parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return body, nil, fmt.Errorf("parsing the exposition of %s: %v", addr, err)
	}
	return body, families, nil
}

// Label is the value of the metric's label name, "" if it has none.
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Value is the value of a gauge, counter or untyped metric.
func Value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	}
	return m.GetUntyped().GetValue()
}

// FreeAddr is a loopback host:port that nothing listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// ScrapeConfig is a Prometheus configuration that scrapes targets every second as job gpu-pod-exporter, with
// honor_labels as the chart's ServiceMonitor sets it.
func ScrapeConfig(targets ...string) string {
	quoted := make([]string, len(targets))
	for i, target := range targets {
		quoted[i] = strconv.Quote(target)
	}
	return `global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpu-pod-exporter
    honor_labels: true
    static_configs:
      - targets: [` + strings.Join(quoted, ", ") + `]
`
}

// StartPrometheus runs prometheus (from PATH) with the given configuration file contents on a free loopback address
// and waits until it is ready. It is stopped when the test ends, and its output is logged if the test failed.
func StartPrometheus(t testing.TB, config string) (addr string) {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not installed (Debian package prometheus; scripts/test.sh installs it)")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	addr = FreeAddr(t)
	p := Start(t, exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr))
	testkit.WaitFor(t, 60*time.Second, "prometheus to be ready", func() bool {
		if done, err := p.Exited(); done {
			t.Fatalf("prometheus exited before it was ready: %v (its output follows)", err)
		}
		_, err := Get("http://" + addr + "/-/ready")
		return err == nil
	})
	return addr
}

// PromAPI calls the Prometheus HTTP API at prom (host:port) and returns the data of a successful answer.
func PromAPI(prom, path string, params url.Values) (json.RawMessage, error) {
	body, err := Get("http://" + prom + path + "?" + params.Encode())
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, body)
	}
	var resp struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		return nil, err
	}
	if resp.Status != "success" {
		return nil, fmt.Errorf("%s", resp.Error)
	}
	return resp.Data, nil
}

// Sample is one series of an instant vector.
type Sample struct {
	Metric map[string]string
	Value  float64
}

// TryQuery runs an instant query that must return a vector.
func TryQuery(prom, expr string) ([]Sample, error) {
	return TryQueryAt(prom, expr, time.Time{})
}

// TryQueryAt runs an instant query evaluated at a given time (the zero time: now).
func TryQueryAt(prom, expr string, at time.Time) ([]Sample, error) {
	params := url.Values{"query": {expr}}
	if !at.IsZero() {
		params.Set("time", strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64))
	}
	data, err := PromAPI(prom, "/api/v1/query", params)
	if err != nil {
		return nil, err
	}
	var r struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	if r.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s", r.ResultType)
	}
	var out []Sample
	for _, s := range r.Result {
		str, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("value %v: %v", s.Value[1], err)
		}
		out = append(out, Sample{s.Metric, v})
	}
	return out, nil
}

// Query runs an instant query; an error fails the test.
func Query(t testing.TB, prom, expr string) []Sample {
	t.Helper()
	res, err := TryQuery(prom, expr)
	if err != nil {
		t.Fatalf("query %q: %v", expr, err)
	}
	return res
}

// ByLabel maps each sample's value of label to its value.
func ByLabel(res []Sample, label string) map[string]float64 {
	m := map[string]float64{}
	for _, s := range res {
		m[s.Metric[label]] = s.Value
	}
	return m
}

// IdleConn opens a connection to addr and makes one request on it, read to the end, so that the server holds it as
// an idle keep-alive connection. The caller closes it.
func IdleConn(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: "+addr+"\r\n\r\n"); err != nil {
		c.Close()
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return c
}
