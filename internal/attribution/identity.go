package attribution

import (
	"strings"
	"unicode/utf8"
)

// Identity is who owns a GPU process, as the identity labels of docs/reference.md name it: its Kubernetes pod and container, plain
// container, Slurm job or systemd service. Every field is empty when unknown.
type Identity struct {
	Namespace   string
	Pod         string
	Container   string // Kubernetes container name, or a plain Docker/Podman container's name
	PodUID      string
	ContainerID string
	Runtime     string // containerd, crio, docker, podman
	QoS         string // guaranteed, burstable, besteffort
	SlurmJobID  string
	SystemdUnit string
	// User is the process owner's user name, or its numeric uid when the node's user database does not name it;
	// set only with --collector.process-user.
	User string
	// PodLabels holds the allowlisted pod labels (--kubernetes.pod-labels), keyed by the pod label's key.
	PodLabels map[string]string
}

// WorkloadKey is a comparable form of the identity, used to group processes into workloads. It leaves out the
// container ID, so that a workload (a pod's container, a named container, a Slurm job, a service) stays the same
// workload when its container restarts.
type WorkloadKey struct {
	Namespace, Pod, Container, PodUID, SlurmJobID, SystemdUnit, User string
}

// Key returns the workload key of the identity.
func (id Identity) Key() WorkloadKey {
	return WorkloadKey{id.Namespace, id.Pod, id.Container, id.PodUID, id.SlurmJobID, id.SystemdUnit, id.User}
}

// IsKubernetes reports whether the owner is a Kubernetes pod. Pod alone is not enough: a Podman pod has a name
// but neither a namespace nor a Kubernetes UID.
func (id Identity) IsKubernetes() bool { return id.PodUID != "" || id.Namespace != "" }

// labelAllowlist is the set of pod label keys kept in Identity.PodLabels (--kubernetes.pod-labels).
type labelAllowlist map[string]bool

func newLabelAllowlist(keys []string) labelAllowlist {
	l := make(labelAllowlist, len(keys))
	for _, k := range keys {
		l[k] = true
	}
	return l
}

// keep returns the allowlisted labels, nil when there are none. The map is shared by every identity of the
// container: read-only.
func (l labelAllowlist) keep(labels map[string]string) map[string]string {
	if len(l) == 0 || len(labels) == 0 {
		return nil
	}
	out := make(map[string]string)
	for k, v := range labels {
		if l[k] {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// validUTF8 returns the identity with every value made valid UTF-8, invalid bytes replaced by U+FFFD. A label value
// must be valid UTF-8, or the whole series fails to export; the cgroup path is the user's to name below a
// delegated subtree (a "\xff.service" unit), and runtimes pass names through.
func (id Identity) validUTF8() Identity {
	if id.isValidUTF8() {
		return id // the common case: no copy
	}
	for _, f := range []*string{&id.Namespace, &id.Pod, &id.Container, &id.PodUID, &id.ContainerID, &id.Runtime,
		&id.QoS, &id.SlurmJobID, &id.SystemdUnit} {
		*f = strings.ToValidUTF8(*f, "\uFFFD")
	}
	if len(id.PodLabels) > 0 {
		labels := make(map[string]string, len(id.PodLabels)) // the original is shared by the container's identities
		for k, v := range id.PodLabels {
			labels[strings.ToValidUTF8(k, "\uFFFD")] = strings.ToValidUTF8(v, "\uFFFD")
		}
		id.PodLabels = labels
	}
	return id
}

func (id Identity) isValidUTF8() bool {
	for _, s := range []string{id.Namespace, id.Pod, id.Container, id.PodUID, id.ContainerID, id.Runtime, id.QoS,
		id.SlurmJobID, id.SystemdUnit} {
		if !utf8.ValidString(s) {
			return false
		}
	}
	for k, v := range id.PodLabels {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return false
		}
	}
	return true
}
