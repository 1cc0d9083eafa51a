//go:build soak

package soak

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// cpuSeconds is the CPU time the process has used, user and system.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command name, which is in parentheses: utime and stime are the 12th and 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// scrapeResults are the authenticated scrapes of one phase.
type scrapeResults struct {
	mu        sync.Mutex
	latencies []time.Duration
	failed    int
	firstErr  string
}

func (r *scrapeResults) add(d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latencies = append(r.latencies, d)
	if err != nil {
		r.failed++
		if r.firstErr == "" {
			r.firstErr = err.Error()
		}
	}
}

func (r *scrapeResults) summary() (n, failed int, p99 time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := slices.Clone(r.latencies)
	slices.Sort(l)
	if len(l) > 0 {
		p99 = l[min(len(l)-1, len(l)*99/100)]
	}
	return len(l), r.failed, p99
}

// authScraper scrapes like Prometheus: one keep-alive HTTP/1.1 connection, basic auth, a 10 s timeout.
type authScraper struct {
	client         *http.Client
	url            string
	user, password string
}

// newAuthScraper scrapes addr as the user prometheus.
func newAuthScraper(addr string) *authScraper {
	return newScraperFrom(addr, "", "prometheus", "s3cret")
}

// newScraperFrom scrapes addr from the loopback address source ("" for any) as user.
func newScraperFrom(addr, source, user, password string) *authScraper {
	dialer := &net.Dialer{}
	if source != "" {
		dialer.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	return &authScraper{url: "https://" + addr + "/metrics", user: user, password: password, client: &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext:       dialer.DialContext,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
			ForceAttemptHTTP2: false,
			TLSNextProto:      map[string]func(string, *tls.Conn) http.RoundTripper{},
		},
	}}
}

func (p *authScraper) scrape() error {
	req, _ := http.NewRequest("GET", p.url, nil)
	req.SetBasicAuth(p.user, p.password)
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", "10") // as Prometheus sends its timeout
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// refusals is how many password checks the exporter refused (429), by reason, from its self-metrics.
func (p *authScraper) refusals() (map[string]float64, error) {
	req, _ := http.NewRequest("GET", p.url+"?name[]=gpu_pod_exporter_basic_auth_refused_total", nil)
	req.SetBasicAuth(p.user, p.password)
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	counts := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		if rest, ok := strings.CutPrefix(line, `gpu_pod_exporter_basic_auth_refused_total{reason="`); ok {
			reason, value, _ := strings.Cut(rest, `"} `)
			counts[reason], _ = strconv.ParseFloat(strings.TrimSpace(value), 64)
		}
	}
	return counts, nil
}

// h2Reset opens an HTTP/2 connection and sends streams requests with wrong passwords, each reset at once. It reports
// whether the server refused HTTP/2.
func h2Reset(addr string, streams int, seq *atomic.Int64) (refused bool, err error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr,
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if conn.ConnectionState().NegotiatedProtocol != "h2" {
		return true, nil
	}
	w := bufio.NewWriterSize(conn, 64<<10)
	fr := http2.NewFramer(w, conn)
	go func() { // the server's frames, read until it closes the connection
		for {
			if _, err := fr.ReadFrame(); err != nil {
				return
			}
		}
	}()
	if _, err := io.WriteString(w, http2.ClientPreface); err != nil {
		return false, err
	}
	if err := fr.WriteSettings(); err != nil {
		return false, err
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for i := range streams {
		block.Reset()
		auth := base64.StdEncoding.EncodeToString(fmt.Appendf(nil, "prometheus:guess-%d", seq.Add(1)))
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", addr}, {":path", "/metrics"},
			{"authorization", "Basic " + auth}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			return false, err
		}
		if err := fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			return false, err
		}
	}
	if err := w.Flush(); err != nil {
		return false, err
	}
	// Leave the connection open a moment, as an attacker would, for the server to take the streams in.
	time.Sleep(2 * time.Second)
	return false, nil
}

// h1Guess is one client that asks for /metrics with a new wrong password as fast as the server answers, over one
// keep-alive HTTP/1.1 connection from its own loopback address.
func h1Guess(ctx context.Context, addr, source string, seq *atomic.Int64, answers *atomic.Int64) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:     (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}).DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}}
	defer client.CloseIdleConnections()
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+addr+"/metrics", nil)
		req.SetBasicAuth("prometheus", fmt.Sprintf("guess-%d", seq.Add(1)))
		resp, err := client.Do(req)
		if err != nil {
			time.Sleep(10 * time.Millisecond) // the exporter is down, restarting: dial again soon, not in a busy loop
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answers.Add(1)
	}
}

// authExporter builds the exporter and returns it with a web configuration of TLS and two basic-auth users,
// prometheus (password s3cret) and agent (an0ther), whose passwords are hashed by bcrypt at its default cost (10),
// as htpasswd hashes them.
func authExporter(t *testing.T) (binary, webConfig string) {
	t.Helper()
	binary, err := e2eutil.BuildBinary(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := testkit.WriteSelfSignedCert(t, t.TempDir())
	cfg := fmt.Sprintf("tls_server_config:\n  cert_file: %s\n  key_file: %s\nbasic_auth_users:\n", certFile, keyFile)
	for _, u := range [][2]string{{"prometheus", "s3cret"}, {"agent", "an0ther"}} {
		hash, err := bcrypt.GenerateFromPassword([]byte(u[1]), bcrypt.DefaultCost)
		if err != nil {
			t.Fatal(err)
		}
		cfg += fmt.Sprintf("  %s: %s\n", u[0], hash)
	}
	return binary, cfg
}

// TestSoakAuthFloods: an exporter with TLS and bcrypt basic auth (cost 10) is flooded with wrong passwords while
// Prometheus, already authenticated, scrapes it every half second with a 10 s timeout. Two floods, each against a
// fresh exporter, with HTTP/2 as the web configuration leaves it and with HTTP/2 turned on:
//   - HTTP/2 rapid reset: 20 connections each send 2,000 streams with wrong passwords and reset them at once, a
//     burst every 5 seconds;
//   - HTTP/1.1: 200 clients, each from its own loopback address, ask with a new wrong password as fast as answered.
//
// At least 99% of Prometheus's scrapes must succeed, with a p99 latency of at most 2 s.
func TestSoakAuthFloods(t *testing.T) {
	duration := soakDuration(t)
	binary, base := authExporter(t)
	floods := []struct {
		name  string
		flood func(ctx context.Context, t *testing.T, addr string) string
	}{
		{"http2-rapid-reset", func(ctx context.Context, t *testing.T, addr string) string {
			var seq atomic.Int64
			var refused, failed, bursts atomic.Int64
			for ctx.Err() == nil {
				var wg sync.WaitGroup
				for range 20 {
					wg.Go(func() {
						r, err := h2Reset(addr, 2000, &seq)
						if r {
							refused.Add(1)
						}
						if err != nil {
							failed.Add(1)
						}
					})
				}
				wg.Wait()
				bursts.Add(1)
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
				}
			}
			return fmt.Sprintf("%d bursts: %d streams sent and reset, %d connections refused HTTP/2, %d failed",
				bursts.Load(), seq.Load(), refused.Load(), failed.Load())
		}},
		{"http1-wrong-passwords", func(ctx context.Context, t *testing.T, addr string) string {
			var seq, answers atomic.Int64
			var wg sync.WaitGroup
			for i := range 200 {
				wg.Go(func() { h1Guess(ctx, addr, fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250), &seq, &answers) })
			}
			wg.Wait()
			return fmt.Sprintf("200 clients: %d wrong passwords sent, %d answered", seq.Load(), answers.Load())
		}},
	}
	for _, http2On := range []bool{false, true} {
		for _, f := range floods {
			t.Run(fmt.Sprintf("%s/http2=%v", f.name, http2On), func(t *testing.T) {
				cfg := base
				if http2On {
					cfg += "http_server_config:\n  http2: true\n"
				}
				webCfg := filepath.Join(t.TempDir(), "web.yml")
				if err := os.WriteFile(webCfg, []byte(cfg), 0o600); err != nil {
					t.Fatal(err)
				}
				e := e2eutil.StartExporter(t, binary, "--demo", "--web.config.file="+webCfg)
				prom := newAuthScraper(e.Addr)
				testkit.WaitFor(t, 30*time.Second, "an authenticated scrape", func() bool { return prom.scrape() == nil })

				ctx, stop := context.WithTimeout(context.Background(), duration)
				defer stop()
				cpu := cpuSeconds(t, e.Pid)
				summary := make(chan string, 1)
				go func() { summary <- f.flood(ctx, t, e.Addr) }()
				var res scrapeResults
				tick := time.NewTicker(500 * time.Millisecond)
				for ctx.Err() == nil {
					start := time.Now()
					err := prom.scrape()
					res.add(time.Since(start), err)
					select {
					case <-ctx.Done():
					case <-tick.C:
					}
				}
				tick.Stop()
				flood := <-summary
				n, failed, p99 := res.summary()
				refused, err := prom.refusals()
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s over %v; exporter CPU %.1f s; Prometheus: %d of %d scrapes failed (%.1f%%), p99 %v; first failure: %s; "+
					"password checks refused (429): %v",
					flood, duration, cpuSeconds(t, e.Pid)-cpu, failed, n, 100*float64(failed)/float64(max(n, 1)),
					p99.Round(time.Millisecond), res.firstErr, refused)
				if strings.HasPrefix(f.name, "http1") && refused["client"]+refused["busy"] == 0 {
					t.Errorf("no password check refused under the flood (gpu_pod_exporter_basic_auth_refused_total %v)", refused)
				}
				if n == 0 || float64(failed) > 0.01*float64(n) {
					t.Errorf("%d of %d authenticated scrapes failed, want at most 1%%", failed, n)
				}
				if p99 > 2*time.Second {
					t.Errorf("p99 of authenticated scrapes %v, want at most 2 s", p99)
				}
			})
		}
	}
}

// restartScrapes are one scraper's scrapes across a restart: those of the first exporter, those that found
// nothing listening, and those of the new exporter, with the outcomes of each exporter's in order.
type restartScrapes struct {
	before, after                 scrapeResults
	down                          int
	beforeOutcomes, afterOutcomes []string
}

// run scrapes every half second until ctx ends; a scrape that begins once restarted is set is the new exporter's.
func (r *restartScrapes) run(ctx context.Context, p *authScraper, restarted *atomic.Bool) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		after := restarted.Load()
		begin := time.Now()
		err := p.scrape()
		took := time.Since(begin)
		outcome := "ok"
		if err != nil {
			outcome = err.Error()[max(0, len(err.Error())-40):] // what went wrong, after the request's URL
		}
		var dial *net.OpError
		switch {
		case errors.As(err, &dial) && dial.Op == "dial":
			r.down++ // the first exporter has closed its listener, or the new one does not listen yet
		case !after:
			r.beforeOutcomes = append(r.beforeOutcomes, outcome)
			r.before.add(took, err)
		default:
			r.afterOutcomes = append(r.afterOutcomes, outcome)
			r.after.add(took, err)
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// failures are the failed scrapes among outcomes, by their place in it (0 is the first).
func failures(outcomes []string) map[int]string {
	f := map[int]string{}
	for i, o := range outcomes {
		if o != "ok" {
			f[i] = o
		}
	}
	return f
}

// TestSoakAuthFloodAcrossRestart: an exporter with TLS and bcrypt basic auth is flooded with wrong passwords from 200
// loopback addresses, each asking again as soon as it is answered, while two scrapers scrape it every half second:
// Prometheus from an address of its own, and an agent with a user of its own from the first flooding address (NAT,
// a shared egress, the same node). A third of the way through, the exporter is restarted; the flood, already
// running, reaches the new exporter with the scrapers, and no password is remembered yet. A scraper's first scrape
// of the new exporter is a first attempt among the flood's, which no exporter can tell from them; one from an
// address of its own waits for its check wherever it comes in their burst, so at least 99% of Prometheus's scrapes
// must succeed from the first. The agent's first scrape is refused while its address's own flood has a first
// attempt in flight: one address, one check of a kind at a time, and the exporter cannot tell the agent from its
// flooding neighbour until the agent asks again on its connection; so at least 99% of its scrapes must succeed from
// its second.
func TestSoakAuthFloodAcrossRestart(t *testing.T) {
	duration := soakDuration(t)
	binary, cfg := authExporter(t)
	webCfg := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(webCfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := e2eutil.FreeAddr(t)
	start := func() *e2eutil.Process {
		return e2eutil.Start(t, exec.Command(binary, "--web.listen-address="+addr, "--demo", "--web.config.file="+webCfg))
	}
	first := start()
	e2eutil.WaitListening(t, first, addr, 30*time.Second)

	ctx, stop := context.WithTimeout(context.Background(), duration)
	defer stop()
	var seq, answers atomic.Int64
	var flood sync.WaitGroup
	floodAddr := func(i int) string { return fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250) }
	for i := range 200 {
		flood.Go(func() { h1Guess(ctx, addr, floodAddr(i), &seq, &answers) })
	}

	scrapers := []struct {
		name            string
		sharesFloodAddr bool
		*authScraper
		restartScrapes
	}{
		{name: "Prometheus", authScraper: newAuthScraper(addr)},
		{name: "the agent sharing " + floodAddr(0), sharesFloodAddr: true,
			authScraper: newScraperFrom(addr, floodAddr(0), "agent", "an0ther")},
	}
	var restarted atomic.Bool
	var scraping sync.WaitGroup
	for i := range scrapers {
		scraping.Go(func() { scrapers[i].run(ctx, scrapers[i].authScraper, &restarted) })
	}
	select {
	case <-ctx.Done():
		t.Fatal("the soak ended before the restart")
	case <-time.After(duration / 3):
	}
	syscall.Kill(first.Pid, syscall.SIGTERM)
	testkit.WaitFor(t, 30*time.Second, "the first exporter to exit", func() bool { done, _ := first.Exited(); return done })
	restarted.Store(true)
	second := start() // the flood and the scrapers find it as it comes up
	scraping.Wait()
	flood.Wait()
	refused, _ := scrapers[0].refusals()
	t.Logf("200 clients sent %d wrong passwords, %d answered, over %v; the new exporter used %.1f s of CPU over %v; "+
		"refused (429) since the restart: %v",
		seq.Load(), answers.Load(), duration, cpuSeconds(t, second.Pid), duration*2/3, refused)
	for i := range scrapers {
		s := &scrapers[i]
		n0, failed0, _ := s.before.summary()
		n, failed, p99 := s.after.summary()
		var first time.Duration
		if n > 0 {
			first = s.after.latencies[0]
		}
		t.Logf("%s: first exporter: %d of %d scrapes failed %v; %d found nothing listening; "+
			"new exporter: %d of %d failed (%.1f%%) %v, the first in %v, p99 %v",
			s.name, failed0, n0, failures(s.beforeOutcomes), s.down, failed, n,
			100*float64(failed)/float64(max(n, 1)), failures(s.afterOutcomes), first.Round(time.Millisecond),
			p99.Round(time.Millisecond))
		from := "first"
		if s.sharesFloodAddr && n > 0 && s.afterOutcomes[0] != "ok" {
			failed, n, from = failed-1, n-1, "second"
		}
		if n == 0 || float64(failed) > 0.01*float64(n) {
			t.Errorf("%s: %d of %d authenticated scrapes of the new exporter from the %s failed, want at most 1%%",
				s.name, failed, n, from)
		}
	}
}
