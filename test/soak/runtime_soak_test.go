//go:build soak

package soak

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime/cri"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
)

// hungCRIEnv makes the test binary a CRI server whose calls never return, on the socket it names. It runs in a
// process of its own, so that its goroutines (one per hung call) do not count in the exporter's.
const hungCRIEnv = "SOAK_HUNG_CRI_SOCKET"

func TestMain(m *testing.M) {
	if path := os.Getenv(hungCRIEnv); path != "" {
		serveHungCRI(path)
		return
	}
	os.Exit(m.Run())
}

// hungCRI answers no call: each waits until the client gives up.
type hungCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (hungCRI) Version(ctx context.Context, _ *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hungCRI) ContainerStatus(ctx context.Context, _ *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hungCRI) PodSandboxStatus(ctx context.Context, _ *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hungCRI) ListPodSandbox(ctx context.Context, _ *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func serveHungCRI(path string) {
	lis, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, hungCRI{})
	srv.Serve(lis)
}

// startHungCRI runs the hung CRI in a child process and returns its endpoint.
func startHungCRI(t *testing.T) string {
	t.Helper()
	path := filepath.Join(testkit.SocketDir(t), "cri.sock")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), hungCRIEnv+"="+path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	testkit.WaitFor(t, 30*time.Second, "the hung CRI to listen", func() bool {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return "unix://" + path
}

// rssBytes is this process's resident set size.
func rssBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// pendingEntries reads gpu_pod_exporter_resolver_cache_entries{state="pending"}.
func pendingEntries(t *testing.T, a *attribution.Attributor) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpu_pod_exporter_resolver_cache_entries" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if e2eutil.Label(m, "state") == "pending" {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatal("no cache_entries{state=pending}")
	return 0
}

// TestSoakHungRuntimeDuringChurn: a CRI whose calls never return, while 80 new GPU containers a second come and
// go (each lives a second) for SOAK_DURATION (default 1m), attributed once a second as scrapes do. The runtime
// hangs from the start of the churn, with no timeout seen before. Lookups in flight, goroutines and memory must
// stay bounded, and come back to idle once the churn stops.
func TestSoakHungRuntimeDuringChurn(t *testing.T) {
	duration := soakDuration(t)
	const perTick, tick, life = 8, 100 * time.Millisecond, time.Second // 80 containers a second
	endpoint := startHungCRI(t)
	procfs := t.TempDir()
	criResolver, err := cri.New(cri.Config{Endpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	a := attribution.New(attribution.Config{ProcFS: procfs, Resolvers: []runtime.Resolver{criResolver}})
	defer a.Close()
	defer criResolver.Close()

	snapshot := func(pids []uint32) *gpu.Snapshot {
		d := gpu.Device{UUID: "GPU-0", ProcessesListed: true}
		for _, pid := range pids {
			d.Processes = append(d.Processes, gpu.Process{PID: pid, Type: gpu.ProcessCompute})
		}
		return &gpu.Snapshot{Devices: []gpu.Device{d}}
	}
	scrape := func(pids []uint32) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a.Attribute(ctx, snapshot(pids))
	}

	// Idle: the runtime connected (one call of the resolver's own, which times out: the attributor has not seen
	// the runtime hang yet, so the churn starts cold), nothing to name.
	warm, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if _, err := criResolver.Resolve(warm, fmt.Sprintf("%064x", 999)); err == nil {
		t.Fatal("the hung CRI answered")
	}
	cancel()
	scrape(nil)
	idleGoroutines, idleRSS, idleReleased := measure(t)
	t.Logf("idle: %d goroutines, RSS %.1f MB (%.1f MB once the Go runtime returns free memory)",
		idleGoroutines, mb(idleRSS), mb(idleReleased))

	type proc struct {
		pid  uint32
		born time.Time
	}
	var (
		mu    sync.Mutex
		alive []proc
	)
	// The churn runs on its own, at its own pace, while attributions run once a second as scrapes do.
	stop, churned := make(chan struct{}), make(chan int)
	go func() {
		next, created := uint32(1000), 0
		defer func() { churned <- created }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			now := time.Now()
			var born []proc
			for range perTick {
				next++
				id := fmt.Sprintf("%064x", 0x50a4000000+uint64(next))
				uid := fmt.Sprintf("%08x_0000_4000_8000_%012x", next, next)
				cg := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice/cri-containerd-" + id + ".scope\n"
				if err := e2eutil.WriteProc(procfs, next, "train", cg); err != nil {
					panic(err)
				}
				born = append(born, proc{next, now})
				created++
			}
			mu.Lock()
			alive = append(alive, born...)
			var gone []proc
			for len(alive) > 0 && now.Sub(alive[0].born) > life {
				gone, alive = append(gone, alive[0]), alive[1:]
			}
			mu.Unlock()
			for _, p := range gone {
				os.RemoveAll(filepath.Join(procfs, strconv.FormatUint(uint64(p.pid), 10)))
			}
			time.Sleep(tick - time.Since(now))
		}
	}()
	maxPending, lastPending, maxGoroutines, maxRSS := 0.0, 0.0, 0, int64(0)
	start := time.Now()
	for time.Since(start) < duration {
		mu.Lock()
		pids := make([]uint32, len(alive))
		for i, p := range alive {
			pids[i] = p.pid
		}
		mu.Unlock()
		scrape(pids)
		lastPending = pendingEntries(t, a)
		maxPending = max(maxPending, lastPending)
		maxGoroutines = max(maxGoroutines, goruntime.NumGoroutine())
		maxRSS = max(maxRSS, rssBytes(t))
		time.Sleep(time.Second) // the scrape interval
	}
	close(stop)
	created := <-churned
	t.Logf("churn: %d containers in %v (%.0f/s); at most %v pending entries (%v at the last scrape), %d goroutines, RSS %.1f MB",
		created, duration, float64(created)/duration.Seconds(), maxPending, lastPending, maxGoroutines, mb(maxRSS))

	// The churn stops: every container is gone.
	for _, p := range alive {
		os.RemoveAll(filepath.Join(procfs, strconv.FormatUint(uint64(p.pid), 10)))
	}
	scrape(nil)
	waitFor(t, "the lookups to end", func() bool {
		return pendingEntries(t, a) == 0 && goruntime.NumGoroutine() <= idleGoroutines
	})
	goroutines, rss, released := measure(t)
	t.Logf("after: %d goroutines, RSS %.1f MB (%+.1f%% of idle); %.1f MB (%+.1f%%) once the Go runtime returns free memory",
		goroutines, mb(rss), pct(rss, idleRSS), mb(released), pct(released, idleReleased))

	if maxPending > attribution.DefaultMaxPendingLookups {
		t.Errorf("%v pending entries, want at most %d", maxPending, attribution.DefaultMaxPendingLookups)
	}
	if limit := idleGoroutines + attribution.DefaultMaxPendingLookups; maxGoroutines > limit {
		t.Errorf("%d goroutines, want at most %d", maxGoroutines, limit)
	}
	// Memory that the heap no longer uses is returned to the system by the Go runtime in its own time; what is
	// compared is what the process still holds once it has.
	if pct(released, idleReleased) > 10 {
		t.Errorf("RSS after the churn %.1f MB, more than 10%% over idle %.1f MB", mb(released), mb(idleReleased))
	}
}

// measure returns the goroutines, the RSS after a GC, and the RSS once the Go runtime has returned free memory.
func measure(t *testing.T) (goroutines int, rss, released int64) {
	goruntime.GC()
	goroutines, rss = goruntime.NumGoroutine(), rssBytes(t)
	debug.FreeOSMemory()
	return goroutines, rss, rssBytes(t)
}

func mb(b int64) float64 { return float64(b) / 1e6 }

func pct(v, base int64) float64 { return 100 * (float64(v)/float64(base) - 1) }

// waitFor polls cond for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, time.Minute, what, cond)
}
