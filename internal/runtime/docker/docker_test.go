package docker

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/socket"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

const (
	plainID     = "7c5e1b2a9f3d4e6081726354a5b6c7d8e9f0a1b2c3d4e5f60718293a4b5c6d7e"
	composeID   = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
	criDockerID = "5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
	criSandbox  = "8f7e6d5c4b3a29180f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a6978"
	podmanID    = "b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c"
	podmanPodID = "e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7"
	unknownID   = "0000000000000000000000000000000000000000000000000000000000000000"
)

// fakeDaemon serves fixture documents by URL path, and a Docker-shaped 404 for anything else.
type fakeDaemon struct {
	t      *testing.T
	docs   map[string]string // URL path -> testdata file
	errors map[string]int    // URL path -> status code with an error body

	mu    sync.Mutex
	paths []string
}

func (d *fakeDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	d.paths = append(d.paths, r.URL.Path)
	d.mu.Unlock()
	if r.Method != http.MethodGet {
		http.Error(w, "unexpected method", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if code, ok := d.errors[r.URL.Path]; ok {
		w.WriteHeader(code)
		w.Write([]byte(`{"message":"layer store is locked"}`))
		return
	}
	file, ok := d.docs[r.URL.Path]
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"message":"No such container: ` + filepath.Base(filepath.Dir(r.URL.Path)) + `"}`))
		return
	}
	body, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		d.t.Error(err)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Write(body)
}

func (d *fakeDaemon) requested() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.paths...)
}

// serve starts h on a unix socket and returns its host URL.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	path := filepath.Join(testkit.SocketDir(t), "api.sock")
	serveAt(t, path, h)
	return "unix://" + path
}

// serveAt serves h on a new unix socket at path until the test ends or the returned server is closed.
func serveAt(t *testing.T, path string, h http.Handler) *httptest.Server {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = lis
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func dockerDaemon(t *testing.T) *fakeDaemon {
	return &fakeDaemon{t: t, docs: map[string]string{
		"/containers/" + plainID + "/json":     "docker-plain.json",
		"/containers/" + composeID + "/json":   "docker-compose.json",
		"/containers/" + criDockerID + "/json": "docker-cri-dockerd.json",
		"/containers/" + criSandbox + "/json":  "docker-cri-dockerd-sandbox.json",
	}}
}

func podmanDaemon(t *testing.T) *fakeDaemon {
	return &fakeDaemon{t: t, docs: map[string]string{
		"/v4.0.0/libpod/containers/" + podmanID + "/json": "podman-container.json",
		"/v4.0.0/libpod/pods/" + podmanPodID + "/json":    "podman-pod.json",
		// The same plain container through the libpod API: no pod.
		"/v4.0.0/libpod/containers/" + plainID + "/json": "docker-plain.json",
	}}
}

func newDocker(t *testing.T, host string) *Resolver {
	t.Helper()
	r, err := New(Config{Host: host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func newPodman(t *testing.T, host string) *Resolver {
	t.Helper()
	r, err := NewPodman(Config{Host: host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestDockerResolve(t *testing.T) {
	r := newDocker(t, serve(t, dockerDaemon(t)))
	if r.Name() != "docker" {
		t.Errorf("Name() = %q, want docker", r.Name())
	}
	for _, tc := range []struct {
		name string
		id   string
		want runtime.Container
	}{
		{"plain container", plainID, runtime.Container{Name: "resnet-train", Runtime: "docker"}},
		{"compose container", composeID, runtime.Container{Name: "inference-triton-1", Runtime: "docker"}},
		{"cri-dockerd container", criDockerID, runtime.Container{
			Namespace: "serving", Pod: "llm-7d9c8b6f5-x2x9q", PodUID: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", Name: "llm", Runtime: "docker",
		}},
		// The pause container is the pod, with no container name, as the CRI reports a sandbox.
		{"cri-dockerd sandbox", criSandbox, runtime.Container{
			Namespace: "serving", Pod: "llm-7d9c8b6f5-x2x9q", PodUID: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", Runtime: "docker",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Resolve(context.Background(), tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Resolve = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestDockerNotFound(t *testing.T) {
	r := newDocker(t, serve(t, dockerDaemon(t)))
	if _, err := r.Resolve(context.Background(), unknownID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Resolve(unknown) error = %v, want ErrNotFound", err)
	}
}

func TestDockerServerError(t *testing.T) {
	d := dockerDaemon(t)
	d.errors = map[string]int{"/containers/" + plainID + "/json": http.StatusInternalServerError}
	host := serve(t, d)
	r := newDocker(t, host)
	_, err := r.Resolve(context.Background(), plainID)
	if err == nil || errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Resolve error = %v, want a daemon error", err)
	}
	for _, want := range []string{"docker GET /containers/" + plainID + "/json on " + host, "500", "layer store is locked"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestDockerDaemonDown(t *testing.T) {
	host := "unix://" + filepath.Join(testkit.SocketDir(t), "docker.sock")
	r := newDocker(t, host)
	_, err := r.Resolve(context.Background(), plainID)
	if err == nil || errors.Is(err, runtime.ErrNotFound) || errors.Is(err, runtime.ErrUnavailable) {
		t.Fatalf("Resolve error = %v, want a connection error (a host that was given must exist)", err)
	}
	if !strings.Contains(err.Error(), host) {
		t.Errorf("error %q does not name %s", err, host)
	}
}

func TestDockerBoundsResponse(t *testing.T) {
	huge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"Name":"/x","Config":{"Labels":{"junk":"`))
		chunk := []byte(strings.Repeat("a", 64<<10))
		for range 2 * maxBody / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		w.Write([]byte(`"}}}`))
	})
	r := newDocker(t, serve(t, huge))
	_, err := r.Resolve(context.Background(), plainID)
	if err == nil || !strings.Contains(err.Error(), "response larger than") {
		t.Errorf("Resolve error = %v, want the response refused as too large", err)
	}
}

func TestDockerMalformedResponse(t *testing.T) {
	bad := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"Name": 42`)) })
	r := newDocker(t, serve(t, bad))
	_, err := r.Resolve(context.Background(), plainID)
	if err == nil || !strings.Contains(err.Error(), "decoding response") {
		t.Errorf("Resolve error = %v, want a decoding error", err)
	}
}

func TestDockerHonoursDeadline(t *testing.T) {
	entered := make(chan struct{})
	released := make(chan struct{})
	stuck := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-r.Context().Done():
		case <-released:
		}
	})
	r := newDocker(t, serve(t, stuck))
	t.Cleanup(func() { close(released) }) // lets the handler return if the client never hangs up

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := r.Resolve(ctx, plainID)
		done <- err
	}()
	<-entered // the daemon has the request and will not answer
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Resolve error = %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Resolve did not return after its deadline passed")
	}
}

func TestRejectsInvalidIDs(t *testing.T) {
	d := dockerDaemon(t)
	r := newDocker(t, serve(t, d))
	for _, id := range []string{"", "../../info", "abc/def", "abc?x=1", "résumé"} {
		if _, err := r.Resolve(context.Background(), id); err == nil || errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Resolve(%q) error = %v, want invalid ID", id, err)
		}
	}
	if got := d.requested(); len(got) != 0 {
		t.Errorf("invalid IDs reached the daemon: %v", got)
	}
}

func TestHostSyntax(t *testing.T) {
	for _, host := range []string{"", "unix:///var/run/docker.sock", "/run/podman/podman.sock"} {
		if _, err := New(Config{Host: host}); err != nil {
			t.Errorf("New(%q) error = %v", host, err)
		}
	}
	for _, host := range []string{"tcp://127.0.0.1:2375", "unix://docker.sock", "docker.sock", "npipe:////./pipe/docker_engine"} {
		if _, err := New(Config{Host: host}); err == nil {
			t.Errorf("New(%q) accepted a non-unix or relative host", host)
		}
	}
	r, err := NewPodman(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if r.host != DefaultPodmanHost || r.Name() != "podman" {
		t.Errorf("NewPodman(\"\") = host %q name %q, want %s podman", r.host, r.Name(), DefaultPodmanHost)
	}
	if r, _ := New(Config{}); r.host != DefaultDockerHost {
		t.Errorf("New(\"\") host = %q, want %s", r.host, DefaultDockerHost)
	}
}

func TestPodmanResolvePodContainer(t *testing.T) {
	d := podmanDaemon(t)
	r := newPodman(t, serve(t, d))
	got, err := r.Resolve(context.Background(), podmanID)
	if err != nil {
		t.Fatal(err)
	}
	want := runtime.Container{Pod: "gpu-bench", Name: "bench", PodLabels: map[string]string{"team": "perf"}, Runtime: "podman"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve = %+v, want %+v", got, want)
	}
	wantPaths := []string{
		"/v4.0.0/libpod/containers/" + podmanID + "/json",
		"/v4.0.0/libpod/pods/" + podmanPodID + "/json",
	}
	if got := d.requested(); !reflect.DeepEqual(got, wantPaths) {
		t.Errorf("requested %v, want %v", got, wantPaths)
	}
}

func TestPodmanResolvePlainContainer(t *testing.T) {
	d := podmanDaemon(t)
	r := newPodman(t, serve(t, d))
	got, err := r.Resolve(context.Background(), plainID)
	if err != nil {
		t.Fatal(err)
	}
	if want := (runtime.Container{Name: "resnet-train", Runtime: "podman"}); !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve = %+v, want %+v", got, want)
	}
	if got := d.requested(); len(got) != 1 {
		t.Errorf("requested %v, want only the container", got)
	}
}

func TestPodmanPodGone(t *testing.T) {
	d := podmanDaemon(t)
	delete(d.docs, "/v4.0.0/libpod/pods/"+podmanPodID+"/json")
	r := newPodman(t, serve(t, d))
	got, err := r.Resolve(context.Background(), podmanID)
	if err != nil {
		t.Fatal(err)
	}
	if want := (runtime.Container{Name: "bench", Runtime: "podman"}); !reflect.DeepEqual(got, want) {
		t.Errorf("Resolve = %+v, want %+v", got, want)
	}
}

func TestPodmanPodError(t *testing.T) {
	d := podmanDaemon(t)
	d.errors = map[string]int{"/v4.0.0/libpod/pods/" + podmanPodID + "/json": http.StatusInternalServerError}
	r := newPodman(t, serve(t, d))
	got, err := r.Resolve(context.Background(), podmanID)
	if err == nil || !strings.Contains(err.Error(), "podman GET /v4.0.0/libpod/pods/"+podmanPodID+"/json") {
		t.Errorf("Resolve error = %v, want the pod lookup's error", err)
	}
	// The container's own name is kept, flagged as incomplete so that it is looked up again later.
	if !errors.Is(err, runtime.ErrIncomplete) {
		t.Errorf("Resolve error = %v, want ErrIncomplete", err)
	}
	if got.Name == "" || got.Pod != "" || got.Runtime != "podman" {
		t.Errorf("Resolve = %+v, want the container's name and no pod", got)
	}
}

// The default socket need not exist: until it does, lookups are a cheap "unavailable" (no dial, no error), it is
// looked for again once per interval, and a daemon that goes away taking its socket is unavailable again.
func TestDefaultSocketAppearsLater(t *testing.T) {
	path := filepath.Join(testkit.SocketDir(t), "docker.sock")
	r, err := newResolver("docker", "", "unix://"+path, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r.watch = socket.NewWatch([]string{path}, 10*time.Second, func() time.Time { return now })

	if _, err := r.Resolve(context.Background(), plainID); !errors.Is(err, runtime.ErrUnavailable) {
		t.Fatalf("Resolve without the socket: error = %v, want ErrUnavailable", err)
	}

	srv := serveAt(t, path, dockerDaemon(t))

	now = now.Add(9 * time.Second)
	if _, err := r.Resolve(context.Background(), plainID); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Resolve within the recheck interval: error = %v, want ErrUnavailable", err)
	}
	now = now.Add(time.Second)
	got, err := r.Resolve(context.Background(), plainID)
	if err != nil {
		t.Fatalf("Resolve once the socket exists: %v", err)
	}
	if got.Name == "" || got.Runtime != "docker" {
		t.Errorf("Resolve = %+v", got)
	}

	srv.Close() // closing the listener removes the socket, as dockerd's shutdown does
	if _, err := os.Stat(path); err == nil {
		t.Fatalf("socket %s still there after the daemon stopped", path)
	}
	if _, err := r.Resolve(context.Background(), plainID); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Resolve after the socket went away: error = %v, want ErrUnavailable", err)
	}
}

func TestPodmanNotFound(t *testing.T) {
	r := newPodman(t, serve(t, podmanDaemon(t)))
	if _, err := r.Resolve(context.Background(), unknownID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Resolve(unknown) error = %v, want ErrNotFound", err)
	}
}
