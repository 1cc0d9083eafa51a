package cluster

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/promapi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// processKeyLabels find a process's row on a node: a process on a GPU, or on one MIG instance of it (processKey).
const processKeyLabels = "uuid, pid, gpu_instance, compute_instance"

// Window is how far back the last reading of a node whose exporter is down is looked for.
const Window = time.Hour

// Departed is the staleness bound: a node whose target Prometheus no longer has (no series of up), and whose last
// reading is older than this, has left the cluster and leaves the view. It is Prometheus' default lookback, after
// which an instant query no longer sees a series that stopped.
const Departed = 5 * time.Minute

// recentWindow is the span over which the time of a node's last reading is found to the second.
const recentWindow = 2 * time.Minute

// intervalWindow is the span over which a target's scrape interval is measured, by counting its samples of up.
const intervalWindow = 10 * time.Minute

// query is one of the fixed queries a reading makes. Each is written once here, with the selector in every vector
// selector and the node label in every grouping, from the families it reads (families.go); the number of queries
// does not grow with the nodes.
type query struct {
	name string
	// top: only the top view needs it; ps reads the others.
	top bool
	// followUp: asked only when the others' answers call for it, at most once per reading.
	followUp bool
	// history: a range query over view.HistorySpan; workloads: asked only for the grouped view.
	history, workloads bool
	// expr writes the PromQL.
	expr func(q exprs) string
}

// exprs fills in the parts of the queries that depend on the configuration.
type exprs struct {
	sel        promapi.Selector
	by         string // the labels a node is known by, for by (…)
	resolution time.Duration
}

// of is a family's vector selector, narrowed by the selector and more matchers.
func (q exprs) of(f family, more ...string) string { return f.Name + q.sel.With(more...) }

// exporters is the selector of the series every exporter writes once per scrape, whatever it reads.
func (q exprs) exporters() string { return q.of(buildInfo) }

// exporterJobs are the jobs that scrape exporters: up of their targets is the exporters' up, and no other
// target's (node-exporter's on the same node, for instance).
func (q exprs) exporterJobs() string {
	return fmt.Sprintf("group by (job) (last_over_time(%s[%s]))", q.exporters(), promDuration(Window))
}

// names is a matcher of the families' names, for one query of several families.
func names(fs ...family) string {
	ns := make([]string, len(fs))
	for i, f := range fs {
		ns[i] = f.Name
	}
	return `__name__=~"` + strings.Join(ns, "|") + `"`
}

// The queries, by what they read.
const (
	qLastReading = iota
	qTargets
	qIntervals
	qExporters
	qProcessMemory
	qProcessSM
	qProcessCounts
	qProcessSMOnly
	qGPUHealth
	qGPUs
	qGPUReadings
	qMPS
	qMIG
	qAllocatedPods
	qIdle
	qUnrequested
	qUtilizationHistory
	qMemoryHistory
	qWorkloadHistory
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
		return fmt.Sprintf("up%s and on (job) %s", q.sel.With(), q.exporterJobs())
	}},
	// How often each exporter is scraped: the samples of up in the last 10 minutes.
	qIntervals: {name: "scrape intervals", expr: func(q exprs) string {
		return fmt.Sprintf("count_over_time(up%s[%s]) and on (job) %s", q.sel.With(), promDuration(intervalWindow), q.exporterJobs())
	}},
	// Whether each exporter reads its GPUs, knows its allocations (the family is written whenever they are
	// known), and is a simulated node.
	qExporters: {name: "exporter health", expr: func(q exprs) string {
		return fmt.Sprintf("max by (%s, __name__, simulated) (%s)", q.by, q.sel.With(names(sourceUp, unmapped, gpuInfo)))
	}},
	// The processes, with every label ps shows.
	qProcessMemory: {name: "process memory", expr: func(q exprs) string { return q.of(processMemory) }},
	// Their SM utilization, with only the labels that find the process.
	qProcessSM: {name: "process SM utilization", expr: func(q exprs) string {
		return fmt.Sprintf("max by (%s, %s) (%s)", q.by, processKeyLabels, q.of(processSM))
	}},
	// How many processes each busy GPU has, each type's series once however many jobs scrape the node under one
	// instance: a process the exporter knows no memory or SM utilization of has no series to be a row, and is
	// counted here.
	qProcessCounts: {name: "process counts", expr: func(q exprs) string {
		return fmt.Sprintf("sum by (%s, uuid, gpu) (max by (%s, uuid, gpu, type) (%s)) > 0", q.by, q.by, q.of(processes))
	}},
	// Processes with an SM utilization and no memory reading: asked for only when the SM utilizations name one.
	qProcessSMOnly: {name: "processes without a memory reading", followUp: true, expr: func(q exprs) string {
		return fmt.Sprintf("%s unless on (%s, %s) %s", q.of(processSM), q.by, processKeyLabels, q.of(processMemory))
	}},
	// What is wrong with each GPU, as the health alerts read it: only the series that say something is, so that a
	// healthy cluster answers nothing.
	qGPUHealth: {name: "GPU health", expr: func(q exprs) string { return healthExpr(q) }},
	qGPUs:      {name: "GPUs", top: true, expr: func(q exprs) string { return q.of(gpuInfo) }},
	// The readings of a GPU's line, with only the labels that find the GPU.
	qGPUReadings: {name: "GPU readings", top: true, expr: func(q exprs) string {
		fs := make([]family, len(gpuLine))
		for i, f := range gpuLine {
			fs[i] = f.family
		}
		return fmt.Sprintf("max by (%s, uuid, __name__) (%s)", q.by, q.sel.With(names(fs...)))
	}},
	qMPS: {name: "MPS GPUs", top: true, expr: func(q exprs) string {
		return fmt.Sprintf(`max by (%s, uuid) (%s > 0)`, q.by, q.of(processes, `type="mps"`))
	}},
	// Each instance once, by its identity, before counting: a node scraped by two jobs under one instance has
	// each series twice.
	qMIG: {name: "MIG instances", top: true, expr: func(q exprs) string {
		return fmt.Sprintf("count by (%s, uuid) (max by (%s, uuid, %s) (%s))", q.by, q.by, strings.Join(migKeyLabels, ", "), q.of(migInfo))
	}},
	// The pods the kubelet allocated each GPU (or its MIG devices) to.
	qAllocatedPods: {name: "allocated pods", top: true, expr: func(q exprs) string {
		return fmt.Sprintf("count by (%s, uuid) (count by (%s, uuid, namespace, pod) (%s))", q.by, q.by, q.of(allocInfo))
	}},
	// The signals, as the alerts GPUAllocatedIdle and GPUUsedWithoutRequest read them.
	qIdle:        {name: "idle allocations", top: true, expr: func(q exprs) string { return q.of(allocProcs) + " == 0" }},
	qUnrequested: {name: "unrequested uses", top: true, expr: func(q exprs) string { return q.of(unrequested) }},
	// The history of each GPU's utilization and memory, and of each workload's SM utilization: one range query
	// each, whatever the number of nodes.
	qUtilizationHistory: {name: "utilization history", top: true, history: true, expr: func(q exprs) string {
		return fmt.Sprintf("max by (%s, uuid) (%s)", q.by, q.of(utilization))
	}},
	qMemoryHistory: {name: "memory history", top: true, history: true, expr: func(q exprs) string {
		return fmt.Sprintf("max by (%s, uuid) (%s) / max by (%s, uuid) (%s)", q.by, q.of(memoryUsed), q.by, q.of(memoryTotal))
	}},
	// A workload's SM utilization summed over its GPUs, each GPU's series once (max by its identity) however many
	// jobs scrape the node under one instance.
	qWorkloadHistory: {name: "workload history", top: true, history: true, workloads: true, expr: func(q exprs) string {
		key := strings.Join(workloadKeyLabels(), ", ")
		return fmt.Sprintf("sum by (%s, %s) (max by (%s, uuid, %s) (%s))", q.by, key, q.by, key, q.of(workloadSM))
	}},
}

// healthExpr is the query of the GPUs' health problems: for each family of view.Health, the series that say
// something is wrong, as view.Health.Problems reads them, with the labels that say what.
func healthExpr(q exprs) string {
	xids := make([]string, len(view.CriticalXIDs))
	for i, x := range view.CriticalXIDs {
		xids[i] = strconv.FormatUint(x, 10)
	}
	reasons := strings.Join(append(append(append([]string(nil), view.ThermalReasons...), view.PowerBrakeReasons...), view.PowerCapReasons...), "|")
	busy := strconv.FormatFloat(view.Busy, 'g', -1, 64)
	parts := []string{
		q.of(recoveryAction) + " > 0",
		q.of(remapFailure) + " == 1",
		q.of(remapPending) + " == 1",
		q.of(retirementPending) + " == 1",
		q.of(xidErrors, `xid=~"`+strings.Join(xids, "|")+`"`) + " > 0",
		q.of(clockEvents, `reason=~"`+reasons+`"`) + " == 1",
		// A link below its best: both ends, so that the line can say "x8 of x16". Matched on all their labels, so
		// that a node scraped by two jobs matches each job's pair.
		q.of(pcieWidth) + " < " + q.of(pcieMaxWidth),
		q.of(pcieMaxWidth) + " > " + q.of(pcieWidth),
		// The generation only while the GPU is busy: an idle GPU lowers it to save power.
		"(" + q.of(pcieGeneration) + " < " + q.of(pcieMaxGeneration) + ") and " + q.of(utilization) + " > " + busy,
		"(" + q.of(pcieMaxGeneration) + " > " + q.of(pcieGeneration) + ") and " + q.of(utilization) + " > " + busy,
		// Links down, and all the GPU's links, for "2 of 18 NVLinks down".
		q.of(nvlinks) + " and ignoring (state) " + q.of(nvlinks, `state="inactive"`) + " > 0",
		q.of(fabricState) + " < 3",
		q.of(fabricHealthy) + " == 0",
	}
	// or matches on every label but the name, so that two families of one GPU would be one: matched on the name
	// too, each stays.
	or := fmt.Sprintf(" or on (%s, uuid, __name__, xid, reason, state) ", q.by)
	return fmt.Sprintf("max by (%s, uuid, gpu, __name__, xid, reason, state) (%s)", q.by, strings.Join(parts, or))
}

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
