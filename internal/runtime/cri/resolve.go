package cri

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
)

// Name implements runtime.Resolver.
func (r *Resolver) Name() string { return runtime.ResolverCRI }

// Resolve implements runtime.Resolver. Each endpoint is asked in turn until one knows the container;
// ErrNotFound means every endpoint answered that it does not, and any endpoint that failed to answer makes
// the result an error instead, since that runtime may well own the container. With no socket to ask, the answer
// is runtime.ErrUnavailable.
func (r *Resolver) Resolve(ctx context.Context, containerID string) (runtime.Container, error) {
	eps := r.active()
	if len(eps) == 0 {
		return runtime.Container{}, fmt.Errorf("no CRI socket among %s: %w",
			strings.Join(r.candidates, ", "), runtime.ErrUnavailable)
	}
	var errs []error
	for _, ep := range eps {
		c, err := ep.resolve(ctx, containerID)
		if err == nil || errors.Is(err, runtime.ErrIncomplete) {
			return c, err
		}
		if !errors.Is(err, runtime.ErrNotFound) {
			errs = append(errs, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) > 0 {
		return runtime.Container{}, errors.Join(errs...)
	}
	return runtime.Container{}, runtime.ErrNotFound
}

func (ep *endpoint) resolve(ctx context.Context, id string) (runtime.Container, error) {
	resp, err := ep.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if isNotFound(err) {
		// The ID may be a pod sandbox's (the pause container): those are not containers to the CRI.
		return ep.resolveSandbox(ctx, id)
	}
	if err != nil {
		return runtime.Container{}, fmt.Errorf("CRI ContainerStatus on %s: %w", ep.name, err)
	}
	st := resp.GetStatus()
	if st == nil {
		return runtime.Container{}, fmt.Errorf("CRI ContainerStatus on %s: empty status for %s", ep.name, id)
	}
	c := runtime.KubernetesNames(st.GetLabels())
	c.Runtime = ep.runtimeName(ctx)
	if c.Name == "" {
		// Not created by kubelet (crictl, a test harness): the CRI metadata name is all there is.
		c.Name = st.GetMetadata().GetName()
	}
	if c.PodUID == "" {
		return c, nil
	}
	p, ok, err := ep.pod(ctx, c.PodUID)
	if err != nil {
		// The container's names are known: keep them, without the pod's labels, for now.
		return c, fmt.Errorf("%w: %w", runtime.ErrIncomplete, err)
	}
	if ok {
		c.PodLabels = maps.Clone(p.labels)
		c.Namespace = cmp.Or(c.Namespace, p.namespace)
		c.Pod = cmp.Or(c.Pod, p.name)
	}
	return c, nil
}

// resolveSandbox names a pod sandbox (pause container) ID: the pod, with no container name.
func (ep *endpoint) resolveSandbox(ctx context.Context, id string) (runtime.Container, error) {
	resp, err := ep.client.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if isNotFound(err) {
		return runtime.Container{}, runtime.ErrNotFound
	}
	if err != nil {
		return runtime.Container{}, fmt.Errorf("CRI PodSandboxStatus on %s: %w", ep.name, err)
	}
	st := resp.GetStatus()
	if st == nil {
		return runtime.Container{}, fmt.Errorf("CRI PodSandboxStatus on %s: empty status for %s", ep.name, id)
	}
	p := ep.podFromSandbox(st.GetMetadata(), st.GetLabels())
	if p.uid != "" {
		ep.pods.put(podKey{ep.name, p.uid}, p)
	}
	return runtime.Container{Namespace: p.namespace, Pod: p.name, PodUID: p.uid, PodLabels: maps.Clone(p.labels),
		Runtime: ep.runtimeName(ctx)}, nil
}

// runtimeName asks the runtime once what it is: with the cgroupfs driver a pod's cgroup path does not say. A
// runtime that does not answer is asked again next time; one that answers with a name docs/reference.md does not know, or
// does not implement Version, is left unnamed. The call is made outside ep.mu, so that lookups do not queue
// behind it; concurrent first lookups may each ask, and agree.
func (ep *endpoint) runtimeName(ctx context.Context) string {
	ep.mu.Lock()
	done, runtime := ep.runtimeDone, ep.runtime
	ep.mu.Unlock()
	if done {
		return runtime
	}
	resp, err := ep.client.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil && status.Code(err) != codes.Unimplemented {
		return ""
	}
	switch name := resp.GetRuntimeName(); name {
	case "containerd", "docker":
		runtime = name
	case "cri-o":
		runtime = "crio"
	}
	ep.mu.Lock()
	ep.runtimeDone, ep.runtime = true, runtime
	ep.mu.Unlock()
	return runtime
}

// pod returns the pod with this UID, from the cache or the runtime. ok is false when the runtime has no sandbox
// for it (the sandbox was removed while a container lingers).
//
// The CRI's ContainerStatus does not say which sandbox a container belongs to, but kubelet labels every sandbox
// with its pod's UID, so one ListPodSandbox filtered on that label answers in a single call.
func (ep *endpoint) pod(ctx context.Context, uid string) (pod, bool, error) {
	if p, ok := ep.pods.get(podKey{ep.name, uid}); ok {
		return p, true, nil
	}
	resp, err := ep.client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{runtime.LabelPodUID: uid}},
	})
	if err != nil {
		return pod{}, false, fmt.Errorf("CRI ListPodSandbox on %s: %w", ep.name, err)
	}
	// A pod whose sandbox was recreated has several until kubelet removes the old ones; the newest is current.
	var newest *runtimeapi.PodSandbox
	for _, s := range resp.GetItems() {
		if s.GetMetadata().GetUid() != uid && s.GetLabels()[runtime.LabelPodUID] != uid {
			continue // a runtime that ignored the filter
		}
		if newest == nil || s.GetCreatedAt() > newest.GetCreatedAt() {
			newest = s
		}
	}
	if newest == nil {
		return pod{}, false, nil
	}
	p := ep.podFromSandbox(newest.GetMetadata(), newest.GetLabels())
	p.uid = uid
	ep.pods.put(podKey{ep.name, uid}, p)
	return p, true, nil
}

// podFromSandbox reads a pod's identity from its sandbox, with the allowlisted labels only: the rest is not kept.
// A sandbox's labels are the pod's labels plus kubelet's io.kubernetes.* ones, which are never pod labels. The
// strings are copied, so that a cached pod holds nothing of the runtime's answer.
func (ep *endpoint) podFromSandbox(md *runtimeapi.PodSandboxMetadata, labels map[string]string) pod {
	p := pod{
		namespace: strings.Clone(cmp.Or(md.GetNamespace(), labels[runtime.LabelPodNamespace])),
		name:      strings.Clone(cmp.Or(md.GetName(), labels[runtime.LabelPodName])),
		uid:       strings.Clone(cmp.Or(md.GetUid(), labels[runtime.LabelPodUID])),
	}
	for k, v := range labels {
		if !ep.podLabels[k] || strings.HasPrefix(k, runtime.KubernetesLabelPrefix) {
			continue
		}
		if p.labels == nil {
			p.labels = make(map[string]string, len(ep.podLabels))
		}
		p.labels[strings.Clone(k)] = strings.Clone(v)
	}
	return p
}

// isNotFound reports whether err is the runtime saying it does not know the ID. containerd and CRI-O answer
// codes.NotFound; cri-dockerd passes Docker's error through as codes.Unknown.
func isNotFound(err error) bool {
	if err == nil {
		return false
	}
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.NotFound:
		return true
	case codes.Unknown:
		return strings.Contains(s.Message(), "No such container")
	}
	return false
}
