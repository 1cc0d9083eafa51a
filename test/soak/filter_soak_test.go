//go:build soak

package soak

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// podNode writes a simulated node of gpus x perGPU processes, each in a pod of its own, so that process and workload
// series carry every identity label: 4,000 processes make an exposition of about 14 MB.
func podNode(t *testing.T, gpus, perGPU int) string {
	var b strings.Builder
	b.WriteString("gpus:\n")
	pid := 100000
	for g := range gpus {
		fmt.Fprintf(&b, "  - uuid: GPU-5c1f2a3e-0d4b-4c8e-9a7f-1b2c3d4e5f%02x\n    memory_total_bytes: 85520809984\n    processes:\n", g)
		for range perGPU {
			pid++
			fmt.Fprintf(&b, "      - {pid: %d, type: compute, used_memory_bytes: 1048576, sm_utilization_ratio: 0.01, "+
				"memory_utilization_ratio: 0.02, encoder_utilization_ratio: 0, decoder_utilization_ratio: 0, identity: "+
				"{namespace: team-%d, pod: trainer-7c9d8b6f4-%d, container: trainer, pod_uid: %08x-a12c-413e-8625-f5c431a14770, "+
				"container_id: %064x, runtime: containerd, qos: guaranteed}}\n", pid, pid%40, pid, pid, pid)
		}
	}
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// peakRSS is the exporter's peak resident memory so far (VmHWM).
func peakRSS(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb * 1024
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// filteredQuery asks for the families that grow with the node's processes, and one per GPU: nearly the whole
// exposition, as a scrape job that splits a node's families between two intervals would.
var filteredQuery = "?" + url.Values{"name[]": {
	"gpu_info", "gpu_process_memory_used_bytes", "gpu_process_sm_utilization_ratio",
	"gpu_process_memory_utilization_ratio", "gpu_process_encoder_utilization_ratio",
	"gpu_process_decoder_utilization_ratio", "gpu_workload_memory_used_bytes", "gpu_workload_sm_utilization_ratio",
	"gpu_workload_processes",
}}.Encode()

// startPodNode starts the exporter on a node of 4,000 processes in pods, scraped a few times as Prometheus would.
func startPodNode(t *testing.T, binary string) (e *e2eutil.Exporter, body int) {
	e = e2eutil.StartExporter(t, binary, "--gpu.simulated-config="+podNode(t, 8, 500), "--path.procfs="+t.TempDir(),
		"--collection.timeout=2s")
	for range 5 {
		b, err := e2eutil.Get("http://" + e.Addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body = len(b)
		time.Sleep(time.Second)
	}
	return e, body
}

// TestSoakConcurrentFilteredScrapes has 100 scrapers ask for most of a 14 MB exposition at once, filtered by name
// (promhttp's name[] parameter), three times over, and compares the exporter's peak memory with the same scrapes
// unfiltered: a filtered scrape must cost no more than an unfiltered one.
func TestSoakConcurrentFilteredScrapes(t *testing.T) {
	binary, err := e2eutil.BuildBinary(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	peak := map[string]float64{}
	for _, query := range []string{"", filteredQuery} {
		kind := map[string]string{"": "unfiltered", filteredQuery: "filtered"}[query]
		t.Run(kind, func(t *testing.T) { // the exporter stops at its end
			e, body := startPodNode(t, binary)
			idle := peakRSS(t, e.Pid)
			var failed int
			var mu sync.Mutex
			for range 3 {
				var wg sync.WaitGroup
				for range 100 {
					wg.Go(func() {
						// Go's client asks for gzip, as Prometheus does, and inflates the body.
						resp, err := http.Get("http://" + e.Addr + "/metrics" + query)
						if err == nil {
							_, err = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if err == nil && resp.StatusCode != http.StatusOK {
								err = fmt.Errorf("HTTP %d", resp.StatusCode)
							}
						}
						if err != nil {
							mu.Lock()
							failed++
							mu.Unlock()
						}
					})
				}
				wg.Wait()
			}
			peak[kind] = peakRSS(t, e.Pid)
			t.Logf("%s: exposition %.1f MB; 3 x 100 concurrent scrapes, %d failed; peak RSS %.1f MB (%.1f MB before)",
				kind, float64(body)/1e6, failed, peak[kind]/1e6, idle/1e6)
			if failed > 0 {
				t.Errorf("%s: %d of 300 scrapes failed", kind, failed)
			}
		})
	}
	if peak["unfiltered"] > 0 && peak["filtered"] > 1.25*peak["unfiltered"] {
		t.Errorf("peak RSS %.1f MB under filtered scrapes, more than a quarter over the %.1f MB of unfiltered ones",
			peak["filtered"]/1e6, peak["unfiltered"]/1e6)
	}
}

// TestSoakFilteredClientsThatNeverRead has 50 clients ask for most of a 14 MB exposition, filtered by name, and
// never read it, twice, 5 s apart; the exporter's heap while they hang on must be no more than under the same
// clients unfiltered.
func TestSoakFilteredClientsThatNeverRead(t *testing.T) {
	binary, err := e2eutil.BuildBinary(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]float64{}
	for _, query := range []string{"", filteredQuery} {
		kind := map[string]string{"": "unfiltered", filteredQuery: "filtered"}[query]
		t.Run(kind, func(t *testing.T) { // the exporter stops at its end
			e, body := startPodNode(t, binary)
			idle := scrapeState(t, e.Addr)
			var stuck []net.Conn
			for wave := range 2 {
				if wave > 0 {
					time.Sleep(5 * time.Second)
				}
				for range 50 {
					c, err := net.Dial("tcp", e.Addr)
					if err != nil {
						t.Fatal(err)
					}
					c.(*net.TCPConn).SetReadBuffer(4096)
					io.WriteString(c, "GET /metrics"+query+" HTTP/1.1\r\nHost: soak\r\n\r\n")
					stuck = append(stuck, c)
				}
			}
			// The heap while they hang on, well within the write deadline (the collection timeout + 30 s), measured by
			// scrapes that read their bodies.
			var heap float64
			for range 10 {
				heap = max(heap, scrapeState(t, e.Addr).heap)
				time.Sleep(time.Second)
			}
			held[kind] = heap
			t.Logf("%s: exposition %.1f MB; 2 x 50 clients that never read: heap in use %.1f MB (idle %.1f MB), RSS %.1f MB",
				kind, float64(body)/1e6, heap/1e6, idle.heap/1e6, scrapeState(t, e.Addr).rss/1e6)
			for _, c := range stuck {
				c.Close()
			}
		})
	}
	if held["unfiltered"] > 0 && held["filtered"] > 1.25*held["unfiltered"] {
		t.Errorf("heap %.1f MB held by filtered clients that never read, more than a quarter over the %.1f MB of unfiltered ones",
			held["filtered"]/1e6, held["unfiltered"]/1e6)
	}
}
