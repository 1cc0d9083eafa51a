package attribution

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// A runtime without a socket (a node without Docker) answers ErrUnavailable: counted as such, never as an error,
// and never logged above debug, however often it is asked.
func TestUnavailableRuntimeIsNotAnError(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(7, "x", "0::/system.slice/docker-"+cid(7)+".scope\n")
	docker := newResolver("docker")
	docker.setErr(fmt.Errorf("docker: no socket at unix:///var/run/docker.sock: %w", runtime.ErrUnavailable))
	clk := newClock()
	logs := &testkit.Logs{}
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{docker}, Now: clk.Now, LookupBudget: time.Minute,
		Logger: slog.New(logs)})
	for range 3 {
		owners := a.Attribute(t.Context(), snapshot(7))
		if got := owners[7].Identity; got.ContainerID != cid(7) || got.Runtime != "docker" {
			t.Errorf("cgroup labels lost: %+v", got)
		}
		clk.Advance(DefaultNegativeTTL)
	}
	if n := docker.calls.Load(); n != 3 {
		t.Errorf("%d calls over three negative TTLs, want 3", n)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_requests_total", map[string]string{"resolver": "docker", "result": "unavailable"}); v != 3 {
		t.Errorf("requests_total{docker,unavailable} = %v, want 3", v)
	}
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_requests_total", map[string]string{"resolver": "docker", "result": "error"}); v != 0 {
		t.Errorf("requests_total{docker,error} = %v, want 0", v)
	}
	if n := logs.Count(slog.LevelWarn) + logs.Count(slog.LevelInfo); n != 0 {
		t.Errorf("%d log records at info or above for an absent runtime, want 0", n)
	}
}

// incompleteResolver names one container and, while incomplete is set, answers without its pod labels and with
// ErrIncomplete. With gate set, a call waits for it.
type incompleteResolver struct {
	mu         sync.Mutex
	incomplete bool
	gate       chan struct{}
	calls      int
	c          runtime.Container
}

func (r *incompleteResolver) Name() string { return "cri" }

func (r *incompleteResolver) Resolve(ctx context.Context, id string) (runtime.Container, error) {
	r.mu.Lock()
	r.calls++
	gate, incomplete, c := r.gate, r.incomplete, r.c
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return runtime.Container{}, ctx.Err()
		}
	}
	if incomplete {
		c.PodLabels = nil
		return c, fmt.Errorf("%w: CRI ListPodSandbox: unavailable", runtime.ErrIncomplete)
	}
	return c, nil
}

func (r *incompleteResolver) set(f func(r *incompleteResolver)) {
	r.mu.Lock()
	f(r)
	r.mu.Unlock()
}

func (r *incompleteResolver) callCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// An incomplete answer (names without pod labels) is used, counted as an error, and looked up again after the
// negative TTL until a complete one comes; meanwhile, and while the refresh is in flight, the names stay.
func TestIncompleteAnswerIsUsedThenRefreshed(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "train", crioCgroup(puid(1), cid(1)))
	cri := &incompleteResolver{incomplete: true, c: runtime.Container{Namespace: "ml", Pod: "trainer-0", PodUID: puid(1),
		Name: "trainer", PodLabels: map[string]string{"app": "trainer"}}}
	clk := newClock()
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, Now: clk.Now, PodLabels: []string{"app"},
		LookupBudget: time.Minute})

	check := func(step string, wantCalls int, wantLabels bool) {
		t.Helper()
		got := a.Attribute(t.Context(), snapshot(1))[1].Identity
		if got.Pod != "trainer-0" || got.Container != "trainer" || got.Namespace != "ml" {
			t.Errorf("%s: names lost: %+v", step, got)
		}
		if (got.PodLabels["app"] == "trainer") != wantLabels {
			t.Errorf("%s: pod labels = %v, want them: %v", step, got.PodLabels, wantLabels)
		}
		if n := cri.callCount(); n != wantCalls {
			t.Errorf("%s: %d calls, want %d", step, n, wantCalls)
		}
	}
	check("first scrape", 1, false)
	clk.Advance(DefaultNegativeTTL - time.Second)
	check("within the TTL", 1, false)
	clk.Advance(time.Second)
	check("after the TTL, still incomplete", 2, false)
	if v := metricValue(t, a, "gpu_pod_exporter_resolver_requests_total", map[string]string{"resolver": "cri", "result": "error"}); v != 2 {
		t.Errorf("requests_total{cri,error} = %v, want 2", v)
	}

	// A refresh slower than the budget: the scrape keeps the incomplete names rather than none.
	gate := make(chan struct{})
	cri.set(func(r *incompleteResolver) { r.gate, r.incomplete = gate, false })
	a.names.budget = 10 * time.Millisecond
	clk.Advance(DefaultNegativeTTL)
	check("refresh in flight", 3, false)
	close(gate)
	a.names.budget = time.Minute
	// The refresh ends in the background; the next scrape waits for it, if still running, and has it.
	check("refreshed", 3, true)
	clk.Advance(10 * DefaultNegativeTTL)
	check("a complete answer is kept", 3, true)
}

// Docker-in-Docker in a pod: the CRI cannot name the inner container, so its process is named by the pod's
// container, keeping the inner container's ID and runtime.
func TestDockerInDockerInPodTakesTheOuterNames(t *testing.T) {
	pod := puid(5)
	outer, inner, known := cid(50), cid(51), cid(52)
	u := []byte(pod)
	for i, c := range u {
		if c == '-' {
			u[i] = '_'
		}
	}
	podPath := "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + string(u) + ".slice/cri-containerd-" + outer + ".scope"
	p := newProcFS(t)
	p.writeProc(1, "train", podPath+"/docker/"+inner+"\n")
	p.writeProc(2, "other", podPath+"/docker/"+known+"\n")
	cri := newResolver("cri")
	cri.set(outer, runtime.Container{Namespace: "ci", Pod: "runner-0", PodUID: pod, Name: "dind", Runtime: "containerd"})
	docker := newResolver("docker")
	docker.set(known, runtime.Container{Name: "named-by-docker", Runtime: "docker"})
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri, docker}, LookupBudget: time.Minute})

	owners := a.Attribute(t.Context(), snapshot(1, 2))
	got := owners[1].Identity
	if got.ContainerID != inner || got.Runtime != "docker" || got.PodUID != pod {
		t.Errorf("cgroup labels of the inner container changed: %+v", got)
	}
	if got.Namespace != "ci" || got.Pod != "runner-0" || got.Container != "dind" {
		t.Errorf("inner container not named by the pod's container: %+v", got)
	}
	if got := owners[2].Identity; got.Container != "named-by-docker" || got.ContainerID != known {
		t.Errorf("an inner container that a runtime names keeps its own names: %+v", got)
	}
}

// A scrape with both unreadable and readable processes is one failing state, logged once, not a warning and a
// "readable again" in turn.
func TestProcFSMixedScrapeDoesNotFlap(t *testing.T) {
	p := newProcFS(t)
	if err := os.MkdirAll(filepath.Join(p.root, "3", "stat"), 0o755); err != nil {
		t.Fatal(err)
	}
	p.writeProc(4, "ok", "0::/system.slice/ollama.service\n")
	logs := &testkit.Logs{}
	a := newAttributor(t, Config{ProcFS: p.root, Logger: slog.New(logs)})
	for range 3 {
		a.Attribute(t.Context(), snapshot(3, 4))
		a.Attribute(t.Context(), snapshot(4, 3))
	}
	if n := logs.Count(slog.LevelWarn); n != 1 {
		t.Errorf("%d warnings over six mixed scrapes, want 1", n)
	}
	if n := logs.Count(slog.LevelInfo); n != 0 {
		t.Errorf("%d info records over six mixed scrapes, want 0", n)
	}
	a.Attribute(t.Context(), snapshot(4))
	if n := logs.Count(slog.LevelInfo); n != 1 {
		t.Errorf("%d info records once every process is readable, want 1", n)
	}
}

// A reading whose PIDs are all missing from procfs (a --path.procfs that is not the host's, a container's own
// /proc) warns once, not once per reading; a reading with one process in procfs ends it, logged once.
func TestAllPIDsMissingWarnsOncePerChange(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(4, "ok", "0::/system.slice/ollama.service\n")
	logs := &testkit.Logs{}
	a := newAttributor(t, Config{ProcFS: p.root, Logger: slog.New(logs)})
	for range 3 {
		a.Attribute(t.Context(), snapshot(7, 8))
	}
	if n := logs.Count(slog.LevelWarn); n != 1 {
		t.Fatalf("%d warnings over three readings with every PID missing, want 1", n)
	}
	if msg := logs.Messages(slog.LevelWarn)[0]; !strings.Contains(msg, "--path.procfs") {
		t.Errorf("warning %q does not point at --path.procfs", msg)
	}
	a.Attribute(t.Context(), snapshot(4, 7)) // one found, one exited: normal
	a.Attribute(t.Context(), snapshot(4))
	if w, i := logs.Count(slog.LevelWarn), logs.Count(slog.LevelInfo); w != 1 || i != 1 {
		t.Errorf("after PIDs are found again: %d warnings, %d info records; want 1 and 1", w, i)
	}
	a.Attribute(t.Context(), snapshot(9))
	if n := logs.Count(slog.LevelWarn); n != 2 {
		t.Errorf("%d warnings after every PID goes missing again, want 2", n)
	}
}

// Every identity value is valid UTF-8, however invalid the bytes of the cgroup path (a delegated user's
// "\xff.service"), the process name, the runtime's answers or the user database: a label value that is not valid
// UTF-8 fails its whole series at export.
func TestIdentityIsValidUTF8(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "a\xffb", "0::/system.slice/\xff.service\n")
	p.writeProc(2, "ok", crioCgroup(puid(2), cid(2)))
	cri := newResolver("cri")
	cri.set(cid(2), runtime.Container{Namespace: "ns\xfe", Pod: "pod\xff", PodUID: puid(2), Name: "c\xc3",
		PodLabels: map[string]string{"team": "ml\xff"}})
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri}, PodLabels: []string{"team"}, LookupBudget: time.Minute,
		Users: fakeUsers{1: "b\xffb"}})
	owners := a.Attribute(t.Context(), snapshot(1, 2))
	if got := owners[1]; got.Name != "a\uFFFDb" || got.Identity.SystemdUnit != "\uFFFD.service" || got.Identity.User != "b\uFFFDb" {
		t.Errorf("process 1: name %q, unit %q, user %q; want each with U+FFFD for the invalid byte", got.Name,
			got.Identity.SystemdUnit, got.Identity.User)
	}
	got := owners[2].Identity
	if got.Namespace != "ns\uFFFD" || got.Pod != "pod\uFFFD" || got.Container != "c\uFFFD" || got.PodLabels["team"] != "ml\uFFFD" {
		t.Errorf("process 2: %+v; want every runtime value made valid", got)
	}
	for pid, o := range owners {
		if !utf8.ValidString(o.Name) {
			t.Errorf("PID %d: name %q is not valid UTF-8", pid, o.Name)
		}
		for _, l := range IdentityLabels {
			if v := *l.Get(&o.Identity); !utf8.ValidString(v) {
				t.Errorf("PID %d: %s %q is not valid UTF-8", pid, l.Name, v)
			}
		}
	}
	// The resolver's answer is shared by the container's identities and cached: it is not changed in place.
	if c, _ := cri.Resolve(t.Context(), cid(2)); c.PodLabels["team"] != "ml\xff" {
		t.Errorf("the cached answer was changed: %q", c.PodLabels["team"])
	}
}

// A container ID below a user manager is a name the user chose: it is never looked up in the system's runtimes,
// which would give the process the names (and the pod) of whichever container really has that ID.
func TestContainerBelowUserManagerIsNotLookedUp(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "rootless", "0::/user.slice/user-1000.slice/user@1000.service/user.slice/docker-"+cid(1)+".scope\n")
	p.writeProc(2, "forged", "0::/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods-burstable-pod"+
		strings.ReplaceAll(puid(2), "-", "_")+".slice/cri-containerd-"+cid(2)+".scope\n")
	docker, cri := newResolver("docker"), newResolver("cri")
	victim := runtime.Container{Namespace: "prod", Pod: "victim", PodUID: puid(2), Name: "trainer"}
	docker.set(cid(1), victim)
	cri.set(cid(2), victim)
	a := newAttributor(t, Config{ProcFS: p.root, Resolvers: []runtime.Resolver{cri, docker}, LookupBudget: time.Minute})
	owners := a.Attribute(t.Context(), snapshot(1, 2))
	if got := owners[1].Identity; got.ContainerID != cid(1) || got.Runtime != "docker" || got.Pod != "" || got.Namespace != "" {
		t.Errorf("rootless container: %+v, want its cgroup labels only", got)
	}
	if got := owners[2].Identity; got.IsKubernetes() || got.ContainerID != "" ||
		got.SystemdUnit != "user@1000.service/cri-containerd-"+cid(2)+".scope" {
		t.Errorf("forged pod: %+v, want the user's unit", got)
	}
	if n := docker.calls.Load() + cri.calls.Load(); n != 0 {
		t.Errorf("%d runtime calls for containers below a user manager, want 0", n)
	}
}
