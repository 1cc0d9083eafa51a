package main

import (
	"context"
	"log/slog"

	"github.com/alecthomas/kingpin/v2"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
)

// attributionFlags configure how GPU processes are attributed to their owners.
type attributionFlags struct {
	procfs           string
	runtimeEndpoints []string
	dockerHost       string
	podmanHost       string
	podLabels        []string
}

func (f *attributionFlags) register(app *kingpin.Application) {
	app.Flag("path.procfs", "The host's proc filesystem; /host/proc when running in a container without hostPID.").
		Default("/proc").StringVar(&f.procfs)
	app.Flag("runtime.endpoint", "CRI socket (repeatable); by default the usual containerd, CRI-O and cri-dockerd sockets are probed.").
		StringsVar(&f.runtimeEndpoints)
	app.Flag("docker.host", "Docker API socket, for containers outside Kubernetes.").
		Default("unix:///var/run/docker.sock").StringVar(&f.dockerHost)
	app.Flag("podman.host", "Podman API socket, for containers outside Kubernetes.").
		Default("unix:///run/podman/podman.sock").StringVar(&f.podmanHost)
	app.Flag("kubernetes.pod-labels", "Comma-separated pod labels to add as label_<key> to process and workload series.").
		PlaceHolder("KEY,...").StringsVar(&f.podLabels)
}

func (f *attributionFlags) open(ctx context.Context, logger *slog.Logger) (*attribution.Attributor, error) {
	return attribution.New(attribution.Config{ProcFS: f.procfs, Logger: logger}), nil
}
