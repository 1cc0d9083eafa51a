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

// IdentityLabel is one value of an identity as the outputs name it: a label of process and workload series, a key
// of `ps --output json`. IdentityLabels lists them all, once; every output that writes identities walks it.
type IdentityLabel struct {
	Name  string
	Use   Use
	field identityField
}

// identityField names a string of Identity. A label reads its field through one switch rather than a
// func(*Identity) *string: a call through a func value makes the compiler move every identity it is given to the
// heap, which would cost an allocation per process and per series of every scrape.
type identityField uint8

const (
	namespaceField identityField = iota
	podField
	containerField
	podUIDField
	containerIDField
	runtimeField
	qosField
	slurmJobIDField
	systemdUnitField
	userField
)

// Use says where a label appears. A label of no output is still made valid UTF-8 with the others.
type Use uint8

const (
	// OnProcesses: a label of every process series (gpu_process_*).
	OnProcesses Use = 1 << iota
	// OnWorkloads: a label of every workload series (gpu_workload_*), and part of the WorkloadKey.
	OnWorkloads
	// InPS: a key of `ps --output json`, after its process keys.
	InPS
	// OptIn: on series only when asked for (--collector.process-user); set in the identity only then, too.
	OptIn
)

// Get returns the label's value in id, to read or to set.
func (l IdentityLabel) Get(id *Identity) *string {
	switch l.field {
	case namespaceField:
		return &id.Namespace
	case podField:
		return &id.Pod
	case containerField:
		return &id.Container
	case podUIDField:
		return &id.PodUID
	case containerIDField:
		return &id.ContainerID
	case runtimeField:
		return &id.Runtime
	case qosField:
		return &id.QoS
	case slurmJobIDField:
		return &id.SlurmJobID
	case systemdUnitField:
		return &id.SystemdUnit
	case userField:
		return &id.User
	}
	panic("attribution: identity label without a field")
}

// IdentityLabels are the identity's values, in the order in which series and `ps --output json` write them.
var IdentityLabels = []IdentityLabel{
	{"namespace", OnProcesses | OnWorkloads | InPS, namespaceField},
	{"pod", OnProcesses | OnWorkloads | InPS, podField},
	{"container", OnProcesses | OnWorkloads | InPS, containerField},
	{"pod_uid", OnProcesses | OnWorkloads | InPS, podUIDField},
	// Not on workload series: a container that restarts gets a new ID, and its workload must keep its series.
	{"container_id", OnProcesses | InPS, containerIDField},
	{"runtime", InPS, runtimeField},
	{"qos", 0, qosField},
	{"slurm_job_id", OnProcesses | OnWorkloads | InPS, slurmJobIDField},
	{"systemd_unit", OnProcesses | OnWorkloads | InPS, systemdUnitField},
	{"user", OnProcesses | OnWorkloads | InPS | OptIn, userField},
}

// workloadLabels are the IdentityLabels OnWorkloads: the fields of a WorkloadKey.
var workloadLabels = func() []IdentityLabel {
	var ls []IdentityLabel
	for _, l := range IdentityLabels {
		if l.Use&OnWorkloads != 0 {
			ls = append(ls, l)
		}
	}
	return ls
}()

// WorkloadKey is a comparable form of the identity, used to group processes into workloads: the values of the
// labels OnWorkloads, in their order. It leaves out the container ID, so that a workload (a pod's container, a named
// container, a Slurm job, a service) stays the same workload when its container restarts.
type WorkloadKey [7]string

// Key returns the workload key of the identity.
func (id Identity) Key() WorkloadKey {
	var k WorkloadKey
	for i, l := range workloadLabels {
		k[i] = *l.Get(&id)
	}
	return k
}

// IsKubernetes reports whether the owner is a Kubernetes pod. Pod alone is not enough: a Podman pod has a name
// but neither a namespace nor a Kubernetes UID.
func (id Identity) IsKubernetes() bool { return id.PodUID != "" || id.Namespace != "" }

// validUTF8 returns the identity with every value made valid UTF-8, invalid bytes replaced by U+FFFD. A label value
// must be valid UTF-8, or the whole series fails to export; the cgroup path is the user's to name below a
// delegated subtree (a "\xff.service" unit), and runtimes and the user database pass names through.
func (id Identity) validUTF8() Identity {
	if id.isValidUTF8() {
		return id // the common case: no copy
	}
	for _, l := range IdentityLabels {
		v := l.Get(&id)
		*v = strings.ToValidUTF8(*v, "\uFFFD")
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

func (id *Identity) isValidUTF8() bool {
	for _, l := range IdentityLabels {
		if !utf8.ValidString(*l.Get(id)) {
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
