//go:build soak

package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// churnNode is a fake node: GPU processes in a fake procfs, each in a new Kubernetes container, listed by a
// simulated node file that is rewritten at each change.
type churnNode struct {
	t              *testing.T
	procfs, config string
	next           uint32
	alive          []churnProc
}

type churnProc struct {
	pid  uint32
	born time.Time
}

func newChurnNode(t *testing.T) *churnNode {
	n := &churnNode{t: t, procfs: t.TempDir(), config: filepath.Join(t.TempDir(), "node.yaml"), next: 1000}
	n.write()
	return n
}

// add starts k processes, each in a container of its own.
func (n *churnNode) add(k int, now time.Time) {
	for range k {
		n.next++
		pid := n.next
		id := fmt.Sprintf("%064x", 0x50a4000000+uint64(pid))
		uid := fmt.Sprintf("%08x_0000_4000_8000_%012x", pid, pid)
		cg := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice/cri-containerd-" + id + ".scope\n"
		if err := e2eutil.WriteProc(n.procfs, pid, "train", cg); err != nil {
			n.t.Fatal(err)
		}
		n.alive = append(n.alive, churnProc{pid, now})
	}
}

// expire ends the processes older than life (all of them for 0).
func (n *churnNode) expire(now time.Time, life time.Duration) {
	for len(n.alive) > 0 && (life == 0 || now.Sub(n.alive[0].born) > life) {
		os.RemoveAll(filepath.Join(n.procfs, strconv.FormatUint(uint64(n.alive[0].pid), 10)))
		n.alive = n.alive[1:]
	}
}

// write lists the live processes in the node file, replaced whole so that the exporter never reads half of it.
func (n *churnNode) write() {
	var b strings.Builder
	b.WriteString("gpus:\n  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f60\n    memory_total_bytes: 85520809984\n    processes:\n")
	if len(n.alive) == 0 {
		b.WriteString("      []\n")
	}
	for _, p := range n.alive {
		fmt.Fprintf(&b, "      - {pid: %d, type: compute, used_memory_bytes: 1048576}\n", p.pid)
	}
	tmp := n.config + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Rename(tmp, n.config); err != nil {
		n.t.Fatal(err)
	}
}

// exporterState is what one scrape of the exporter says about itself.
type exporterState struct {
	pending, goroutines, rss, heap float64
}

func scrapeState(t *testing.T, addr string) exporterState {
	t.Helper()
	_, families := e2eutil.Scrape(t, addr)
	one := func(name string, match func(*dto.Metric) bool) float64 {
		for _, m := range families[name].GetMetric() {
			if match == nil || match(m) {
				return e2eutil.Value(m)
			}
		}
		t.Fatalf("no %s", name)
		return 0
	}
	return exporterState{
		pending: one("gpu_pod_exporter_resolver_cache_entries", func(m *dto.Metric) bool {
			return e2eutil.Label(m, "state") == "pending"
		}),
		goroutines: one("go_goroutines", nil),
		rss:        one("process_resident_memory_bytes", nil),
		heap:       one("go_memstats_heap_inuse_bytes", nil),
	}
}

// TestSoakExporterHungRuntimeDuringChurn is TestSoakHungRuntimeDuringChurn through the real binary, as an operator
// sees it: a simulated node whose file lists 80 new GPU containers a second, a fake procfs, a CRI that never answers
// (and has timed out once before the churn), and a scrape a second. Its figures come from the exporter's own
// metrics.
func TestSoakExporterHungRuntimeDuringChurn(t *testing.T) {
	duration := soakDuration(t)
	binary, err := e2eutil.BuildBinary(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	endpoint := startHungCRI(t)
	node := newChurnNode(t)
	none := filepath.Join(t.TempDir(), "none.sock")
	e := e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+node.config, "--path.procfs="+node.procfs,
		"--runtime.endpoint="+endpoint, "--docker.host=unix://"+none, "--podman.host=unix://"+none)

	// Idle: the runtime connected and known to hang (one lookup that timed out), nothing to name, and the exporter
	// scraped for a while as Prometheus would, so that idle is its steady state, not its first seconds.
	node.add(1, time.Now())
	node.write()
	scrapeState(t, e.Addr) // starts the lookup
	waitFor(t, "the warm-up lookup to time out", func() bool { return scrapeState(t, e.Addr).pending == 0 })
	node.expire(time.Now(), 0)
	node.write()
	var idle exporterState
	for range 10 {
		idle = scrapeState(t, e.Addr)
		time.Sleep(time.Second) // the scrape interval
	}
	t.Logf("idle: %v goroutines, RSS %.1f MB, heap in use %.1f MB", idle.goroutines, idle.rss/1e6, idle.heap/1e6)

	// The churn runs on its own, at its own pace, while the exporter is scraped once a second.
	const perTick, tick, life = 8, 100 * time.Millisecond, time.Second
	stop, churned := make(chan struct{}), make(chan int)
	go func() {
		created := 0
		defer func() { churned <- created }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			now := time.Now()
			node.add(perTick, now)
			created += perTick
			node.expire(now, life)
			node.write()
			time.Sleep(tick - time.Since(now))
		}
	}()
	var peak exporterState
	start := time.Now()
	for time.Since(start) < duration {
		s := scrapeState(t, e.Addr)
		peak = exporterState{max(peak.pending, s.pending), max(peak.goroutines, s.goroutines), max(peak.rss, s.rss),
			max(peak.heap, s.heap)}
		time.Sleep(time.Second) // the scrape interval
	}
	close(stop)
	created := <-churned
	t.Logf("churn: %d containers in %v (%.0f/s); at most %v pending entries, %v goroutines, RSS %.1f MB, heap in use %.1f MB",
		created, duration, float64(created)/duration.Seconds(), peak.pending, peak.goroutines, peak.rss/1e6, peak.heap/1e6)

	node.expire(time.Now(), 0)
	node.write()
	var after exporterState
	settle := time.Now()
	waitFor(t, "the lookups to end and memory to settle", func() bool {
		after = scrapeState(t, e.Addr)
		return after.pending == 0 && after.goroutines <= idle.goroutines && after.rss <= 1.1*idle.rss ||
			time.Since(settle) > 60*time.Second
	})
	t.Logf("after %v: %v pending entries, %v goroutines, RSS %.1f MB (%+.1f%% of idle), heap in use %.1f MB",
		time.Since(settle).Round(time.Second), after.pending, after.goroutines, after.rss/1e6, 100*(after.rss/idle.rss-1), after.heap/1e6)

	if peak.pending > attribution.DefaultMaxPendingLookups {
		t.Errorf("%v pending entries, want at most %d", peak.pending, attribution.DefaultMaxPendingLookups)
	}
	if limit := idle.goroutines + attribution.DefaultMaxPendingLookups; peak.goroutines > limit {
		t.Errorf("%v goroutines, want at most %v", peak.goroutines, limit)
	}
	if after.pending != 0 || after.goroutines > idle.goroutines {
		t.Errorf("after the churn: %v pending entries, %v goroutines (idle %v)", after.pending, after.goroutines, idle.goroutines)
	}
	if after.rss > 1.1*idle.rss {
		t.Errorf("RSS after the churn %.1f MB, more than 10%% over idle %.1f MB", after.rss/1e6, idle.rss/1e6)
	}
}

func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
		return d
	}
	return time.Minute
}
