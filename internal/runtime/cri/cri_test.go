package cri

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/socket"
)

const (
	trainerID  = "3f1a9c2e8b7d4f60a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718"
	sidecarID  = "9d8c7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa998877665544"
	sandboxID  = "c0ffee0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
	oldSandbox = "deadbeef0123456789abcdef0123456789abcdef0123456789abcdef01234567"
	crictlID   = "1111111111111111111111111111111111111111111111111111111111111111"
	unknownID  = "0000000000000000000000000000000000000000000000000000000000000000"
	podUID     = "5b2f3c4d-1e2f-4a5b-8c9d-0e1f2a3b4c5d"
)

// fakeRuntime is an in-process CRI runtime service serving fixture statuses. Unknown IDs get NotFound, as
// from containerd. A non-nil block makes ContainerStatus wait for the caller to give up.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	containers map[string]*runtimeapi.ContainerStatus
	sandboxes  []*runtimeapi.PodSandbox
	statusErr  error         // returned by ContainerStatus when set
	block      chan struct{} // closed by the handler when it starts blocking
	name       string        // what Version says the runtime is; empty: Version is unimplemented
	listErr    error         // returned by ListPodSandbox when set
	// versionGate, when set, makes Version report on versionIn and wait for versionGate to close.
	versionGate chan struct{}
	versionIn   chan struct{}

	mu    sync.Mutex
	calls map[string]int
}

func (f *fakeRuntime) count(method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = make(map[string]int)
	}
	f.calls[method]++
}

func (f *fakeRuntime) callCount(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *fakeRuntime) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	f.count("ContainerStatus")
	if req.GetVerbose() {
		return nil, status.Error(codes.InvalidArgument, "test expects non-verbose requests")
	}
	if f.block != nil {
		close(f.block)
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if f.statusErr != nil {
		return nil, f.statusErr
	}
	st, ok := f.containers[req.GetContainerId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", req.GetContainerId())
	}
	return &runtimeapi.ContainerStatusResponse{Status: st}, nil
}

func (f *fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	f.count("Version")
	if f.versionGate != nil {
		f.versionIn <- struct{}{}
		<-f.versionGate
	}
	if f.name == "" {
		return nil, status.Error(codes.Unimplemented, "method Version not implemented")
	}
	return &runtimeapi.VersionResponse{RuntimeName: f.name, RuntimeVersion: "1.7.0", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeRuntime) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	f.count("PodSandboxStatus")
	for _, s := range f.sandboxes {
		if s.GetId() == req.GetPodSandboxId() {
			return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{
				Id: s.GetId(), Metadata: s.GetMetadata(), State: s.GetState(), CreatedAt: s.GetCreatedAt(), Labels: s.GetLabels(),
			}}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "an error occurred when try to find sandbox %q: not found", req.GetPodSandboxId())
}

func (f *fakeRuntime) ListPodSandbox(ctx context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.count("ListPodSandbox")
	if f.listErr != nil {
		return nil, f.listErr
	}
	var items []*runtimeapi.PodSandbox
	for _, s := range f.sandboxes {
		match := true
		for k, v := range req.GetFilter().GetLabelSelector() {
			if s.GetLabels()[k] != v {
				match = false
			}
		}
		if match {
			items = append(items, s)
		}
	}
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

// fixtureRuntime returns a runtime holding one pod "trainer-0" in namespace "ml" with two containers (its
// sandbox was recreated once), and one container created outside kubelet.
func fixtureRuntime() *fakeRuntime {
	podLabels := map[string]string{
		"app":                         "trainer",
		"team":                        "vision",
		"io.kubernetes.pod.name":      "trainer-0",
		"io.kubernetes.pod.namespace": "ml",
		"io.kubernetes.pod.uid":       podUID,
	}
	containerLabels := func(name string) map[string]string {
		return map[string]string{
			"io.kubernetes.container.name": name,
			"io.kubernetes.pod.name":       "trainer-0",
			"io.kubernetes.pod.namespace":  "ml",
			"io.kubernetes.pod.uid":        podUID,
		}
	}
	md := func(attempt uint32) *runtimeapi.PodSandboxMetadata {
		return &runtimeapi.PodSandboxMetadata{Name: "trainer-0", Namespace: "ml", Uid: podUID, Attempt: attempt}
	}
	return &fakeRuntime{
		containers: map[string]*runtimeapi.ContainerStatus{
			trainerID: {
				Id:       trainerID,
				Metadata: &runtimeapi.ContainerMetadata{Name: "trainer", Attempt: 0},
				State:    runtimeapi.ContainerState_CONTAINER_RUNNING,
				Labels:   containerLabels("trainer"),
				Annotations: map[string]string{
					"io.kubernetes.container.hash":         "8b2e1c6f",
					"io.kubernetes.container.restartCount": "0",
				},
			},
			sidecarID: {
				Id:       sidecarID,
				Metadata: &runtimeapi.ContainerMetadata{Name: "log-shipper"},
				State:    runtimeapi.ContainerState_CONTAINER_RUNNING,
				Labels:   containerLabels("log-shipper"),
			},
			crictlID: {
				Id:       crictlID,
				Metadata: &runtimeapi.ContainerMetadata{Name: "debug"},
				State:    runtimeapi.ContainerState_CONTAINER_RUNNING,
			},
		},
		sandboxes: []*runtimeapi.PodSandbox{
			{Id: oldSandbox, Metadata: md(0), State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY, CreatedAt: 100,
				Labels: map[string]string{"app": "stale", "io.kubernetes.pod.uid": podUID}},
			{Id: sandboxID, Metadata: md(1), State: runtimeapi.PodSandboxState_SANDBOX_READY, CreatedAt: 200, Labels: podLabels},
		},
	}
}

// serveCRI serves f's CRI on a new unix socket at path until the test ends or the returned server is stopped.
func serveCRI(t *testing.T, path string, f runtimeapi.RuntimeServiceServer) *grpc.Server {
	t.Helper()
	return testkit.ServeGRPC(t, path, func(s *grpc.Server) { runtimeapi.RegisterRuntimeServiceServer(s, f) })
}

// serve starts f on a unix socket and returns its endpoint.
func serve(t *testing.T, f *fakeRuntime) string {
	t.Helper()
	path := filepath.Join(testkit.SocketDir(t), "cri.sock")
	serveCRI(t, path, f)
	return "unix://" + path
}

// fixtureLabels is the allowlist of the fixture pod's labels, which the tests' resolvers keep.
var fixtureLabels = []string{"app", "team"}

func newTestResolver(t *testing.T, endpoints ...string) *Resolver {
	t.Helper()
	r, err := New(Config{Endpoints: endpoints, PodLabels: fixtureLabels})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestResolveKubernetesContainer(t *testing.T) {
	f := fixtureRuntime()
	r := newTestResolver(t, serve(t, f))
	if r.Name() != "cri" {
		t.Errorf("Name() = %q, want cri", r.Name())
	}

	got, err := r.Resolve(context.Background(), trainerID)
	if err != nil {
		t.Fatal(err)
	}
	want := runtime.Container{
		Namespace: "ml", Pod: "trainer-0", PodUID: podUID, Name: "trainer",
		PodLabels: map[string]string{"app": "trainer", "team": "vision"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve(trainer) = %+v, want %+v", got, want)
	}

	// The second container of the same pod must not cost another sandbox lookup.
	got, err = r.Resolve(context.Background(), sidecarID)
	if err != nil {
		t.Fatal(err)
	}
	want.Name = "log-shipper"
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve(sidecar) = %+v, want %+v", got, want)
	}
	if n := f.callCount("ListPodSandbox"); n != 1 {
		t.Errorf("ListPodSandbox called %d times for two containers of one pod, want 1", n)
	}
	if n := f.callCount("ContainerStatus"); n != 2 {
		t.Errorf("ContainerStatus called %d times, want 2", n)
	}

	// What a caller does to the returned labels must not reach the cache.
	got.PodLabels["app"] = "changed"
	again, err := r.Resolve(context.Background(), trainerID)
	if err != nil {
		t.Fatal(err)
	}
	if again.PodLabels["app"] != "trainer" {
		t.Errorf("cached pod labels were modified through a returned Container: app=%q", again.PodLabels["app"])
	}
}

// With the cgroupfs driver a pod's cgroup path does not name the runtime; the runtime names itself, once.
func TestRuntimeNamesItself(t *testing.T) {
	for name, want := range map[string]string{"containerd": "containerd", "cri-o": "crio", "docker": "docker", "": "", "rkt": ""} {
		f := fixtureRuntime()
		f.name = name
		r := newTestResolver(t, serve(t, f))
		for _, id := range []string{trainerID, sidecarID, sandboxID} {
			got, err := r.Resolve(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if got.Runtime != want {
				t.Errorf("runtime %q: Resolve(%s).Runtime = %q, want %q", name, id, got.Runtime, want)
			}
		}
		if n := f.callCount("Version"); n != 1 {
			t.Errorf("runtime %q: Version called %d times for three lookups, want 1", name, n)
		}
	}
}

func TestResolveSandbox(t *testing.T) {
	f := fixtureRuntime()
	r := newTestResolver(t, serve(t, f))
	got, err := r.Resolve(context.Background(), sandboxID)
	if err != nil {
		t.Fatal(err)
	}
	want := runtime.Container{
		Namespace: "ml", Pod: "trainer-0", PodUID: podUID,
		PodLabels: map[string]string{"app": "trainer", "team": "vision"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve(sandbox) = %+v, want %+v", got, want)
	}
	// The sandbox lookup fills the pod cache too.
	if _, err := r.Resolve(context.Background(), trainerID); err != nil {
		t.Fatal(err)
	}
	if n := f.callCount("ListPodSandbox"); n != 0 {
		t.Errorf("ListPodSandbox called %d times after the sandbox was resolved, want 0", n)
	}
}

func TestResolveNonKubernetesContainer(t *testing.T) {
	f := fixtureRuntime()
	r := newTestResolver(t, serve(t, f))
	got, err := r.Resolve(context.Background(), crictlID)
	if err != nil {
		t.Fatal(err)
	}
	if want := (runtime.Container{Name: "debug"}); !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve(crictl container) = %+v, want %+v", got, want)
	}
	if n := f.callCount("ListPodSandbox"); n != 0 {
		t.Errorf("ListPodSandbox called %d times for a container without a pod, want 0", n)
	}
}

func TestResolveContainerWhoseSandboxIsGone(t *testing.T) {
	f := fixtureRuntime()
	f.sandboxes = nil
	r := newTestResolver(t, serve(t, f))
	got, err := r.Resolve(context.Background(), trainerID)
	if err != nil {
		t.Fatal(err)
	}
	if want := (runtime.Container{Namespace: "ml", Pod: "trainer-0", PodUID: podUID, Name: "trainer"}); !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve = %+v, want %+v", got, want)
	}
}

func TestResolveNotFound(t *testing.T) {
	f := fixtureRuntime()
	r := newTestResolver(t, serve(t, f))
	_, err := r.Resolve(context.Background(), unknownID)
	if !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Resolve(unknown) error = %v, want ErrNotFound", err)
	}
	if f.callCount("ContainerStatus") != 1 || f.callCount("PodSandboxStatus") != 1 {
		t.Errorf("calls = %v, want one ContainerStatus and one PodSandboxStatus", f.calls)
	}
}

func TestResolveCRIDockerdNotFound(t *testing.T) {
	// cri-dockerd passes Docker's error through without a NotFound code.
	f := fixtureRuntime()
	f.statusErr = status.Error(codes.Unknown, "Error response from daemon: No such container: "+unknownID)
	r := newTestResolver(t, serve(t, f))
	if _, err := r.Resolve(context.Background(), unknownID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Resolve(unknown) error = %v, want ErrNotFound", err)
	}
}

func TestResolveRuntimeErrorIsWrapped(t *testing.T) {
	f := fixtureRuntime()
	f.statusErr = status.Error(codes.Internal, "boltdb is on fire")
	ep := serve(t, f)
	r := newTestResolver(t, ep)
	_, err := r.Resolve(context.Background(), trainerID)
	if err == nil || errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Resolve error = %v, want a runtime error", err)
	}
	if want := "CRI ContainerStatus on " + ep + ": "; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if status.Code(err) != codes.Internal {
		t.Errorf("error %q lost the runtime's cause", err)
	}
}

func TestResolveRuntimeDown(t *testing.T) {
	// Nothing listens on the socket: the call must fail promptly with an error, not ErrNotFound.
	ep := "unix://" + filepath.Join(testkit.SocketDir(t), "absent.sock")
	r := newTestResolver(t, ep)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.Resolve(ctx, trainerID)
	if err == nil || errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Resolve error = %v, want an error", err)
	}
	if !strings.Contains(err.Error(), "CRI ContainerStatus on "+ep) {
		t.Errorf("error %q does not name the call and endpoint", err)
	}
	if ctx.Err() != nil {
		t.Errorf("Resolve waited for the deadline instead of failing fast: %v", err)
	}
}

func TestResolveHonoursDeadline(t *testing.T) {
	f := fixtureRuntime()
	f.block = make(chan struct{})
	r := newTestResolver(t, serve(t, f))

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := r.Resolve(ctx, trainerID)
		done <- err
	}()
	<-f.block // the runtime has the request and will not answer
	select {
	case err := <-done:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("Resolve error = %v, want DeadlineExceeded", err)
		}
		if errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("a timeout must not read as ErrNotFound")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Resolve did not return after its deadline passed")
	}
}

func TestResolveAsksEveryEndpoint(t *testing.T) {
	empty := &fakeRuntime{}
	full := fixtureRuntime()
	r := newTestResolver(t, serve(t, empty), serve(t, full))
	got, err := r.Resolve(context.Background(), trainerID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "trainer" || got.Pod != "trainer-0" {
		t.Errorf("Resolve = %+v, want trainer in trainer-0", got)
	}
	if _, err := r.Resolve(context.Background(), unknownID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Resolve(unknown) error = %v, want ErrNotFound when every endpoint says not found", err)
	}
}

func TestResolveDownEndpointIsNotNotFound(t *testing.T) {
	// One runtime says "not found", the other cannot be asked: the container may be the second one's.
	down := "unix://" + filepath.Join(testkit.SocketDir(t), "absent.sock")
	r := newTestResolver(t, serve(t, &fakeRuntime{}), down)
	_, err := r.Resolve(context.Background(), unknownID)
	if err == nil || errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Resolve error = %v, want an error naming %s", err, down)
	}
	if !strings.Contains(err.Error(), down) {
		t.Errorf("error %q does not name %s", err, down)
	}
}

func TestProbePicksExistingSockets(t *testing.T) {
	dir := testkit.SocketDir(t)
	sock := filepath.Join(dir, "containerd.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	regular := filepath.Join(dir, "crio.sock")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A second name for the same socket, as /var/run is for /run.
	alias := filepath.Join(dir, "var-run")
	if err := os.Symlink(dir, alias); err != nil {
		t.Fatal(err)
	}
	candidates := []string{
		"unix://" + filepath.Join(dir, "missing.sock"),
		"unix://" + regular,
		"unix://" + sock,
		"unix://" + filepath.Join(alias, "containerd.sock"),
		"tcp://127.0.0.1:1234",
	}
	r, err := newResolver(Config{}, candidates, time.Minute, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, want := endpointNames(r.active()), []string{"unix://" + sock}; !reflect.DeepEqual(got, want) {
		t.Errorf("endpoints = %v, want %v", got, want)
	}
}

// A runtime that starts after the exporter: with no socket, lookups are a cheap definite "unavailable", and the
// socket is looked for again once the interval has passed, not on every lookup.
func TestRuntimeStartsLater(t *testing.T) {
	path := filepath.Join(testkit.SocketDir(t), "containerd.sock")
	clock := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	r, err := newResolver(Config{}, []string{"unix://" + path}, 10*time.Second, clock.now)
	if err != nil {
		t.Fatalf("newResolver without sockets: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	if _, err := r.Resolve(context.Background(), trainerID); !errors.Is(err, runtime.ErrUnavailable) {
		t.Fatalf("Resolve without a socket: error = %v, want ErrUnavailable", err)
	}

	srv := serveCRI(t, path, fixtureRuntime())

	clock.t = clock.t.Add(9 * time.Second)
	if _, err := r.Resolve(context.Background(), trainerID); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Resolve within the probe interval: error = %v, want ErrUnavailable (no new probe yet)", err)
	}
	clock.t = clock.t.Add(time.Second)
	got, err := r.Resolve(context.Background(), trainerID)
	if err != nil {
		t.Fatalf("Resolve after the socket appeared and the interval passed: %v", err)
	}
	if got.Name != "trainer" {
		t.Errorf("Resolve = %+v, want the trainer container", got)
	}
	if eps := endpointNames(r.active()); !reflect.DeepEqual(eps, []string{"unix://" + path}) {
		t.Errorf("endpoints = %v", eps)
	}

	// The socket goes away: the next probe finds none and lookups are unavailable again, not errors.
	srv.Stop()
	if _, err := os.Stat(path); err == nil {
		os.Remove(path)
	}
	clock.t = clock.t.Add(10 * time.Second)
	if _, err := r.Resolve(context.Background(), trainerID); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Resolve after the socket was removed: error = %v, want ErrUnavailable", err)
	}
}

// A failed ListPodSandbox after a good ContainerStatus keeps the container's names, without pod labels, and says
// that the answer is incomplete so that it is asked again later.
func TestResolvePodListFails(t *testing.T) {
	f := fixtureRuntime()
	f.listErr = status.Error(codes.Internal, "boom")
	r := newTestResolver(t, serve(t, f))
	got, err := r.Resolve(context.Background(), trainerID)
	if !errors.Is(err, runtime.ErrIncomplete) {
		t.Fatalf("Resolve error = %v, want ErrIncomplete", err)
	}
	if !strings.Contains(err.Error(), "ListPodSandbox") {
		t.Errorf("Resolve error = %v, want the ListPodSandbox failure in it", err)
	}
	if want := (runtime.Container{Namespace: "ml", Pod: "trainer-0", PodUID: podUID, Name: "trainer"}); !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve = %+v, want %+v", got, want)
	}

	f.listErr = nil
	got, err = r.Resolve(context.Background(), trainerID)
	if err != nil {
		t.Fatal(err)
	}
	if got.PodLabels["app"] != "trainer" {
		t.Errorf("Resolve once ListPodSandbox works = %+v, want the pod labels", got)
	}
}

// Version is asked outside the endpoint's lock: a slow Version must not hold up other lookups.
func TestVersionDoesNotSerializeLookups(t *testing.T) {
	f := fixtureRuntime()
	f.name = "containerd"
	f.versionGate = make(chan struct{})
	f.versionIn = make(chan struct{})
	r := newTestResolver(t, serve(t, f))
	errs := make(chan error, 2)
	for _, id := range []string{trainerID, sidecarID} {
		go func() {
			c, err := r.Resolve(context.Background(), id)
			if err == nil && c.Runtime != "containerd" {
				err = errors.New("runtime " + c.Runtime + ", want containerd")
			}
			errs <- err
		}()
	}
	// Both lookups reach Version while neither has returned; under a lock held across the call, the second
	// would wait for the first and this would time out.
	for range 2 {
		select {
		case <-f.versionIn:
		case <-time.After(10 * time.Second):
			t.Fatal("the second lookup did not reach Version while the first was in it")
		}
	}
	close(f.versionGate)
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestNewEndpointSyntax(t *testing.T) {
	for _, ep := range []string{"unix:///run/containerd/containerd.sock", "/run/crio/crio.sock"} {
		r, err := New(Config{Endpoints: []string{ep}})
		if err != nil {
			t.Errorf("New(%q) error = %v", ep, err)
			continue
		}
		r.Close()
	}
	for _, ep := range []string{"tcp://10.0.0.1:10010", "unix://relative.sock", "containerd.sock"} {
		if r, err := New(Config{Endpoints: []string{ep}}); err == nil {
			r.Close()
			t.Errorf("New(%q) accepted a non-unix or relative endpoint", ep)
		}
	}
}

func TestDefaultEndpointsAreUnixSockets(t *testing.T) {
	for _, ep := range DefaultEndpoints() {
		if _, err := socket.Path(ep); err != nil {
			t.Error(err)
		}
	}
}

func TestResolveAfterRuntimeRestart(t *testing.T) {
	// The runtime stops and comes back on the same socket: the lazily connected client must reconnect by itself
	// and names come back within a few reconnect delays. (That the delay is capped at reconnectMaxDelay after a
	// long outage would take minutes to show; it is gRPC's documented ConnectParams behaviour.)
	path := filepath.Join(testkit.SocketDir(t), "cri.sock")
	start := func() *grpc.Server { return serveCRI(t, path, fixtureRuntime()) }
	srv := start()
	r := newTestResolver(t, "unix://"+path)
	if _, err := r.Resolve(context.Background(), trainerID); err != nil {
		t.Fatal(err)
	}

	srv.Stop() // also removes the socket, as containerd's shutdown does
	if _, err := r.Resolve(context.Background(), trainerID); err == nil || errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Resolve with the runtime stopped: error = %v, want a runtime error", err)
	}

	srv = start()
	defer srv.Stop()
	deadline := time.Now().Add(3 * reconnectMaxDelay)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := r.Resolve(context.Background(), trainerID)
		if err == nil {
			if got.Name != "trainer" {
				t.Errorf("Resolve after restart = %+v", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Resolve still failing %v after the runtime came back: %v", 3*reconnectMaxDelay, err)
		}
		<-tick.C
	}
}

// Only the allowlisted labels of a pod are returned, and none without an allowlist.
func TestResolveKeepsOnlyAllowlistedLabels(t *testing.T) {
	for _, c := range []struct {
		allowlist []string
		want      map[string]string
	}{
		{nil, nil},
		{[]string{"team", "absent"}, map[string]string{"team": "vision"}},
		{[]string{"io.kubernetes.pod.name"}, nil}, // kubelet's, never a pod label
	} {
		r, err := New(Config{Endpoints: []string{serve(t, fixtureRuntime())}, PodLabels: c.allowlist})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		for _, id := range []string{trainerID, sandboxID} {
			got, err := r.Resolve(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.PodLabels, c.want) {
				t.Errorf("allowlist %q: Resolve(%s) labels %v, want %v", c.allowlist, id[:8], got.PodLabels, c.want)
			}
		}
	}
}
