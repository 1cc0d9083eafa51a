package connlimit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// server is an HTTP server on loopback behind a Limiter.
type server struct {
	lim  *Limiter
	addr string
	log  *testkit.SyncBuffer
	idle atomic.Int32 // the times a connection went idle
}

// serve runs a server behind a Limiter of max connections. /wait says it has started on started, and answers once
// gate closes.
func serve(t *testing.T, max int, started chan<- struct{}, gate <-chan struct{}) *server {
	t.Helper()
	s := &server{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := &testkit.SyncBuffer{}
	lim := New(max, "web", slog.New(slog.NewTextHandler(log, nil)))
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/wait", func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-gate
	})
	srv := &http.Server{Handler: mux, ConnState: func(c net.Conn, state http.ConnState) {
		lim.ConnState(c, state)
		if state == http.StateIdle {
			s.idle.Add(1)
		}
	}}
	go srv.Serve(lim.Listen(ln))
	t.Cleanup(func() { srv.Close() })
	s.lim, s.addr, s.log = lim, ln.Addr().String(), log
	return s
}

// get sends one request on c and reads the answer; the connection stays open (keep-alive).
func get(c net.Conn, path string) error {
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server has closed c: a read ends at once with EOF or a reset.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// At the bound, a new connection is served and the one idle the longest is closed for it.
func TestIdleConnectionsMakeRoom(t *testing.T) {
	s := serve(t, 4, nil, nil)
	lim, addr, log := s.lim, s.addr, s.log
	var old []net.Conn
	for range 4 {
		c := dial(t, addr)
		if err := get(c, "/"); err != nil {
			t.Fatal(err)
		}
		old = append(old, c)
	}
	testkit.WaitFor(t, 10*time.Second, "4 idle connections", func() bool { return s.idle.Load() == 4 })
	for i := range 6 {
		if err := get(dial(t, addr), "/"); err != nil {
			t.Fatalf("new connection %d at the bound: %v", i, err)
		}
		if n := lim.Open(); n > 4 {
			t.Fatalf("%d connections held, bound 4", n)
		}
	}
	for i, c := range old {
		if !closedByServer(c) {
			t.Errorf("idle connection %d still open after 6 new ones at a bound of 4", i)
		}
	}
	if got := strings.Count(log.String(), "connection limit reached"); got != 1 {
		t.Errorf("%d lines saying the limit was reached, want 1:\n%s", got, log)
	}
	checkCounts(t, lim, 6, 0)
}

// checkCounts compares the Limiter's self-metrics with the connections it evicted and refused.
func checkCounts(t *testing.T, lim *Limiter, evicted, refused int) {
	t.Helper()
	want := fmt.Sprintf(`# HELP gpu_pod_exporter_http_connections_evicted_total Idle connections closed to make room for a new one at the connection limit.
# TYPE gpu_pod_exporter_http_connections_evicted_total counter
gpu_pod_exporter_http_connections_evicted_total{listener="web"} %d
# HELP gpu_pod_exporter_http_connections_refused_total New connections closed at once at the connection limit, every connection held being in use.
# TYPE gpu_pod_exporter_http_connections_refused_total counter
gpu_pod_exporter_http_connections_refused_total{listener="web"} %d
`, evicted, refused)
	if err := testutil.CollectAndCompare(lim, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// When every connection held is in use, a new one is refused, and served again once one is free; the limiter says
// when it reached the bound and when it is back under.
func TestBusyConnectionsRefuseNewOnes(t *testing.T) {
	started, gate := make(chan struct{}), make(chan struct{})
	s := serve(t, 3, started, gate)
	lim, addr, log := s.lim, s.addr, s.log
	errc := make(chan error, 3)
	var busy []net.Conn
	for range 3 {
		c := dial(t, addr)
		busy = append(busy, c)
		go func() { errc <- get(c, "/wait") }()
		<-started
	}
	if err := get(dial(t, addr), "/"); err == nil {
		t.Error("a 4th connection was served while 3 of a bound of 3 were in use")
	}
	close(gate)
	for range 3 {
		if err := <-errc; err != nil {
			t.Errorf("a busy connection: %v", err)
		}
	}
	if err := get(dial(t, addr), "/"); err != nil {
		t.Errorf("a new connection once others are free: %v", err)
	}
	for _, c := range busy {
		c.Close()
	}
	testkit.WaitFor(t, 10*time.Second, "the closed connections to be let go", func() bool { return lim.Open() <= 1 })
	out := log.String()
	if strings.Count(out, "connection limit reached") != 1 || strings.Count(out, "back under the connection limit") != 1 ||
		!strings.Contains(out, "refused=1") {
		t.Errorf("want one line at the bound and one, counting 1 refused, back under it; log:\n%s", out)
	}
	checkCounts(t, lim, 1, 1) // the connection after the gate took the place of one idle again

}
