package collector

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/accounting"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/series"
)

// ticking is a GPU that draws 100 W, read every 10 s (of its own clock): each reading is a new one.
type ticking struct {
	mu sync.Mutex
	n  int
}

func (s *ticking) Name() string { return "ticking" }
func (s *ticking) Close() error { return nil }
func (s *ticking) Snapshot(context.Context) (*gpu.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return &gpu.Snapshot{Time: time.Unix(int64(10*s.n), 0), Devices: []gpu.Device{{
		Index: 0, UUID: "GPU-0", PowerUsageWatts: gpu.Known(100), EnergyJoules: gpu.Known(float64(1000 * s.n)), ProcessesListed: true,
		Processes: []gpu.Process{
			{PID: 1, SMUtilizationRatio: gpu.Known(0.6), UsedMemoryBytes: gpu.Known(1 << 30)},
			{PID: 2, SMUtilizationRatio: gpu.Known(0.2), UsedMemoryBytes: gpu.Known(1 << 30)},
		},
	}}}, nil
}

var accountingOwners = fixedOwners{
	1: {Name: "python", Identity: attribution.Identity{Namespace: "a", Pod: "train", User: "alice"}},
	2: {Name: "python", Identity: attribution.Identity{SlurmJobID: "42", User: "bob"}},
}

// Each scrape's reading is accounted once; the series carry the workload's labels, and user with ProcessUser.
func TestAccountingSeries(t *testing.T) {
	reg := registry(t, &ticking{}, accountingOwners, Options{ProcessUser: true})
	for range 3 { // readings at 10, 20, 30 s: two intervals of 1000 J
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP gpu_workload_energy_joules_total The workload's share of the GPU's energy since it arrived on the GPU; with gpu_unattributed_energy_joules_total it adds up to the board's energy.
# TYPE gpu_workload_energy_joules_total counter
gpu_workload_energy_joules_total{container="",gpu="0",namespace="",pod="",pod_uid="",slurm_job_id="42",systemd_unit="",user="bob",uuid="GPU-0"} 750
gpu_workload_energy_joules_total{container="",gpu="0",namespace="a",pod="train",pod_uid="",slurm_job_id="",systemd_unit="",user="alice",uuid="GPU-0"} 2250
# HELP gpu_unattributed_energy_joules_total The GPU's energy that went to no workload since the exporter started: idle time, intervals a workload arrived in, readings without a process list.
# TYPE gpu_unattributed_energy_joules_total counter
gpu_unattributed_energy_joules_total{gpu="0",uuid="GPU-0"} 0
`
	// The 4th reading is the one this gather takes.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_workload_energy_joules_total", "gpu_unattributed_energy_joules_total"); err != nil {
		t.Error(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gpu_workload_sm_seconds_total SM utilization of the workload integrated over time, in GPU-seconds (GPU-hours / 3600).
# TYPE gpu_workload_sm_seconds_total counter
gpu_workload_sm_seconds_total{container="",gpu="0",namespace="",pod="",pod_uid="",slurm_job_id="42",systemd_unit="",user="bob",uuid="GPU-0"} 8
gpu_workload_sm_seconds_total{container="",gpu="0",namespace="a",pod="train",pod_uid="",slurm_job_id="",systemd_unit="",user="alice",uuid="GPU-0"} 24
`), "gpu_workload_sm_seconds_total"); err != nil {
		t.Error(err)
	}
}

// Scrapes that share a reading account it once.
func TestAccountingOncePerReading(t *testing.T) {
	src := &ticking{}
	m := newAccountingMetrics(newPodLabels(nil, false))
	read := func() *reading.Reading {
		snap, _ := src.Snapshot(context.Background())
		return &reading.Reading{Snapshot: snap, Owners: map[uint32]attribution.Owner(accountingOwners)}
	}
	m.update(discard(), read())
	r := read()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { m.update(discard(), r) })
	}
	wg.Wait()
	total := 0.0
	m.ledger.Each(func(g *accounting.GPU) {
		total += g.UnattributedEnergyJoules
		for _, w := range g.Workloads {
			total += w.EnergyJoules
		}
	})
	if total != 1000 {
		t.Errorf("8 scrapes of one 1000 J reading accounted %g J", total)
	}
}

// discard is a batch that refuses every series written to it: no part's family is one of its engine's.
func discard() *series.Batch { return series.NewEngine().Batch() }

// advancing serves the same node at a later time on each reading, so that every scrape is a new reading to account.
type advancing struct {
	mu   sync.Mutex
	snap gpu.Snapshot
}

func (s *advancing) Name() string { return "advancing" }
func (s *advancing) Close() error { return nil }
func (s *advancing) Snapshot(context.Context) (*gpu.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snap.Time = s.snap.Time.Add(15 * time.Second)
	snap := s.snap
	return &snap, nil
}

// BenchmarkCollectEncodeAccounting is BenchmarkCollectEncode with readings that move on, so that the accounting
// part accounts each one: the difference between the two is what accounting costs a scrape.
func BenchmarkCollectEncodeAccounting(b *testing.B) {
	snap, owners := benchNode()
	benchmarkScrape(b, New(reading.New(&advancing{snap: *snap}, owners, time.Minute, slog.New(slog.DiscardHandler)), Options{Processes: true}))
}
