package attribution

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// --- fixtures -------------------------------------------------------------------------------------------------

// cid returns a distinct 64-hex container ID.
func cid(n int) string { return fmt.Sprintf("%064x", 0xc0ffee000+n) }

// puid returns a distinct pod UID.
func puid(n int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", n, n) }

// crioCgroup is the cgroup file of a CRI-O container in a Burstable pod, systemd driver.
func crioCgroup(pod, ctr string) string {
	u := []byte(pod)
	for i, c := range u {
		if c == '-' {
			u[i] = '_'
		}
	}
	return "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + string(u) + ".slice/crio-" + ctr + ".scope\n"
}

// fakeProcFS builds a fake /proc: writeProc adds one process.
type fakeProcFS struct {
	t    testing.TB
	root string
}

func newProcFS(t testing.TB) *fakeProcFS { return &fakeProcFS{t: t, root: t.TempDir()} }

func (p *fakeProcFS) writeProc(pid uint32, comm, cgroup string) {
	p.t.Helper()
	p.writeProcStarted(pid, 4242, comm, cgroup)
}

// writeProcStarted writes a process that started start clock ticks after boot: a PID written again with another
// start time is a new process.
func (p *fakeProcFS) writeProcStarted(pid uint32, start uint64, comm, cgroup string) {
	p.t.Helper()
	dir := filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.t.Fatal(err)
	}
	stat := fmt.Sprintf("%d (%s) S 1 %d %d 0 -1 4194560 100 0 0 0 5 1 0 0 20 0 1 0 %d 1000000 100 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n",
		pid, comm, pid, pid, start)
	for name, content := range map[string]string{"comm": comm + "\n", "stat": stat, "cgroup": cgroup} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			p.t.Fatal(err)
		}
	}
}

// snapshot lists the PIDs on one GPU.
func snapshot(pids ...uint32) *gpu.Snapshot {
	d := gpu.Device{Index: 0, UUID: "GPU-0", ProcessesListed: true}
	for _, pid := range pids {
		d.Processes = append(d.Processes, gpu.Process{PID: pid, Name: "src-" + strconv.Itoa(int(pid)), Type: gpu.ProcessCompute})
	}
	return &gpu.Snapshot{Devices: []gpu.Device{d}}
}

// fakeResolver answers from a map and counts its calls. With gate set, each call waits until the test sends on it
// (or the call's context ends).
type fakeResolver struct {
	name  string
	mu    sync.Mutex
	known map[string]runtime.Container
	err   error // returned for every call when set
	gate  chan struct{}
	calls atomic.Int64
}

func newResolver(name string) *fakeResolver {
	return &fakeResolver{name: name, known: make(map[string]runtime.Container)}
}

func (r *fakeResolver) Name() string { return r.name }

func (r *fakeResolver) Resolve(ctx context.Context, id string) (runtime.Container, error) {
	r.calls.Add(1)
	if r.gate != nil {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return runtime.Container{}, ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return runtime.Container{}, r.err
	}
	c, ok := r.known[id]
	if !ok {
		return runtime.Container{}, runtime.ErrNotFound
	}
	return c, nil
}

func (r *fakeResolver) set(id string, c runtime.Container) {
	r.mu.Lock()
	r.known[id] = c
	r.mu.Unlock()
}

func (r *fakeResolver) setErr(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

// clock is a manual clock for NegativeTTL.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// metricValue gathers the Attributor's metrics through a pedantic registry (which also checks that Describe and
// Collect agree) and returns one sample's value, or -1 when there is no such sample.
func metricValue(t *testing.T, a *Attributor, name string, labels map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(a); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return value(m)
		}
	}
	return -1
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

func newAttributor(t testing.TB, cfg Config) *Attributor {
	a := New(cfg)
	t.Cleanup(func() { a.Close() })
	return a
}

// --- tests ----------------------------------------------------------------------------------------------------

func TestAttributeKubernetesColdThenWarm(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(100, "python3", crioCgroup(puid(1), cid(1)))
	p.writeProc(101, "python3", crioCgroup(puid(1), cid(1))) // second process of the same container
	p.writeProc(200, "trainer", crioCgroup(puid(2), cid(2)))
	cri := newResolver("cri")
	cri.set(cid(1), runtime.Container{Namespace: "ml", Pod: "jupyter-0", PodUID: puid(1), Name: "notebook"})
	cri.set(cid(2), runtime.Container{Namespace: "ml", Pod: "train-abc", PodUID: puid(2), Name: "trainer"})
	docker := newResolver("docker")
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{docker, cri}, LookupBudget: time.Minute})

	owners := a.Attribute(t.Context(), snapshot(100, 101, 200))
	want := Owner{Name: "python3", Identity: Identity{
		Namespace: "ml", Pod: "jupyter-0", Container: "notebook", PodUID: puid(1), ContainerID: cid(1),
		Runtime: "crio", QoS: "burstable",
	}}
	if got := owners[100]; !ownerEqual(got, want) {
		t.Errorf("pid 100:\n got %+v\nwant %+v", got, want)
	}
	if got := owners[101]; !ownerEqual(got, want) {
		t.Errorf("pid 101:\n got %+v\nwant %+v", got, want)
	}
	if got := owners[200].Identity.Pod; got != "train-abc" {
		t.Errorf("pid 200 pod = %q", got)
	}
	if n := cri.calls.Load(); n != 2 {
		t.Errorf("cold scrape: %d CRI calls, want 2 (one per container)", n)
	}
	if n := docker.calls.Load(); n != 0 {
		t.Errorf("a CRI-O container was looked up in Docker (%d calls)", n)
	}

	for range 3 {
		owners = a.Attribute(t.Context(), snapshot(100, 101, 200))
	}
	if n := cri.calls.Load(); n != 2 {
		t.Errorf("warm scrapes made %d more runtime calls, want 0", n-2)
	}
	if got := owners[100]; !ownerEqual(got, want) {
		t.Errorf("warm pid 100:\n got %+v\nwant %+v", got, want)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_requests_total", map[string]string{"resolver": "cri", "result": "success"}); v != 2 {
		t.Errorf("requests_total{cri,success} = %v, want 2", v)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_cache_entries", map[string]string{"state": "resolved"}); v != 2 {
		t.Errorf("cache_entries{resolved} = %v, want 2", v)
	}
}

func ownerEqual(a, b Owner) bool {
	if a.Name != b.Name || a.Identity.Key() != b.Identity.Key() || a.Identity.Runtime != b.Identity.Runtime ||
		a.Identity.QoS != b.Identity.QoS || len(a.Identity.PodLabels) != len(b.Identity.PodLabels) {
		return false
	}
	for k, v := range a.Identity.PodLabels {
		if b.Identity.PodLabels[k] != v {
			return false
		}
	}
	return true
}

func TestAttributeNonContainerOwners(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "ollama", "0::/system.slice/ollama.service\n")
	p.writeProc(2, "lmp", "0::/system.slice/slurmstepd.scope/job_211/step_0/user/task_0\n")
	r := newResolver("cri")
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{r}})
	owners := a.Attribute(t.Context(), snapshot(1, 2))
	if got := owners[1]; got.Name != "ollama" || got.Identity.SystemdUnit != "ollama.service" {
		t.Errorf("service: %+v", got)
	}
	if got := owners[2]; got.Name != "lmp" || got.Identity.SlurmJobID != "211" || got.Identity.SystemdUnit != "" {
		t.Errorf("slurm: %+v", got)
	}
	if n := r.calls.Load(); n != 0 {
		t.Errorf("%d runtime calls for processes in no container", n)
	}
}

func TestNegativeCacheTTL(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(7, "x", "0::/system.slice/docker-"+cid(7)+".scope\n")
	docker := newResolver("docker")
	clk := newClock()
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{docker}, NegativeTTL: 30 * time.Second, Now: clk.Now, LookupBudget: time.Minute})

	owners := a.Attribute(t.Context(), snapshot(7))
	if got := owners[7].Identity; got.ContainerID != cid(7) || got.Runtime != "docker" || got.Container != "" {
		t.Errorf("unknown container: %+v", got)
	}
	clk.Advance(29 * time.Second)
	a.Attribute(t.Context(), snapshot(7))
	if n := docker.calls.Load(); n != 1 {
		t.Fatalf("within the TTL: %d calls, want 1", n)
	}

	docker.set(cid(7), runtime.Container{Name: "jupyter"})
	clk.Advance(2 * time.Second)
	owners = a.Attribute(t.Context(), snapshot(7))
	if n := docker.calls.Load(); n != 2 {
		t.Errorf("after the TTL: %d calls, want 2", n)
	}
	if got := owners[7].Identity.Container; got != "jupyter" {
		t.Errorf("after the TTL the name is %q, want jupyter", got)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_requests_total", map[string]string{"resolver": "docker", "result": "not_found"}); v != 1 {
		t.Errorf("requests_total{docker,not_found} = %v, want 1", v)
	}
}

func TestEvictionWhenContainerGone(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "a", crioCgroup(puid(1), cid(1)))
	p.writeProc(2, "b", crioCgroup(puid(2), cid(2)))
	cri := newResolver("cri")
	cri.set(cid(1), runtime.Container{Namespace: "n", Pod: "p1", Name: "c"})
	cri.set(cid(2), runtime.Container{Namespace: "n", Pod: "p2", Name: "c"})
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: time.Minute})

	a.Attribute(t.Context(), snapshot(1, 2))
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_cache_entries", map[string]string{"state": "resolved"}); v != 2 {
		t.Fatalf("cache_entries{resolved} = %v, want 2", v)
	}

	// A device whose process list failed says nothing about container 2: it stays cached.
	incomplete := snapshot(1)
	incomplete.Devices = append(incomplete.Devices, gpu.Device{Index: 1, UUID: "GPU-1", ProcessesListed: false})
	a.Attribute(t.Context(), incomplete)
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_cache_entries", map[string]string{"state": "resolved"}); v != 2 {
		t.Errorf("after an incomplete snapshot cache_entries{resolved} = %v, want 2", v)
	}

	// A complete snapshot without container 2: it is gone.
	a.Attribute(t.Context(), snapshot(1))
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_cache_entries", map[string]string{"state": "resolved"}); v != 1 {
		t.Errorf("after container 2 left, cache_entries{resolved} = %v, want 1", v)
	}
	if n := cri.calls.Load(); n != 2 {
		t.Errorf("%d calls, want 2", n)
	}
	// If it comes back (same ID), it is looked up again.
	a.Attribute(t.Context(), snapshot(1, 2))
	if n := cri.calls.Load(); n != 3 {
		t.Errorf("returning container: %d calls, want 3", n)
	}
}

func TestEvictionWhenSnapshotsStayIncomplete(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "a", crioCgroup(puid(1), cid(1)))
	p.writeProc(2, "b", crioCgroup(puid(2), cid(2)))
	cri := newResolver("cri")
	cri.set(cid(1), runtime.Container{Name: "c1"})
	cri.set(cid(2), runtime.Container{Name: "c2"})
	clk := newClock()
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, Now: clk.Now, LookupBudget: time.Minute})
	a.Attribute(t.Context(), snapshot(1, 2))
	incomplete := snapshot(1)
	incomplete.Devices[0].ProcessesListed = false
	clk.Advance(staleAfter - time.Second)
	a.Attribute(t.Context(), incomplete)
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_cache_entries", map[string]string{"state": "resolved"}); v != 2 {
		t.Errorf("cache_entries{resolved} = %v, want 2", v)
	}
	clk.Advance(2 * time.Second)
	a.Attribute(t.Context(), incomplete)
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_cache_entries", map[string]string{"state": "resolved"}); v != 1 {
		t.Errorf("after staleAfter unseen, cache_entries{resolved} = %v, want 1", v)
	}
}

func TestLookupBudgetWithSlowRuntime(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(5, "slow", crioCgroup(puid(5), cid(5)))
	cri := newResolver("cri")
	cri.gate = make(chan struct{})
	cri.set(cid(5), runtime.Container{Namespace: "n", Pod: "p", Name: "c"})
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: 10 * time.Millisecond, LookupTimeout: time.Hour})

	// The runtime does not answer: the scrape returns at the budget with the cgroup labels.
	owners := a.Attribute(t.Context(), snapshot(5))
	if got := owners[5].Identity; got.ContainerID != cid(5) || got.PodUID != puid(5) || got.Pod != "" {
		t.Errorf("within the budget: %+v, want cgroup labels without names", got)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_attribution_lookup_budget_exceeded_total", nil); v != 1 {
		t.Errorf("budget_exceeded_total = %v, want 1", v)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_cache_entries", map[string]string{"state": "pending"}); v != 1 {
		t.Errorf("cache_entries{pending} = %v, want 1", v)
	}
	// A second scrape while the lookup is in flight does not start another one, even when the container left an
	// incomplete snapshot in between (a complete one cancels it: TestLookupOfGoneContainerIsCancelled).
	incomplete := snapshot()
	incomplete.Devices[0].ProcessesListed = false
	a.Attribute(t.Context(), snapshot(5))
	a.Attribute(t.Context(), incomplete)
	a.Attribute(t.Context(), snapshot(5))
	if n := cri.calls.Load(); n != 1 {
		t.Errorf("%d lookups in flight for one container, want 1", n)
	}

	// The lookup completes in the background and serves the next scrape.
	done := pendingDone(t, a, cid(5))
	cri.gate <- struct{}{}
	<-done
	owners = a.Attribute(t.Context(), snapshot(5))
	if got := owners[5].Identity.Pod; got != "p" {
		t.Errorf("after the background lookup pod = %q, want p", got)
	}
	if n := cri.calls.Load(); n != 1 {
		t.Errorf("%d calls, want 1", n)
	}
}

// pendingDone returns the done channel of the lookup in flight for id.
func pendingDone(t *testing.T, a *Attributor, id string) <-chan struct{} {
	t.Helper()
	a.names.mu.Lock()
	defer a.names.mu.Unlock()
	e := a.names.entries[id]
	if e == nil || !isOpen(e.done) {
		t.Fatalf("no lookup in flight for %s", id)
	}
	return e.done
}

func TestScrapeContextEndsTheWait(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(5, "slow", crioCgroup(puid(5), cid(5)))
	cri := newResolver("cri")
	cri.gate = make(chan struct{}) // never opened: Close ends the call through its context
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: time.Hour, LookupTimeout: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	owners := a.Attribute(ctx, snapshot(5))
	if got := owners[5].Identity.ContainerID; got != cid(5) {
		t.Errorf("container ID %q", got)
	}
}

func TestRuntimeDown(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "a", crioCgroup(puid(1), cid(1)))
	p.writeProc(2, "b", crioCgroup(puid(2), cid(2)))
	cri := newResolver("cri")
	cri.set(cid(1), runtime.Container{Namespace: "n", Pod: "p1", Name: "c1"})
	cri.set(cid(2), runtime.Container{Namespace: "n", Pod: "p2", Name: "c2"})
	cri.setErr(errors.New("connection refused"))
	clk := newClock()
	logs := &testkit.Logs{}
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, NegativeTTL: 10 * time.Second, Now: clk.Now,
		Logger: slog.New(logs), LookupBudget: time.Minute})

	for range 3 {
		owners := a.Attribute(t.Context(), snapshot(1, 2))
		if got := owners[1].Identity; got.ContainerID != cid(1) || got.PodUID != puid(1) || got.QoS != "burstable" || got.Pod != "" {
			t.Fatalf("runtime down: %+v, want the cgroup labels", got)
		}
		clk.Advance(11 * time.Second) // past the TTL: every scrape retries
	}
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_requests_total", map[string]string{"resolver": "cri", "result": "error"}); v != 6 {
		t.Errorf("requests_total{cri,error} = %v, want 6", v)
	}
	if n := logs.Count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings for one outage, want 1", n)
	}

	cri.setErr(nil)
	owners := a.Attribute(t.Context(), snapshot(1, 2))
	if got := owners[2].Identity.Pod; got != "p2" {
		t.Errorf("runtime back: pod = %q, want p2", got)
	}
	if n := logs.Count(slog.LevelInfo); n != 1 {
		t.Errorf("%d info records on recovery, want 1", n)
	}
	if n := logs.Count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings after recovery, want still 1", n)
	}
}

func TestPIDVanished(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "alive", "0::/system.slice/a.service\n")
	logs := &testkit.Logs{}
	a := newAttributor(t, Config{ProcFS: p.root, Logger: slog.New(logs)})
	for range 3 {
		owners := a.Attribute(t.Context(), snapshot(1, 4242))
		got, ok := owners[4242]
		if !ok {
			t.Fatal("the exited PID has no owner")
		}
		if got.Name != "src-4242" || got.Identity.Key() != (WorkloadKey{}) {
			t.Errorf("exited PID: %+v, want the source's name and an empty identity", got)
		}
		if owners[1].Identity.SystemdUnit != "a.service" {
			t.Errorf("live PID: %+v", owners[1])
		}
	}
	if n := logs.CountAtLeast(slog.LevelInfo); n != 0 {
		t.Errorf("%d log records at info or above for an exited process, want 0", n)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_attribution_procfs_errors_total", map[string]string{"reason": "exited"}); v != 3 {
		t.Errorf("procfs_errors_total{exited} = %v, want 3", v)
	}
}

func TestPIDVanishedBetweenReads(t *testing.T) {
	// comm is there but cgroup is not: the process exited between the two reads.
	p := newProcFS(t)
	p.writeProc(9, "short", "")
	if err := os.Remove(filepath.Join(p.root, "9", "cgroup")); err != nil {
		t.Fatal(err)
	}
	a := newAttributor(t, Config{ProcFS: p.root})
	got := a.Attribute(t.Context(), snapshot(9))[9]
	if got.Name != "short" || got.Identity.Key() != (WorkloadKey{}) {
		t.Errorf("%+v", got)
	}
}

func TestProcFSUnreadableLogsOnce(t *testing.T) {
	p := newProcFS(t)
	// A directory where the file should be: reading fails with an error that is not "exited".
	if err := os.MkdirAll(filepath.Join(p.root, "3", "stat"), 0o755); err != nil {
		t.Fatal(err)
	}
	logs := &testkit.Logs{}
	a := newAttributor(t, Config{ProcFS: p.root, Logger: slog.New(logs)})
	for range 3 {
		a.Attribute(t.Context(), snapshot(3))
	}
	if n := logs.Count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings, want 1", n)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_attribution_procfs_errors_total", map[string]string{"reason": "other"}); v != 3 {
		t.Errorf("procfs_errors_total{other} = %v, want 3", v)
	}
}

func TestPodLabelAllowlist(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "a", crioCgroup(puid(1), cid(1)))
	cri := newResolver("cri")
	cri.set(cid(1), runtime.Container{Namespace: "n", Pod: "p", Name: "c", PodLabels: map[string]string{
		"app": "llm", "team": "research", "secret-ish": "x",
	}})
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, PodLabels: []string{"team", "app", "absent"}})
	got := a.Attribute(t.Context(), snapshot(1))[1].Identity.PodLabels
	if len(got) != 2 || got["app"] != "llm" || got["team"] != "research" {
		t.Errorf("pod labels %v, want app and team only", got)
	}

	none := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}})
	if got := none.Attribute(t.Context(), snapshot(1))[1].Identity.PodLabels; got != nil {
		t.Errorf("without an allowlist pod labels are %v, want none", got)
	}
}

type presetOwners map[uint32]Identity

func (p presetOwners) PresetOwners() map[uint32]Identity   { return p }
func (p presetOwners) PresetStarted() map[uint32]time.Time { return nil }

func TestPresetIdentityUntouched(t *testing.T) {
	p := newProcFS(t) // PID 77 is not in it: a preset identity must not touch procfs
	cri := newResolver("cri")
	preset := Identity{Namespace: "demo", Pod: "p", Container: "c", ContainerID: cid(77), PodLabels: map[string]string{"x": "y"}}
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, Preset: presetOwners{77: preset}})
	snap := snapshot(77)
	snap.Devices[0].Processes[0].Name = "sim"
	got := a.Attribute(t.Context(), snap)[77]
	if !ownerEqual(got, Owner{Name: "sim", Identity: preset}) {
		t.Errorf("%+v, want the preset identity", got)
	}
	if n := cri.calls.Load(); n != 0 {
		t.Errorf("%d runtime calls for a preset identity", n)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_attribution_procfs_errors_total", map[string]string{"reason": "exited"}); v != 0 {
		t.Errorf("procfs was read for a preset identity")
	}
}

func TestResolverChains(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "k8s-on-docker", "0::/kubepods.slice/kubepods-pod"+"0000000a_0000_4000_8000_00000000000a"+".slice/docker-"+cid(1)+".scope\n")
	p.writeProc(2, "podman", "0::/machine.slice/libpod-"+cid(2)+".scope/container\n")
	p.writeProc(3, "cgroupfs-pod", "0::/kubepods/pod"+puid(3)+"/"+cid(3)+"\n")
	p.writeProc(4, "unknown", "0::/somewhere/"+cid(4)+"\n")
	cri, docker, podman := newResolver("cri"), newResolver("docker"), newResolver("podman")
	// cri-dockerd: Docker does not know the container under this ID, the CRI does.
	cri.set(cid(1), runtime.Container{Namespace: "n", Pod: "p1", Name: "c1", Runtime: "docker"})
	podman.set(cid(2), runtime.Container{Name: "web", Pod: "mypod", Runtime: "podman"})
	cri.set(cid(3), runtime.Container{Namespace: "n", Pod: "p3", Name: "c3", PodUID: puid(3), Runtime: "containerd"})
	docker.set(cid(4), runtime.Container{Name: "plain", Runtime: "docker"})
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{podman, docker, cri}, LookupBudget: time.Minute})

	owners := a.Attribute(t.Context(), snapshot(1, 2, 3, 4))
	if got := owners[1].Identity; got.Pod != "p1" || got.Runtime != "docker" {
		t.Errorf("docker in a pod: %+v", got)
	}
	if got := owners[2].Identity; got.Container != "web" || got.Pod != "mypod" || got.Namespace != "" {
		t.Errorf("podman: %+v", got)
	}
	if got := owners[3].Identity; got.Pod != "p3" || got.Runtime != "containerd" {
		t.Errorf("cgroupfs pod (no runtime in the path, named by the runtime that answered): %+v", got)
	}
	if got := owners[4].Identity; got.Container != "plain" || got.Runtime != "docker" {
		t.Errorf("unknown runtime: %+v, want named by Docker", got)
	}
	// cid1: docker, cri. cid2: podman only. cid3 (in a pod, runtime unknown): cri first, found.
	// cid4 (no pod, runtime unknown): podman (not found), docker (found).
	if n := podman.calls.Load(); n != 2 {
		t.Errorf("podman: %d calls, want 2", n)
	}
	if n := docker.calls.Load(); n != 2 {
		t.Errorf("docker: %d calls, want 2", n)
	}
	if n := cri.calls.Load(); n != 2 {
		t.Errorf("cri: %d calls, want 2", n)
	}
}

func TestConcurrentAttribute(t *testing.T) {
	p := newProcFS(t)
	var pids []uint32
	cri := newResolver("cri")
	for i := range 16 {
		pid := uint32(1000 + i)
		p.writeProc(pid, "w", crioCgroup(puid(i%4), cid(i%4)))
		cri.set(cid(i%4), runtime.Container{Namespace: "n", Pod: "p" + strconv.Itoa(i%4), Name: "c"})
		pids = append(pids, pid)
	}
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: time.Minute})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			owners := a.Attribute(t.Context(), snapshot(pids...))
			for _, pid := range pids {
				if owners[pid].Identity.Pod == "" {
					t.Errorf("pid %d unnamed", pid)
				}
			}
		})
	}
	wg.Wait()
	if n := cri.calls.Load(); n != 4 {
		t.Errorf("%d calls for 4 containers from 8 concurrent scrapes, want 4", n)
	}
}

func TestCloseStopsBackgroundLookups(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(5, "slow", crioCgroup(puid(5), cid(5)))
	cri := newResolver("cri")
	cri.gate = make(chan struct{}) // never opened
	a := New(Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: time.Millisecond, LookupTimeout: time.Hour})
	a.Attribute(t.Context(), snapshot(5))
	a.Close() // returns only when the lookup has ended through its context
	if got := a.Attribute(t.Context(), snapshot(5))[5].Identity.ContainerID; got != cid(5) {
		t.Errorf("after Close: container ID %q", got)
	}
}

// --- benchmark ------------------------------------------------------------------------------------------------

// BenchmarkAttribute attributes 256 GPU processes in 64 containers: cold (empty cache, every container looked up)
// and warm (steady state). runtime_calls/op is the number of resolver calls per scrape.
func BenchmarkAttribute(b *testing.B) {
	p := newProcFS(b)
	cri := newResolver("cri")
	var pids []uint32
	for i := range 256 {
		pid := uint32(10000 + i)
		c := i % 64
		p.writeProc(pid, "python3", crioCgroup(puid(c), cid(c)))
		cri.set(cid(c), runtime.Container{Namespace: "ml", Pod: "pod-" + strconv.Itoa(c), PodUID: puid(c), Name: "main",
			PodLabels: map[string]string{"app": "train", "team": "x"}})
		pids = append(pids, pid)
	}
	snap := snapshot(pids...)
	cfg := Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, PodLabels: []string{"app"}, LookupBudget: time.Minute}

	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		before := cri.calls.Load()
		for b.Loop() {
			a := New(cfg)
			if got := a.Attribute(b.Context(), snap); got[10000].Identity.Pod != "pod-0" {
				b.Fatalf("unnamed: %+v", got[10000])
			}
			a.Close()
		}
		b.ReportMetric(float64(cri.calls.Load()-before)/float64(b.N), "runtime_calls/op")
	})
	b.Run("warm", func(b *testing.B) {
		a := New(cfg)
		defer a.Close()
		a.Attribute(b.Context(), snap)
		b.ReportAllocs()
		before := cri.calls.Load()
		for b.Loop() {
			if got := a.Attribute(b.Context(), snap); got[10000].Identity.Pod != "pod-0" {
				b.Fatalf("unnamed: %+v", got[10000])
			}
		}
		b.ReportMetric(float64(cri.calls.Load()-before)/float64(b.N), "runtime_calls/op")
	})
}

func TestMetricsLint(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "a", crioCgroup(puid(1), cid(1)))
	cri := newResolver("cri")
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: time.Minute})
	a.Attribute(t.Context(), snapshot(1, 2))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "gpu_pod_exporter_") {
			t.Errorf("%s lacks the gpu_pod_exporter_ prefix", mf.GetName())
		}
	}
}

// In steady state a process costs one procfs read per scrape: its cgroup file is read once for its whole life.
func TestCgroupReadOncePerProcess(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(7, "trainer", "0::/system.slice/a.service\n")
	a := newAttributor(t, Config{ProcFS: p.root})
	if got := a.Attribute(t.Context(), snapshot(7))[7].Identity.SystemdUnit; got != "a.service" {
		t.Fatalf("unit = %q, want a.service", got)
	}
	// The same process (same start time) with its cgroup file gone: the identity stays, from the first read.
	if err := os.Remove(filepath.Join(p.root, "7", "cgroup")); err != nil {
		t.Fatal(err)
	}
	if got := a.Attribute(t.Context(), snapshot(7))[7]; got.Identity.SystemdUnit != "a.service" || got.Name != "trainer" {
		t.Errorf("second scrape: %+v, want a.service from the first read", got)
	}
}

// A PID that the kernel gives to a new process is attributed afresh: the start time tells the two apart.
func TestPIDReuseReadsTheNewProcess(t *testing.T) {
	p := newProcFS(t)
	p.writeProcStarted(7, 100, "old", "0::/system.slice/old.service\n")
	a := newAttributor(t, Config{ProcFS: p.root})
	if got := a.Attribute(t.Context(), snapshot(7))[7].Identity.SystemdUnit; got != "old.service" {
		t.Fatalf("unit = %q, want old.service", got)
	}
	p.writeProcStarted(7, 200, "new", "0::/system.slice/new.service\n")
	if got := a.Attribute(t.Context(), snapshot(7))[7]; got.Identity.SystemdUnit != "new.service" || got.Name != "new" {
		t.Errorf("reused PID: %+v, want new.service and the name new", got)
	}
}

// A process that leaves the GPUs is forgotten at the next reading: the cache holds the node's GPU processes only.
func TestProcessCacheHoldsTheLastReadingOnly(t *testing.T) {
	p := newProcFS(t)
	for pid := uint32(1); pid <= 3; pid++ {
		p.writeProc(pid, "p", "0::/system.slice/a.service\n")
	}
	a := newAttributor(t, Config{ProcFS: p.root})
	a.Attribute(t.Context(), snapshot(1, 2, 3))
	a.Attribute(t.Context(), snapshot(2))
	if n := len(a.procs); n != 1 {
		t.Errorf("%d processes cached after a reading of one, want 1", n)
	}
	if got := a.Attribute(t.Context(), snapshot(1))[1].Identity.SystemdUnit; got != "a.service" {
		t.Errorf("a process back on a GPU: unit %q, want a.service", got)
	}
}

// The steady-state cost of a scrape per process, guarded as allocations rather than time.
func TestAttributeAllocations(t *testing.T) {
	p := newProcFS(t)
	var pids []uint32
	for pid := uint32(1); pid <= 64; pid++ {
		p.writeProc(pid, "python3", crioCgroup(puid(int(pid)), cid(int(pid))))
		pids = append(pids, pid)
	}
	a := newAttributor(t, Config{ProcFS: p.root})
	snap := snapshot(pids...)
	a.Attribute(t.Context(), snap)
	allocs := testing.AllocsPerRun(20, func() { a.Attribute(t.Context(), snap) })
	// Measured: 3.6 per process (the name, the owners and cache maps).
	if perProcess := allocs / 64; perProcess > 5 {
		t.Errorf("%.1f allocations per process per scrape, budget 5", perProcess)
	}
	t.Logf("%.0f allocations for 64 processes", allocs)
}

// The stat files kept open are one per GPU process of the last reading, and closed when the process leaves.
func TestKeptFilesClosedWhenProcessesLeave(t *testing.T) {
	fds := func() int {
		entries, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(entries)
	}
	p := newProcFS(t)
	var pids []uint32
	for pid := uint32(1); pid <= 32; pid++ {
		p.writeProc(pid, "p", "0::/system.slice/a.service\n")
		pids = append(pids, pid)
	}
	before := fds()
	a := newAttributor(t, Config{ProcFS: p.root})
	a.Attribute(t.Context(), snapshot(pids...))
	if n := fds() - before; n != 32 {
		t.Errorf("%d files open for 32 processes, want 32", n)
	}
	a.Attribute(t.Context(), snapshot(pids[:4]...))
	if n := fds() - before; n != 4 {
		t.Errorf("%d files open after 28 processes left, want 4", n)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n := fds() - before; n != 0 {
		t.Errorf("%d files open after Close, want 0", n)
	}
}

// A process whose cgroup file cannot be read keeps no file open: the one opened for it is closed, scrape after
// scrape.
func TestNoFileLeftOpenWhenTheCgroupCannotBeRead(t *testing.T) {
	fds := func() int {
		entries, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(entries)
	}
	p := newProcFS(t)
	p.writeProc(7, "p", "0::/system.slice/a.service\n")
	if err := os.Remove(filepath.Join(p.root, "7", "cgroup")); err != nil {
		t.Fatal(err)
	}
	before := fds()
	a := newAttributor(t, Config{ProcFS: p.root})
	for range 10 {
		a.Attribute(t.Context(), snapshot(7))
	}
	if n := fds() - before; n != 0 {
		t.Errorf("%d files open after 10 scrapes of a process without a cgroup file, want 0", n)
	}
}

// On the real procfs, a process that exits is seen to have exited at the next scrape, though its stat file was
// kept open.
func TestExitSeenThroughKeptFile(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("cannot start sleep:", err)
	}
	pid := uint32(cmd.Process.Pid)
	a := newAttributor(t, Config{ProcFS: "/proc"})
	if got := a.Attribute(t.Context(), snapshot(pid))[pid].Name; got != "sleep" {
		t.Fatalf("name %q, want sleep", got)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if got := a.Attribute(t.Context(), snapshot(pid))[pid]; got.Name != "src-"+strconv.Itoa(int(pid)) {
		t.Errorf("exited process: %+v, want the source's name", got)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_attribution_procfs_errors_total", map[string]string{"reason": "exited"}); v != 1 {
		t.Errorf("procfs_errors_total{exited} = %v, want 1", v)
	}
}

// On the kernel's procfs the file kept for a process is its comm, read at each scrape; elsewhere its stat.
func TestKeptFileIsCommOnProcFS(t *testing.T) {
	if ok, err := procfs.IsProcFS("/proc"); err != nil || !ok {
		t.Skip("no procfs at /proc")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("cannot start sleep:", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	pid := uint32(cmd.Process.Pid)
	kept := func() []string {
		entries, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		var files []string
		for _, e := range entries {
			if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, "/proc/"+strconv.Itoa(int(pid))+"/") {
				files = append(files, target)
			}
		}
		return files
	}
	a := newAttributor(t, Config{ProcFS: "/proc"})
	for range 2 {
		if got := a.Attribute(t.Context(), snapshot(pid))[pid].Name; got != "sleep" {
			t.Fatalf("name %q, want sleep", got)
		}
	}
	if files := kept(); len(files) != 1 || !strings.HasSuffix(files[0], "/comm") {
		t.Errorf("files kept for the process: %v, want its comm", files)
	}
}

// podCachingResolver is a resolver that keeps pods between lookups, as the CRI's does: it records what each
// reading tells it to keep.
type podCachingResolver struct {
	*fakeResolver
	kept []map[string]bool
}

func (r *podCachingResolver) KeepPods(uids map[string]bool) {
	r.kept = append(r.kept, maps.Clone(uids))
}

// A runtime that keeps pods is told, after each complete reading, the pods of its processes, and forgets the
// others; an incomplete reading tells it nothing, since a pod missing from it may still be there.
func TestRuntimesKeepThePodsOfCompleteReadings(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "a", crioCgroup(puid(1), cid(1)))
	p.writeProc(2, "b", crioCgroup(puid(2), cid(2)))
	p.writeProc(3, "host", "0::/system.slice/ollama.service\n")
	cri := &podCachingResolver{fakeResolver: newResolver("cri")}
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, LookupBudget: time.Minute})

	a.Attribute(t.Context(), snapshot(1, 2, 3))
	incomplete := snapshot(1)
	incomplete.Devices[0].ProcessesListed = false
	a.Attribute(t.Context(), incomplete)
	a.Attribute(t.Context(), snapshot(1, 3))
	a.Attribute(t.Context(), snapshot(3))
	want := []map[string]bool{{puid(1): true, puid(2): true}, {puid(1): true}, {}}
	if !reflect.DeepEqual(cri.kept, want) {
		t.Errorf("pods kept after each reading: %v, want %v", cri.kept, want)
	}
}

// A process's start time comes from its stat and the machine's boot time on the kernel's procfs; a tree that is not
// procfs has no boot time, and leaves it unknown.
func TestStarted(t *testing.T) {
	if ok, err := procfs.IsProcFS("/proc"); err != nil || !ok {
		t.Skip("no procfs at /proc")
	}
	before := time.Now()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("cannot start sleep:", err)
	}
	after := time.Now()
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	pid := uint32(cmd.Process.Pid)
	// btime is whole seconds, and the clock may have been set since boot: a second either way.
	got := newAttributor(t, Config{ProcFS: "/proc"}).Attribute(t.Context(), snapshot(pid))[pid].Started
	if got.Before(before.Add(-time.Second)) || got.After(after.Add(time.Second)) {
		t.Errorf("started %v, want between %v and %v", got, before, after)
	}

	p := newProcFS(t)
	p.writeProc(1, "a", "0::/system.slice/ollama.service\n")
	if got := newAttributor(t, Config{ProcFS: p.root}).Attribute(t.Context(), snapshot(1))[1].Started; !got.IsZero() {
		t.Errorf("a tree that is not procfs gave a start time: %v", got)
	}
}
