package collector

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/exposition"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// podsNode is one GPU whose processes are each in a pod of the name given.
func podsNode(pods []string) (*gpu.Snapshot, fixedOwners) {
	d := gpu.Device{UUID: "GPU-00000000-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3",
		MemoryTotalBytes: gpu.Known(85520809984), ProcessesListed: true}
	owners := fixedOwners{}
	for i, pod := range pods {
		pid := uint32(1000 + i)
		d.Processes = append(d.Processes, gpu.Process{PID: pid, Type: gpu.ProcessCompute,
			UsedMemoryBytes: gpu.Known(1 << 28), SMUtilizationRatio: gpu.Known(0.5)})
		owners[pid] = attribution.Owner{Name: "python3", Identity: attribution.Identity{Namespace: "ml", Pod: pod,
			Container: "main", PodUID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i)}}
	}
	return &gpu.Snapshot{Devices: []gpu.Device{d}}, owners
}

// Two pods named with a megabyte, alike but for their last byte, as a runtime may name them: the exposition stays
// small, and the pods two series each, their names truncated with a mark.
func TestMegabytePodNames(t *testing.T) {
	long := strings.Repeat("a", 1<<20)
	snap, owners := podsNode([]string{long + "x", long + "y"})
	c := New(reading.New(fixedSource{snap}, owners, time.Minute, slog.New(slog.DiscardHandler)), Options{Processes: true})
	w := httptest.NewRecorder()
	exposition.New(c, slog.New(slog.DiscardHandler)).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := w.Body.String()
	if w.Code != http.StatusOK || len(body) > 64<<10 {
		t.Errorf("HTTP %d, body of %d bytes, want 200 and at most 64 KiB", w.Code, len(body))
	}
	pods := map[string]bool{}
	for line := range strings.Lines(body) {
		if !strings.HasPrefix(line, "gpu_process_memory_used_bytes{") && !strings.HasPrefix(line, "gpu_workload_memory_used_bytes{") {
			continue
		}
		_, rest, _ := strings.Cut(line, `pod="`)
		pod, _, _ := strings.Cut(rest, `"`)
		pods[line[:strings.IndexByte(line, '{')]+" "+pod] = true
		if len(pod) > series.MaxLabelValueBytes || !strings.Contains(pod, "…[truncated ") {
			t.Errorf("pod label of %d bytes: %.60q", len(pod), pod)
		}
	}
	if len(pods) != 4 {
		t.Errorf("%d series of the two pods in two families, want 4", len(pods))
	}
}

// A family with more series than the cap is served with the cap, and a self-metric counts the others by family, in
// the gathering it left them out of.
func TestSeriesOverTheCapAreCounted(t *testing.T) {
	const over = 100
	pods := make([]string, series.MaxSeriesPerFamily+over)
	for i := range pods {
		pods[i] = fmt.Sprintf("pod-%d", i)
	}
	snap, owners := podsNode(pods)
	reg := registry(t, fixedSource{snap}, owners, Options{Processes: true})
	for round := 1; round <= 2; round++ {
		mfs, err := reg.Gather()
		if err == nil || !strings.Contains(err.Error(), "gpu_process_memory_used_bytes: more than") {
			t.Errorf("error %v, want the families over the cap named", err)
		}
		dropped := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() == "gpu_pod_exporter_series_dropped_total" {
				for _, m := range mf.GetMetric() {
					dropped[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
				}
			}
			if n := len(mf.GetMetric()); n > series.MaxSeriesPerFamily {
				t.Errorf("%s: %d series", mf.GetName(), n)
			}
		}
		want := map[string]float64{}
		for _, name := range []string{"gpu_process_memory_used_bytes", "gpu_process_sm_utilization_ratio",
			"gpu_workload_memory_used_bytes", "gpu_workload_sm_utilization_ratio", "gpu_workload_processes"} {
			want[name] = float64(over * round)
		}
		if fmt.Sprint(dropped) != fmt.Sprint(want) {
			t.Errorf("round %d: dropped %v, want %v", round, dropped, want)
		}
	}
}
