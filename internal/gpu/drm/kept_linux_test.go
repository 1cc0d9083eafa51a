package drm

import (
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
)

// The files the source keeps open between readings, its sysfs attributes and KFD's files as much as the DRM files'
// fdinfo, take their places in the budget it shares with attribution: however many GPUs and compute processes a
// node has, the source keeps no more files than the budget, and the budget's gauge counts every one.
func TestKeptFilesWithinBudget(t *testing.T) {
	dir, sysfs, procFS := writeNode(t, drmfake.NewMI300X().Node(false))
	for _, n := range []int{0, 10, 4096} {
		budget := procfs.NewKeptFiles(n)
		before := nodeFilesOpen(t, dir)
		src, err := New(Config{SysFS: sysfs, ProcFS: procFS, KeptFiles: budget})
		if err != nil {
			t.Fatal(err)
		}
		for reading := range 2 {
			if _, err := src.Snapshot(t.Context()); err != nil {
				t.Fatal(err)
			}
			kept := nodeFilesOpen(t, dir) - before
			if kept > n || kept != keptGauge(t, budget) {
				t.Errorf("budget %d, reading %d: %d files of the node kept open, the budget counts %d", n, reading,
					kept, keptGauge(t, budget))
			}
			if n == 10 && kept != n {
				t.Errorf("budget %d, reading %d: %d files kept, want the budget used", n, reading, kept)
			}
		}
		if err := src.Close(); err != nil {
			t.Fatal(err)
		}
		if kept := nodeFilesOpen(t, dir) - before; kept != 0 || keptGauge(t, budget) != 0 {
			t.Errorf("budget %d, closed: %d files of the node still open, the budget counts %d", n, kept,
				keptGauge(t, budget))
		}
	}
}

// The exporter's budget of kept files (procfs.KeptFileBudget, under a hard limit that does not bound it) holds what
// a node of 4,096 GPU processes keeps with this source, as it does with the others: the source's files of each
// ROCm process and of the GPUs, and attribution's stat of each process. Past it, each file left out is read by path
// at every reading, five system calls instead of one.
func TestExporterBudgetHoldsManyGPUProcesses(t *testing.T) {
	const gpuProcesses = 4096
	keeps := func(procs int) int {
		_, sysfs, procFS := writeNode(t, computeNode(procs, 0))
		budget := procfs.NewKeptFiles(1 << 20)
		src, err := New(Config{SysFS: sysfs, ProcFS: procFS, KeptFiles: budget})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		for range 2 {
			if _, err := src.Snapshot(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		return keptGauge(t, budget)
	}
	gpus, with64 := keeps(0), keeps(64)
	perProcess := (with64-gpus)/64 + 1 // and attribution's stat
	need := gpus + gpuProcesses*perProcess
	budget, limit := procfs.KeptFileBudget(512)
	t.Logf("%d files for the GPUs, %d a GPU process: %d for %d GPU processes, in a budget of %d", gpus, perProcess,
		need, gpuProcesses, budget)
	if limit > 0 && limit < uint64(need)+1024 { // the connections' 512 and the reserve
		t.Skipf("a hard limit of %d open files bounds the budget (%d) below the %d files wanted", limit, budget, need)
	}
	if budget < need {
		t.Errorf("a budget of %d kept files; %d GPU processes keep %d (%d for the GPUs, %d a process)", budget,
			gpuProcesses, need, gpus, perProcess)
	}
}

// nodeFilesOpen counts this process's open files under dir.
func nodeFilesOpen(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd: ", err)
	}
	n := 0
	for _, e := range entries {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, dir+"/") {
			n++
		}
	}
	return n
}

// keptGauge is a budget's gpu_pod_exporter_attribution_kept_files.
func keptGauge(t *testing.T, k *procfs.KeptFiles) int {
	t.Helper()
	ch := make(chan prometheus.Metric, 2)
	k.Collect(ch)
	close(ch)
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(m.Desc().String(), `"gpu_pod_exporter_attribution_kept_files"`) {
			return int(d.GetGauge().GetValue())
		}
	}
	t.Fatal("no gpu_pod_exporter_attribution_kept_files")
	return 0
}
