package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/promapi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// fleetAnswers are the API's answers for a fleet of nodes of 8 GPUs with 4 pods each, as Prometheus writes them,
// by query.
func fleetAnswers(r *Reader, nodes int) map[string][]byte {
	type sample struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	type series struct {
		Metric map[string]string `json:"metric"`
		Values [][2]any          `json:"values"`
	}
	results := make([][]sample, nQueries)
	ranges := make([][]series, nQueries)
	add := func(q int, v float64, labels map[string]string) {
		results[q] = append(results[q], sample{labels, [2]any{now, fmt.Sprint(v)}})
	}
	addRange := func(q int, v float64, labels map[string]string) {
		s := series{Metric: labels}
		for i := range view.HistoryPoints {
			s.Values = append(s.Values, [2]any{now - float64(view.HistoryPoints-1-i)*10, fmt.Sprint(v)})
		}
		ranges[q] = append(ranges[q], s)
	}
	for n := range nodes {
		node := fmt.Sprintf("gpu-node-%04d", n)
		target := map[string]string{"instance": node, "job": "gpu-pod-exporter"}
		add(qLastReading, now-5, map[string]string{"instance": node})
		add(qTargets, 1, map[string]string{"__name__": "up", "instance": node, "job": "gpu-pod-exporter"})
		add(qIntervals, 40, target)
		add(qExporters, 1, map[string]string{"__name__": "gpu_pod_exporter_source_up", "instance": node})
		add(qExporters, 0, map[string]string{"__name__": "gpu_pod_exporter_kubelet_unmapped_devices", "instance": node})
		for g := range 8 {
			uuid := fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", n, g)
			add(qGPUs, 1, map[string]string{"__name__": "gpu_info", "instance": node, "job": "gpu-pod-exporter", "gpu": fmt.Sprint(g),
				"uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": fmt.Sprintf("00000000:%02X:00.0", 0x18+16*g),
				"driver_version": "580.95.05", "cuda_version": "13.0", "mig_mode": "disabled"})
			for _, f := range []family{utilization, memoryUsed, memoryTotal, temperature, power, workloads} {
				add(qGPUReadings, 0.5, map[string]string{"__name__": f.Name, "instance": node, "uuid": uuid})
			}
			addRange(qUtilizationHistory, 0.5, map[string]string{"instance": node, "uuid": uuid})
			addRange(qMemoryHistory, 0.5, map[string]string{"instance": node, "uuid": uuid})
			add(qAllocatedPods, 4, map[string]string{"instance": node, "uuid": uuid})
			for p := range 4 {
				i := (n*8+g)*4 + p
				pid := fmt.Sprint(5_000_000 + i)
				add(qProcessMemory, float64(p+1)*(1<<30), map[string]string{"__name__": "gpu_process_memory_used_bytes",
					"instance": node, "job": "gpu-pod-exporter", "gpu": fmt.Sprint(g), "uuid": uuid, "pid": pid,
					"process_name": "python3", "process_type": "compute", "namespace": fmt.Sprintf("team-%02d", i%20),
					"pod": fmt.Sprintf("job-%06d-0", i), "container": "worker", "pod_uid": fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i),
					"container_id": fmt.Sprintf("%064x", i)})
				add(qProcessSM, 0.05, map[string]string{"instance": node, "uuid": uuid, "pid": pid})
			}
		}
	}
	bodies := make(map[string][]byte)
	for q := range nQueries {
		data := map[string]any{"resultType": "vector", "result": append([]sample{}, results[q]...)}
		if queries[q].history {
			data = map[string]any{"resultType": "matrix", "result": append([]series{}, ranges[q]...)}
		}
		body, err := json.Marshal(map[string]any{"status": "success", "data": data})
		if err != nil {
			panic(err)
		}
		bodies[r.Expr(q)] = body
	}
	return bodies
}

// BenchmarkRead1000Nodes is one reading of 1,000 nodes (32,000 processes) through the HTTP API, with the answers
// served from memory: what the reader itself costs, without Prometheus. heap-MiB is the live heap once the reading
// is done and kept.
func BenchmarkRead1000Nodes(b *testing.B) {
	for _, forTop := range []bool{false, true} {
		name := "ps"
		if forTop {
			name = "top"
		}
		b.Run(name, func(b *testing.B) {
			bodies := fleetAnswers(New(nil, Config{}), 1000)
			size := 0
			for _, expr := range New(nil, Config{}).Queries(forTop) {
				size += len(bodies[expr])
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.ParseForm()
				body, ok := bodies[r.Form.Get("query")]
				if !ok {
					http.Error(w, "unknown query", http.StatusBadRequest)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.Write(body)
			}))
			defer srv.Close()
			client, err := promapi.New(srv.URL, http.DefaultClient)
			if err != nil {
				b.Fatal(err)
			}
			r := New(client, Config{})
			b.SetBytes(int64(size))
			b.ResetTimer()
			var heap float64
			for b.Loop() {
				c, err := r.Read(context.Background(), What{Top: forTop})
				if err != nil {
					b.Fatal(err)
				}
				if len(c.Processes) != 32000 || len(c.Nodes) != 1000 {
					b.Fatalf("%d rows, %d nodes", len(c.Processes), len(c.Nodes))
				}
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				heap = float64(ms.HeapAlloc) / (1 << 20)
				runtime.KeepAlive(c)
			}
			b.ReportMetric(heap, "heap-MiB")
		})
	}
}

// The benchmark's answers are what the reader expects: it reads them all.
func TestFleetAnswers(t *testing.T) {
	bodies := fleetAnswers(New(nil, Config{}), 3)
	f := newFake(Config{})
	for expr, body := range bodies {
		for q := range nQueries {
			if f.r.Expr(q) != expr {
				continue
			}
			var resp struct {
				Data struct {
					Result []struct {
						Metric map[string]string `json:"metric"`
						Value  [2]any            `json:"value"`
						Values [][2]any          `json:"values"`
					} `json:"result"`
				} `json:"data"`
			}
			if err := json.NewDecoder(bytes.NewReader(body)).Decode(&resp); err != nil {
				t.Fatal(err)
			}
			for _, s := range resp.Data.Result {
				for _, p := range append(s.Values, s.Value) {
					if p[1] == nil {
						continue
					}
					var v float64
					fmt.Sscan(p[1].(string), &v)
					f.answers[q] = append(f.answers[q], promapi.Sample{Metric: s.Metric, Value: v, Time: p[0].(float64)})
				}
			}
		}
	}
	f.r.now = func() time.Time { return time.Unix(now, 0) }
	c, err := f.r.Read(context.Background(), What{Top: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Processes) != 96 || len(c.GPUs) != 24 || len(c.Nodes) != 3 || !c.Processes[0].SM.Valid {
		t.Errorf("%d rows, %d GPUs, %d nodes", len(c.Processes), len(c.GPUs), len(c.Nodes))
	}
	if c.History == nil || len(c.History.GPUs) != 24 || slices.Contains(c.History.GPUs[view.GPUKey("gpu-node-0000", c.GPUs[0].UUID)].Utilization, math.NaN()) {
		t.Errorf("history %+v", c.History)
	}
	for _, n := range c.Nodes {
		if n.State != 0 || !strings.HasPrefix(n.Name, "gpu-node-") || n.Age != 5*time.Second {
			t.Errorf("node %+v", n)
		}
	}
}
