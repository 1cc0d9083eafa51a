package cluster

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/promapi"
)

// Window is how far back a node is looked for: a node whose exporter has written nothing for an hour, and whose
// target Prometheus no longer scrapes, has left the cluster.
const Window = time.Hour

// recentWindow is the span over which the time of a node's last reading is found to the second.
const recentWindow = 2 * time.Minute

// intervalWindow is the span over which a target's scrape interval is measured, by counting its samples of up.
const intervalWindow = 10 * time.Minute

// query is one of the fixed instant queries a reading makes. Each is written once here, with the selector in
// every vector selector and the node label in every grouping; the number of queries does not grow with the nodes.
type query struct {
	name string
	// top: only the top view needs it; ps reads the others.
	top bool
	// followUp: asked only when the others' answers call for it, at most once per reading.
	followUp bool
	// expr writes the PromQL.
	expr func(q exprs) string
}

// exprs fills in the parts of the queries that depend on the configuration.
type exprs struct {
	sel        promapi.Selector
	by         string // the labels a node is known by, for by (…)
	resolution time.Duration
}

func (q exprs) s(more ...string) string { return q.sel.With(more...) }

// exporters is the selector of the series every exporter writes once per scrape, whatever it reads.
func (q exprs) exporters() string { return "gpu_pod_exporter_build_info" + q.s() }

// exporterJobs are the jobs that scrape exporters: up of their targets is the exporters' up, and no other
// target's (node-exporter's on the same node, for instance).
func (q exprs) exporterJobs() string {
	return fmt.Sprintf("group by (job) (last_over_time(%s[%s]))", q.exporters(), promDuration(Window))
}

// The queries, by what they read.
const (
	qLastReading = iota
	qTargets
	qIntervals
	qHealth
	qProcessMemory
	qProcessSM
	qProcessSMOnly
	qGPUs
	qGPUReadings
	qMPS
	qMIG
	qAllocatedPods
	qIdle
	qUnrequested
	nQueries
)

var queries = [nQueries]query{
	// When each node's exporter last answered: its latest sample, or, for a node whose series have gone stale (its
	// exporter stopped, its target left), the latest one a subquery finds: stepping a second over the last two
	// minutes, where a node has just gone stale and its age is read to the second, else at the scrape interval
	// over the window.
	qLastReading: {name: "last readings", expr: func(q exprs) string {
		latest := func(window, step time.Duration) string {
			return fmt.Sprintf("max by (%s) (max_over_time(timestamp(%s)[%s:%s]))", q.by, q.exporters(), promDuration(window), promDuration(step))
		}
		return fmt.Sprintf("max by (%s) (timestamp(%s)) or %s or %s", q.by, q.exporters(), latest(recentWindow, time.Second),
			latest(Window, q.resolution))
	}},
	// Whether Prometheus reaches each exporter.
	qTargets: {name: "targets", expr: func(q exprs) string {
		return fmt.Sprintf("up%s and on (job) %s", q.s(), q.exporterJobs())
	}},
	// How often each exporter is scraped: the samples of up in the last 10 minutes.
	qIntervals: {name: "scrape intervals", expr: func(q exprs) string {
		return fmt.Sprintf("count_over_time(up%s[%s]) and on (job) %s", q.s(), promDuration(intervalWindow), q.exporterJobs())
	}},
	// Whether each exporter reads its GPUs, knows its allocations (the family is written whenever they are
	// known), and is a simulated node.
	qHealth: {name: "exporter health", expr: func(q exprs) string {
		return fmt.Sprintf("max by (%s, __name__, simulated) (%s)", q.by,
			q.s(`__name__=~"gpu_pod_exporter_source_up|gpu_pod_exporter_kubelet_unmapped_devices|gpu_info"`))
	}},
	// The processes, with every label ps shows.
	qProcessMemory: {name: "process memory", expr: func(q exprs) string { return "gpu_process_memory_used_bytes" + q.s() }},
	// Their SM utilization, with only the labels that find the process.
	qProcessSM: {name: "process SM utilization", expr: func(q exprs) string {
		return fmt.Sprintf("max by (%s, uuid, pid) (gpu_process_sm_utilization_ratio%s)", q.by, q.s())
	}},
	// Processes with an SM utilization and no memory reading: asked for only when the SM utilizations name one.
	qProcessSMOnly: {name: "processes without a memory reading", followUp: true, expr: func(q exprs) string {
		return fmt.Sprintf("gpu_process_sm_utilization_ratio%s unless on (%s, uuid, pid) gpu_process_memory_used_bytes%s", q.s(), q.by, q.s())
	}},
	qGPUs: {name: "GPUs", top: true, expr: func(q exprs) string { return "gpu_info" + q.s() }},
	// The readings of a GPU's line, with only the labels that find the GPU.
	qGPUReadings: {name: "GPU readings", top: true, expr: func(q exprs) string {
		return fmt.Sprintf("max by (%s, uuid, __name__) (%s)", q.by, q.s(`__name__=~"`+strings.Join(gpuReadingNames, "|")+`"`))
	}},
	qMPS: {name: "MPS GPUs", top: true, expr: func(q exprs) string {
		return fmt.Sprintf(`max by (%s, uuid) (gpu_processes%s > 0)`, q.by, q.s(`type="mps"`))
	}},
	qMIG: {name: "MIG instances", top: true, expr: func(q exprs) string {
		return fmt.Sprintf("count by (%s, uuid) (gpu_mig_info%s)", q.by, q.s())
	}},
	// The pods the kubelet allocated each GPU (or its MIG devices) to.
	qAllocatedPods: {name: "allocated pods", top: true, expr: func(q exprs) string {
		return fmt.Sprintf("count by (%s, uuid) (count by (%s, uuid, namespace, pod) (gpu_allocation_info%s))", q.by, q.by, q.s())
	}},
	// The signals, as the alerts GPUAllocatedIdle and GPUUsedWithoutRequest read them.
	qIdle: {name: "idle allocations", top: true, expr: func(q exprs) string {
		return "gpu_allocation_processes" + q.s() + " == 0"
	}},
	qUnrequested: {name: "unrequested uses", top: true, expr: func(q exprs) string { return "gpu_unrequested_use" + q.s() }},
}

// gpuReadingNames are the families of a GPU's line.
var gpuReadingNames = []string{"gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_memory_total_bytes",
	"gpu_temperature_celsius", "gpu_power_usage_watts", "gpu_workloads"}

// promDuration writes a duration as PromQL does: 1h, 10m, 15s, 500ms.
func promDuration(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}
