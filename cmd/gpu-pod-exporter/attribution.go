package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime/cri"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime/docker"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/socket"
)

// attributionFlags configure how GPU processes are attributed to their owners.
type attributionFlags struct {
	procfs    string
	procfsSet bool
	// readsNode reports whether this node's processes are read: not on the demo node, whose processes are all
	// preset, nor in the cluster view.
	readsNode        func() bool
	runtimeEndpoints []string
	dockerHost       string
	podmanHost       string
	podLabels        []string
	users            attribution.UserResolver // nil without --collector.process-user
	kept             *procfs.KeptFiles        // the budget of process files kept open; set before open
}

func (f *attributionFlags) register(app flagHost) {
	app.Flag("path.procfs", "The host's proc filesystem; /host/proc when running in a container without hostPID.").
		Default("/proc").IsSetByUser(&f.procfsSet).StringVar(&f.procfs)
	app.Flag("runtime.endpoint", "CRI socket, e.g. unix:///run/containerd/containerd.sock (repeatable). Default: those of "+
		"containerd's, CRI-O's, cri-dockerd's and k3s' usual sockets that exist, looked for again while none does.").
		StringsVar(&f.runtimeEndpoints)
	app.Flag("docker.host", "Docker API socket, for containers outside Kubernetes. Default: "+docker.DefaultDockerHost+
		" when it exists (looked for again while it does not).").PlaceHolder("URL").StringVar(&f.dockerHost)
	app.Flag("podman.host", "Podman API socket, for containers outside Kubernetes. Default: "+docker.DefaultPodmanHost+
		" when it exists (looked for again while it does not).").PlaceHolder("URL").StringVar(&f.podmanHost)
	app.Flag("kubernetes.pod-labels", "Pod labels to add as label_<key> to process and workload series "+
		"(comma-separated, repeatable). None by default.").PlaceHolder("KEY,...").StringsVar(&f.podLabels)
}

// open builds the attributor with a resolver for each runtime: the configured sockets, else the default ones,
// which need not exist yet. A runtime whose default socket is absent is asked nothing and counts no error (its
// containers keep the labels their cgroup paths give) until the socket appears.
// Owners that the source presets (the simulated node's) are kept as they are; the demo node's are all preset, so it
// asks no runtime. `ps` runs once, so it waits for names as long as one
// runtime call may take instead of leaving them to a next scrape that never comes.
func (f *attributionFlags) open(logger *slog.Logger, preset attribution.Preset, demo, once bool) (*attribution.Attributor, error) {
	cfg := attribution.Config{ProcFS: f.procfs, Preset: preset, PodLabels: splitList(f.podLabels), Users: f.users,
		KeptFiles: f.kept, Logger: logger}
	if once {
		cfg.LookupBudget = attribution.DefaultLookupTimeout
	}
	if demo {
		return attribution.New(cfg), nil
	}
	procfs.WarnIfHidepid(f.procfs, logger)
	c, err := cri.New(cri.Config{Endpoints: f.runtimeEndpoints, PodLabels: cfg.PodLabels, Logger: logger})
	if err != nil {
		return nil, err
	}
	d, err := docker.New(docker.Config{Host: f.dockerHost})
	if err != nil {
		return nil, err
	}
	p, err := docker.NewPodman(docker.Config{Host: f.podmanHost})
	if err != nil {
		return nil, err
	}
	cfg.Resolvers = []runtime.Resolver{c, d, p}
	return attribution.New(cfg), nil
}

// readsProcFS reports whether procfs is read, and so checked: where this node's processes are read, and otherwise
// only when given, so that the demo and the cluster view run where there is no /proc (macOS).
func (f *attributionFlags) readsProcFS() bool { return f.readsNode() || f.procfsSet }

// check validates procfs and the runtime sockets' syntax before anything starts.
func (f *attributionFlags) check() error {
	if f.readsProcFS() {
		if _, err := checkProcFS(f.procfs, procfs.IsProcFS); err != nil {
			return err
		}
	}
	for _, e := range f.runtimeEndpoints {
		if _, err := checkSocketFlag("runtime.endpoint", e); err != nil {
			return err
		}
	}
	if _, err := checkSocketFlag("docker.host", f.dockerHost); err != nil {
		return err
	}
	_, err := checkSocketFlag("podman.host", f.podmanHost)
	return err
}

// warnings are what the attribution flags point at that is not there (yet).
func (f *attributionFlags) warnings() []string {
	var ws []string
	if f.readsProcFS() {
		if w, _ := checkProcFS(f.procfs, procfs.IsProcFS); w != "" {
			ws = append(ws, "--path.procfs: "+w)
		}
	}
	for _, flag := range []struct{ name, value string }{
		{"docker.host", f.dockerHost}, {"podman.host", f.podmanHost},
	} {
		if missing, _ := checkSocketFlag(flag.name, flag.value); missing != "" {
			ws = append(ws, fmt.Sprintf("--%s: no socket at %s yet; its containers get no names until it appears", flag.name, missing))
		}
	}
	for _, e := range f.runtimeEndpoints {
		if missing, _ := checkSocketFlag("runtime.endpoint", e); missing != "" {
			ws = append(ws, fmt.Sprintf("--runtime.endpoint: no socket at %s yet; its containers get no names until it appears", missing))
		}
	}
	return ws
}

// runtimes lists, for the startup summary, the runtime sockets that exist now: those given by flag, else the
// default ones (looked for again later).
func (f *attributionFlags) runtimes() []string {
	candidates := append([]string(nil), f.runtimeEndpoints...)
	if len(candidates) == 0 {
		candidates = cri.DefaultEndpoints()
	}
	candidates = append(candidates, cmp.Or(f.dockerHost, docker.DefaultDockerHost), cmp.Or(f.podmanHost, docker.DefaultPodmanHost))
	var found []string
	for _, e := range candidates {
		if path, err := socket.Path(e); err == nil && socket.Exists(path) {
			found = append(found, path)
		}
	}
	if len(found) == 0 {
		return []string{"none"}
	}
	return found
}

// splitList accepts both --flag=a,b and --flag=a --flag=b.
func splitList(values []string) []string {
	var out []string
	for _, v := range values {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}
