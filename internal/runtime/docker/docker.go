// Package docker names containers through the Docker Engine API and the Podman API, over plain HTTP on the
// daemon's unix socket.
package docker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/cgroup"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/socket"
)

const (
	// DefaultDockerHost is where dockerd listens unless told otherwise.
	DefaultDockerHost = "unix:///var/run/docker.sock"
	// DefaultPodmanHost is the rootful podman.socket systemd unit's socket.
	DefaultPodmanHost = "unix:///run/podman/podman.sock"

	// maxBody bounds one API response. An inspect document is a few KiB, more with many mounts or a long
	// environment; 1 MiB is far beyond any real one.
	maxBody = 1 << 20
	// podmanAPI is the libpod API version asked for. Podman 4.x and 5.x serve it; its libpod endpoints need
	// a version in the path, unlike Docker's.
	podmanAPI = "v4.0.0"
)

// labelDockerType is cri-dockerd's label that tells a pod's sandbox ("podsandbox") from its containers
// ("container"); the other kubelet labels are attribution's.
const labelDockerType = "io.kubernetes.docker.type"

// Resolver names containers through one Docker or Podman daemon. It is safe for concurrent use.
type Resolver struct {
	name   string // runtime.ResolverDocker or ResolverPodman
	host   string // as configured, for errors
	client *http.Client
	podman bool
	// watch is set for the default socket, which need not exist: while it does not, Resolve answers
	// runtime.ErrUnavailable without dialling. A host that was given must exist; its absence is an error.
	watch *socket.Watch
}

var _ runtime.Resolver = (*Resolver)(nil)

// Config configures a Resolver.
type Config struct {
	// Host is the daemon's socket (unix:///path or a bare /path), which must exist. Empty: the default socket
	// (DefaultDockerHost, DefaultPodmanHost), which need not: until it does, Resolve answers
	// runtime.ErrUnavailable after one stat per socket.RecheckInterval, so a node without the daemon costs
	// nothing and counts no error.
	Host string
}

// New returns a Resolver for the Docker daemon. It does not connect: each Resolve does, so a daemon that starts
// later is still found.
func New(cfg Config) (*Resolver, error) {
	return newResolver(runtime.ResolverDocker, cfg.Host, DefaultDockerHost, false)
}

// NewPodman returns a Resolver for the Podman service, as New does for Docker. It uses the libpod API, which unlike
// Podman's Docker-compatible one says which pod a container is in.
func NewPodman(cfg Config) (*Resolver, error) {
	return newResolver(runtime.ResolverPodman, cfg.Host, DefaultPodmanHost, true)
}

func newResolver(name, host, fallback string, podman bool) (*Resolver, error) {
	optional := host == ""
	host = cmp.Or(host, fallback)
	path, err := socket.Path(host)
	if err != nil {
		return nil, fmt.Errorf("%s host: %w", name, err)
	}
	var watch *socket.Watch
	if optional {
		watch = socket.NewWatch([]string{path}, 0, nil)
	}
	transport := &http.Transport{
		// Every request goes to the socket whatever the URL says; the URL's host is only a name.
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConns:           2,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true,
		// Proxy is left nil: HTTP_PROXY from the environment must not capture a local socket's requests.
	}
	client := &http.Client{
		Transport: transport,
		// A daemon never redirects an inspect; following one would leave the socket.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &Resolver{name: name, host: host, client: client, podman: podman, watch: watch}, nil
}

// Name implements runtime.Resolver.
func (r *Resolver) Name() string { return r.name }

// Close drops idle connections to the daemon.
func (r *Resolver) Close() error {
	r.client.CloseIdleConnections()
	return nil
}

// Resolve implements runtime.Resolver.
func (r *Resolver) Resolve(ctx context.Context, containerID string) (runtime.Container, error) {
	if !cgroup.IsHex(containerID) {
		return runtime.Container{}, fmt.Errorf("%s: invalid container ID %q", r.name, containerID)
	}
	if r.watch != nil && !r.watch.Present() {
		return runtime.Container{}, fmt.Errorf("%s: no socket at %s: %w", r.name, r.host, runtime.ErrUnavailable)
	}
	c, err := r.resolve(ctx, containerID)
	if r.watch != nil && errors.Is(err, syscall.ENOENT) {
		// The daemon went away and took its socket with it: not an error, as if it had never been there.
		r.watch.Gone()
		return runtime.Container{}, fmt.Errorf("%w: %w", runtime.ErrUnavailable, err)
	}
	return c, err
}

func (r *Resolver) resolve(ctx context.Context, containerID string) (runtime.Container, error) {
	if r.podman {
		return r.resolvePodman(ctx, containerID)
	}
	var ctr inspect
	if err := r.get(ctx, "/containers/"+containerID+"/json", &ctr); err != nil {
		return runtime.Container{}, err
	}
	c := ctr.container()
	c.Runtime = r.name
	return c, nil
}

func (r *Resolver) resolvePodman(ctx context.Context, id string) (runtime.Container, error) {
	var ctr inspect
	if err := r.get(ctx, "/"+podmanAPI+"/libpod/containers/"+id+"/json", &ctr); err != nil {
		return runtime.Container{}, err
	}
	c := ctr.container()
	c.Runtime = r.name
	if ctr.Pod == "" || c.Pod != "" {
		return c, nil
	}
	if !cgroup.IsHex(ctr.Pod) {
		return runtime.Container{}, fmt.Errorf("%s: container %s has an invalid pod ID %q", r.name, id, ctr.Pod)
	}
	var p podInspect
	err := r.get(ctx, "/"+podmanAPI+"/libpod/pods/"+ctr.Pod+"/json", &p)
	if errors.Is(err, runtime.ErrNotFound) {
		// The pod went away between the two calls; the container is as good as gone too, but its name is known.
		return c, nil
	}
	if err != nil {
		// The container's own name is known: keep it, without the pod's name and labels, for now.
		return c, fmt.Errorf("%w: %w", runtime.ErrIncomplete, err)
	}
	c.Pod = p.Name
	if len(p.Labels) > 0 {
		c.PodLabels = maps.Clone(p.Labels)
	}
	return c, nil
}

// inspect is the part of a container inspect document that is used. Docker's /containers/{id}/json and Podman's
// libpod one share these fields; only Podman's has Pod (the pod's ID).
type inspect struct {
	Name   string `json:"Name"`
	Pod    string `json:"Pod"`
	Config struct {
		Labels map[string]string `json:"Labels"`
	} `json:"Config"`
}

// podInspect is the part of a Podman pod inspect document that is used.
type podInspect struct {
	Name   string            `json:"Name"`
	Labels map[string]string `json:"Labels"`
}

// container names an inspected container. One that carries kubelet's labels (cri-dockerd) is a Kubernetes
// container and is named by them, like the CRI would name it; pod labels are not on a container, so there are none.
func (ctr *inspect) container() runtime.Container {
	l := ctr.Config.Labels
	if c := runtime.KubernetesNames(l); c.PodUID != "" || c.Pod != "" {
		if l[labelDockerType] == "podsandbox" {
			// cri-dockerd names the pause container "POD"; the CRI gives a sandbox no container name.
			c.Name = ""
		}
		return c
	}
	return runtime.Container{Name: strings.TrimPrefix(ctr.Name, "/")}
}

// get fetches one JSON document into v. A 404 is ErrNotFound.
func (r *Resolver) get(ctx context.Context, path string, v any) error {
	// The host part names the daemon in logs only; requests are dialled to the socket.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.name+path, nil)
	if err != nil {
		return fmt.Errorf("%s GET %s: %w", r.name, path, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s GET %s on %s: %w", r.name, path, r.host, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("%s GET %s on %s: reading response: %w", r.name, path, r.host, err)
	}
	if len(body) > maxBody {
		return fmt.Errorf("%s GET %s on %s: response larger than %d bytes", r.name, path, r.host, maxBody)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return runtime.ErrNotFound
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%s GET %s on %s: %s: %s", r.name, path, r.host, resp.Status, errorMessage(body))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%s GET %s on %s: decoding response: %w", r.name, path, r.host, err)
	}
	return nil
}

// errorMessage returns the message of a Docker or Podman error body ({"message": "..."}), or a bounded prefix
// of the body when it is not one.
func errorMessage(body []byte) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil && e.Message != "" {
		return e.Message
	}
	const max = 200
	if len(body) > max {
		body = body[:max]
	}
	return strings.TrimSpace(string(body))
}
