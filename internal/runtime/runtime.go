// Package runtime is what attribution asks of a container runtime, and what the runtimes (internal/runtime/cri,
// internal/runtime/docker) answer: a container's names, by its ID, and the answers that are not failures.
package runtime

import (
	"context"
	"errors"
)

// ErrNotFound is returned by a Resolver when its runtime does not know the container.
var ErrNotFound = errors.New("container not found")

// ErrUnavailable is returned by a Resolver whose runtime is not there at all: it has no socket (a node without
// Docker, a runtime that has not started yet). Like ErrNotFound it is a definite, cheap answer: it is counted as
// result="unavailable", not as an error, and is not logged.
var ErrUnavailable = errors.New("container runtime not present")

// ErrIncomplete is wrapped by the error of a Resolver that named the container but could not learn all of it
// (the pod's labels when the pod lookup failed). The Container returned with it is used, counted as an error, and
// looked up again after the negative TTL.
var ErrIncomplete = errors.New("incomplete answer")

// Container is what a container runtime knows about one container.
type Container struct {
	// Namespace, Pod and PodUID are set for Kubernetes containers (from the CRI, or from the io.kubernetes.* labels
	// of a Docker container created by cri-dockerd); Pod is also a Podman pod's name.
	Namespace string
	Pod       string
	PodUID    string
	// Name is the Kubernetes container name, or a plain Docker/Podman container's name (without the leading "/").
	Name string
	// PodLabels are the pod's labels: the allowlisted ones where the resolver was given the allowlist (the CRI's,
	// which caches pods), else all of them; attribution keeps only the allowlisted ones.
	PodLabels map[string]string
	// Runtime is the runtime that answered (containerd, crio, docker, podman), for cgroup paths that do not say:
	// the cgroupfs driver writes /kubepods/pod<uid>/<id> with no runtime prefix. Empty when unknown.
	Runtime string
}

// The labels the kubelet puts on every container and pod sandbox it creates; cri-dockerd (and dockershim before
// it) keeps them on Docker containers.
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"
	// KubernetesLabelPrefix marks the labels that the kubelet or the runtime adds on top of a pod's own.
	KubernetesLabelPrefix = "io.kubernetes."
)

// KubernetesNames returns the names that a container's kubelet labels give: all empty for a container that the
// kubelet did not create.
func KubernetesNames(labels map[string]string) Container {
	return Container{
		Namespace: labels[LabelPodNamespace],
		Pod:       labels[LabelPodName],
		PodUID:    labels[LabelPodUID],
		Name:      labels[LabelContainerName],
	}
}

// Resolver names: what Resolver.Name returns, the resolver label of the self-metrics, and what routes a container
// to the resolvers of its runtime.
const (
	ResolverCRI    = "cri"
	ResolverDocker = "docker"
	ResolverPodman = "podman"
)

// Resolver names containers through one container runtime's API.
type Resolver interface {
	// Name is the resolver's name in self-metrics and logs: ResolverCRI, ResolverDocker or ResolverPodman.
	Name() string
	// Resolve looks up one container by its full 64-hex ID. It returns ErrNotFound when the runtime does not know
	// the container (a definite answer, cached briefly), ErrUnavailable when the runtime is not present, an error
	// wrapping ErrIncomplete with a usable Container when only part of the lookup succeeded, any other error when
	// the runtime could not be asked, and it honours ctx's deadline.
	Resolve(ctx context.Context, containerID string) (Container, error)
}

// LabelAllowlist is the set of pod label keys kept (--kubernetes.pod-labels): the others are dropped as soon as a
// runtime has answered, before anything keeps them.
type LabelAllowlist map[string]bool

// NewLabelAllowlist returns the allowlist of keys.
func NewLabelAllowlist(keys []string) LabelAllowlist {
	l := make(LabelAllowlist, len(keys))
	for _, k := range keys {
		l[k] = true
	}
	return l
}

// Keep returns a new map of the allowlisted labels, nil when there are none.
func (l LabelAllowlist) Keep(labels map[string]string) map[string]string {
	var out map[string]string
	for k, v := range labels {
		if l[k] {
			if out == nil {
				out = make(map[string]string, min(len(l), len(labels)))
			}
			out[k] = v
		}
	}
	return out
}

// PodCache is a Resolver that keeps what it learned of pods between lookups (the CRI resolver keeps sandboxes, so
// that the containers of one pod cost one sandbox lookup). After each reading that lists every GPU process,
// attribution calls KeepPods with the UIDs of the pods that reading's processes are in; the resolver forgets the
// others, so that what it keeps follows the node's GPU pods rather than every pod it was ever asked about.
type PodCache interface {
	KeepPods(uids map[string]bool)
}
