// Package view is what `ps` and `top` show, in the user's words: a reading of one node, or of a whole cluster
// from Prometheus, as its nodes, GPUs, processes, workloads, health and signals. FromNode fills it from a node's
// reading; internal/cluster fills it from Prometheus; ps and top only render it. A workload, a GPU's health and the
// order of the signals are defined here once, so that the node's view and the cluster's cannot disagree.
package view

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Reading is one reading of a node, or of a cluster (Cluster: its nodes are listed, and every GPU, process and
// signal names its node).
type Reading struct {
	// Time is when the reading was taken: the node's, or the Prometheus server's evaluation time.
	Time      time.Time
	Cluster   bool
	Simulated bool
	// Nodes are a cluster's nodes, by name; Summarize fills in their counts.
	Nodes []Node
	// GPUs are by node, then index.
	GPUs []GPU
	// Processes are one per process per GPU, by node, GPU and PID.
	Processes []Process
	// AllocationsKnown is true when the kubelet's allocations were read for the node (for a cluster: for a node
	// of it): only then do the GPUs' allocation counts and the allocation signals mean anything.
	AllocationsKnown bool
	// Signals are what needs a person's attention, the most severe first (SortSignals).
	Signals []Signal
	// Warnings are what could not be read, one line each.
	Warnings []string
	// Duplicates counts the series read more than once and kept once: a node scraped by two jobs.
	Duplicates int
	// Dropped counts the values left out as unknown: not a number, infinite, or outside what the family can hold.
	Dropped int
	// History is the recent past of the GPUs and workloads, for sparklines; nil when none is kept.
	History *History
}

// NodeState is whether a node's readings are current.
type NodeState int

// The states of a node, by how much of it can be trusted.
const (
	NodeUp         NodeState = iota // its exporter answers and reads its GPUs
	NodeSourceDown                  // its exporter answers but cannot read the GPUs: no GPU series
	NodeDown                        // Prometheus cannot scrape its exporter (up == 0)
	NodeStale                       // its last reading is older than two scrape intervals
)

// Node is one node of a cluster.
type Node struct {
	Name  string
	State NodeState
	// Age is how long before the reading its last reading was taken; LastSeen is false when none was found.
	Age      time.Duration
	LastSeen bool
	// AllocationsKnown is true when its exporter reads the kubelet's allocations.
	AllocationsKnown bool
	Simulated        bool

	// Counted by Summarize from the node's GPUs and signals.
	GPUs, Busy, Unhealthy        int
	Utilization                  gpu.Value // the mean of its GPUs that report it
	MemoryUsed, MemoryTotal      gpu.Value // bytes, summed; unknown when a GPU of it does not report it
	IdleAllocations, Unrequested int
}

// Stale reports whether the node's readings are not current: its exporter is down or its last reading is old.
func (n Node) Stale() bool { return n.State == NodeDown || n.State == NodeStale }

// Problem says what is wrong with the node, "" when nothing is.
func (n Node) Problem() string {
	last := "no reading found"
	if n.LastSeen {
		last = "last reading " + Age(n.Age) + " ago"
	}
	switch n.State {
	case NodeSourceDown:
		return "its exporter cannot read the GPUs"
	case NodeDown:
		return "stale: exporter down, " + last
	case NodeStale:
		return "stale: " + last
	}
	return ""
}

// StateText is the node's state in a few words: "up", "stale 3m", "stale 40s (down)", "no GPU reading".
func (n Node) StateText() string {
	age := ""
	if n.LastSeen {
		age = " " + Age(n.Age)
	}
	switch n.State {
	case NodeSourceDown:
		return "no GPU reading"
	case NodeDown:
		return "stale" + age + " (down)"
	case NodeStale:
		return "stale" + age
	}
	return "up"
}

// GPU is one GPU.
type GPU struct {
	// Node is the GPU's node in a cluster reading.
	Node                    string
	Index                   int
	UUID                    string
	Name                    string    // without the "NVIDIA " every name starts with
	Utilization             gpu.Value // ratio
	MemoryUsed, MemoryTotal gpu.Value // bytes
	Temperature             gpu.Value // °C
	Power                   gpu.Value // W
	// MIG is true in MIG mode, with MIGInstances instances.
	MIG          bool
	MIGInstances int
	// MPS is true when MPS processes run on it.
	MPS bool
	// ProcessesListed is false when its process list could not be read: Workloads then means nothing.
	ProcessesListed bool
	// Workloads counts the distinct workloads (WorkloadOf) with processes on it, MIG instances included: what
	// gpu_workloads says.
	Workloads int
	// AllocatedPods counts the distinct pods the kubelet allocated it (or its MIG devices) to; Unrequested the pods
	// using it without an allocation; IdlePods the pods holding it and running nothing. AllocationsUnknown is true
	// when its node's allocations are not known while another node's are.
	AllocatedPods, Unrequested, IdlePods int
	AllocationsUnknown                   bool
	// Health names what is wrong with it now, the most serious first; empty when nothing is. Severity is the worst.
	Health   []string
	Severity Severity
}

// InUse reports whether a workload has processes on the GPU.
func (g GPU) InUse() bool { return g.ProcessesListed && g.Workloads > 0 }

// Mode says how the GPU is shared: "MIG ×3", "MPS ×2", "shared ×3" (time-slicing), "1 workload", "idle", or "?"
// when its process list could not be read. Workloads are counted as gpu_workloads counts them.
func (g GPU) Mode() string {
	switch {
	case g.MIG:
		return fmt.Sprintf("MIG ×%d", g.MIGInstances)
	case !g.ProcessesListed:
		return "?"
	case g.MPS:
		return fmt.Sprintf("MPS ×%d", g.Workloads)
	case g.Workloads > 1:
		return fmt.Sprintf("shared ×%d", g.Workloads)
	case g.Workloads == 1:
		return "1 workload"
	}
	return "idle"
}

// Where names the GPU for a sentence: "GPU 3", or "GPU 3 of gpu-a" in a cluster.
func (g GPU) Where() string { return where(g.Node, strconv.Itoa(g.Index)) }

func where(node, gpuColumn string) string {
	if node == "" {
		return "GPU " + gpuColumn
	}
	return "GPU " + gpuColumn + " of " + node
}

// Process is one process on one GPU.
type Process struct {
	// Node is the process's node in a cluster reading.
	Node string
	GPU  int
	UUID string
	PID  uint32
	// Name is the process name; Type its type on the GPU (compute, graphics, compute+graphics, mps).
	Name, Type string
	Memory     gpu.Value // bytes
	SM         gpu.Value // ratio
	// MIG is true on a MIG instance, named by GPUInstance and ComputeInstance.
	MIG                          bool
	GPUInstance, ComputeInstance int
	// Started is when the process started; zero when unknown.
	Started  time.Time
	Identity attribution.Identity
}

// GPUColumn names the process's GPU: "3", or "2:1/0" for GPU 2's MIG device of GPU instance 1, compute instance 0.
func (p *Process) GPUColumn() string {
	return GPUColumn(p.GPU, p.MIG, p.GPUInstance, p.ComputeInstance)
}

// GPUColumn names a GPU or a MIG device of it: "3", "2:1/0".
func GPUColumn(index int, mig bool, gi, ci int) string {
	s := strconv.Itoa(index)
	if mig {
		s += ":" + strconv.Itoa(gi) + "/" + strconv.Itoa(ci)
	}
	return s
}

// Owner is the process's owner in the user's words.
func (p *Process) Owner() Owner { return OwnerOf(&p.Identity) }

// Owner names a workload: a kind ("pod", "container", "slurm job", "service") and its names, from the broadest to
// the narrowest (a pod's namespace, pod and container).
type Owner struct {
	// Kind is "pod", "pod uid", "container", "slurm job", "service" or "namespace"; "" when nothing is known.
	Kind  string
	Names []string
}

// The kinds of owner.
const (
	KindPod       = "pod"
	KindPodUID    = "pod uid"
	KindContainer = "container"
	KindSlurmJob  = "slurm job"
	KindService   = "service"
	KindNamespace = "namespace"
)

// OwnerOf names an identity's workload: its Kubernetes pod and container, its pod's UID where no runtime named
// the pod, a plain container, a Slurm job or a systemd service.
func OwnerOf(id *attribution.Identity) Owner {
	switch {
	case id.Pod != "":
		names := []string{id.Namespace, id.Pod}
		if id.Container != "" {
			names = append(names, id.Container)
		}
		return Owner{KindPod, names}
	case id.PodUID != "":
		return Owner{KindPodUID, []string{id.PodUID}}
	case id.Container != "":
		return Owner{KindContainer, []string{id.Container}}
	case id.SlurmJobID != "":
		return Owner{KindSlurmJob, []string{id.SlurmJobID}}
	case id.SystemdUnit != "":
		return Owner{KindService, []string{id.SystemdUnit}}
	case id.ContainerID != "":
		return Owner{KindContainer, nil}
	}
	return Owner{}
}

// String is the OWNER column in full: "pod ml/train-0/trainer", "container web", "slurm job 88231", "service
// ollama.service", "container" (an unnamed one), or "-".
func (o Owner) String() string {
	if o.Kind == "" {
		return "-"
	}
	if len(o.Names) == 0 {
		return o.Kind
	}
	return o.Kind + " " + strings.Join(o.Names, "/")
}

// Severity orders what needs attention, the most urgent first.
type Severity int

// The severities, most urgent first.
const (
	// Fault: a GPU that needs a reset, a reboot or a replacement, or reported a critical XID.
	Fault Severity = iota
	// Misuse: a pod using a GPU no allocation gives it, which costs someone else their GPU.
	Misuse
	// Unreadable: a node whose readings are stale or whose exporter cannot read its GPUs.
	Unreadable
	// Degraded: a GPU held down by heat or power, or with a link below its best.
	Degraded
	// Waste: an allocation holding a GPU idle.
	Waste
	// Healthy: nothing is wrong.
	Healthy
)

// SignalKind is what a signal is about.
type SignalKind int

// The kinds of signal.
const (
	GPUHealth      SignalKind = iota // a GPU's health problems
	Unrequested                      // a pod uses a GPU that no allocation gives it
	NodeProblem                      // a node of a cluster is stale, or cannot read its GPUs
	IdleAllocation                   // a pod holds a GPU and runs nothing on it
)

// Signal is one thing that needs a person's attention.
type Signal struct {
	Kind     SignalKind
	Severity Severity
	// Node is the node of a cluster reading.
	Node string
	// GPU is as the GPU column writes it ("3", "2:1/0"); empty for a node's problem.
	GPU string
	// Text is the pod's container (namespace/pod/container) of an allocation signal, the problems of a GPU, or the
	// problem of a node.
	Text string
	// Namespace, Pod and Container are an allocation signal's pod and container, as Text writes them.
	Namespace, Pod, Container string
	gpuIndex                  int
}

func (s Signal) String() string {
	switch s.Kind {
	case GPUHealth:
		return where(s.Node, s.GPU) + ": " + s.Text
	case Unrequested:
		return "unrequested use: " + s.Text + " on " + where(s.Node, s.GPU)
	case NodeProblem:
		return "node " + s.Node + ": " + s.Text
	}
	return "idle allocation: " + s.Text + " holds " + where(s.Node, s.GPU)
}

// SortSignals orders signals by severity (a GPU that needs a reset first, an idle allocation last), then by node
// and GPU.
func SortSignals(sigs []Signal) {
	slices.SortStableFunc(sigs, func(x, y Signal) int {
		return cmp.Or(cmp.Compare(x.Severity, y.Severity), cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.Node, y.Node),
			cmp.Compare(x.gpuIndex, y.gpuIndex), cmp.Compare(x.GPU, y.GPU), cmp.Compare(x.Text, y.Text))
	})
}

// AllocationSignal is a signal about one pod's container on a GPU or a MIG device of it: Unrequested or
// IdleAllocation.
func AllocationSignal(kind SignalKind, node string, index int, mig bool, gi, ci int, namespace, pod, container string) Signal {
	sev := Waste
	if kind == Unrequested {
		sev = Misuse
	}
	return Signal{Kind: kind, Severity: sev, Node: node, GPU: GPUColumn(index, mig, gi, ci),
		Text: namespace + "/" + pod + "/" + container, Namespace: namespace, Pod: pod, Container: container, gpuIndex: index}
}

// HealthSignal is the signal of a GPU with health problems; ok is false for a healthy GPU.
func HealthSignal(g *GPU) (s Signal, ok bool) {
	if len(g.Health) == 0 {
		return Signal{}, false
	}
	return Signal{Kind: GPUHealth, Severity: g.Severity, Node: g.Node, GPU: strconv.Itoa(g.Index),
		Text: strings.Join(g.Health, ", "), gpuIndex: g.Index}, true
}
