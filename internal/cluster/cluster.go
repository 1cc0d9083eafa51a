// Package cluster reads every node's GPUs, processes, allocation signals and exporter state from Prometheus, Thanos
// or Mimir, where the exporters' series already are, with a fixed set of instant queries (queries.go), and lays
// them out as the node's own commands do: ps rows with their node, and top's screen with a line per node. It
// aggregates nothing that PromQL does not.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/promapi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/ps"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/top"
)

// DefaultNodeLabel names a node: the chart's ServiceMonitor sets instance to the node's name.
const DefaultNodeLabel = "instance"

// Config is what a reading asks for.
type Config struct {
	// Selector narrows every query: a cluster, a node pool, a node.
	Selector promapi.Selector
	// NodeLabel is the target label that names a node; a series without it is named by its instance.
	NodeLabel string
	// ScrapeInterval is how often Prometheus scrapes the exporters; 0 measures each target's from its samples of up.
	ScrapeInterval time.Duration
	// At is the time to read the cluster at; zero is the server's now.
	At time.Time
}

// Querier runs instant queries: a promapi.Client.
type Querier interface {
	Query(ctx context.Context, expr string, at time.Time, each func(promapi.Sample) error) ([]string, error)
	URL() string
}

// Reader reads the cluster.
type Reader struct {
	q     Querier
	cfg   Config
	exprs exprs
}

// defaultInterval stands in for a target's scrape interval when it cannot be measured: Prometheus' own default.
const defaultInterval = time.Minute

// New returns a reader of the cluster through q.
func New(q Querier, cfg Config) *Reader {
	if cfg.NodeLabel == "" {
		cfg.NodeLabel = DefaultNodeLabel
	}
	by := cfg.NodeLabel
	if by != "instance" {
		by += ", instance"
	}
	// The subquery that finds when a vanished node was last seen steps at the scrape interval (a node seen for less
	// than a step may be missed, and an age is as precise as a step), and at least a second.
	resolution := cmp.Or(cfg.ScrapeInterval, 15*time.Second)
	resolution = max(resolution, Window/3600).Truncate(time.Second)
	return &Reader{q: q, cfg: cfg, exprs: exprs{sel: cfg.Selector, by: by, resolution: resolution}}
}

// Expr is the PromQL of query i, for tests and docs.
func (r *Reader) Expr(i int) string { return queries[i].expr(r.exprs) }

// Queries lists the queries a reading makes: ps' only, or top's too.
func (r *Reader) Queries(forTop bool) []string {
	var out []string
	for i, q := range queries {
		if !q.top || forTop {
			out = append(out, r.Expr(i))
		}
	}
	return out
}

// parallel is how many queries are in flight at once.
const parallel = 4

// Processes reads what ps shows: each node's state, and every GPU process with its owner.
func (r *Reader) Processes(ctx context.Context) (*top.Cluster, error) { return r.read(ctx, false) }

// Read reads what top shows: the processes, and each GPU's line and the allocation signals.
func (r *Reader) Read(ctx context.Context) (*top.Cluster, error) { return r.read(ctx, true) }

func (r *Reader) read(ctx context.Context, forTop bool) (*top.Cluster, error) {
	ctx = promapi.WithBudget(ctx, promapi.NewBudget(promapi.DefaultReadingBytes)) // one for all the reading's answers
	res := newResults(r.cfg.NodeLabel)
	var warnings [nQueries][]string
	run := func(want func(query) bool) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var (
			wg   sync.WaitGroup
			sem  = make(chan struct{}, parallel)
			errs [nQueries]error
		)
		for i, q := range queries {
			if !want(q) {
				continue
			}
			wg.Go(func() {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					errs[i] = ctx.Err()
					return
				}
				defer func() { <-sem }()
				warnings[i], errs[i] = r.q.Query(ctx, q.expr(r.exprs), r.cfg.At, res.handler(i))
				if errs[i] != nil {
					cancel() // one failed query fails the reading: the others need not finish
				}
			})
		}
		wg.Wait()
		// The first failure in the table's order that is not another's cancellation says why.
		for _, err := range errs {
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
		}
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := run(func(q query) bool { return !q.followUp && (!q.top || forTop) }); err != nil {
		return nil, err
	}
	if len(res.lastReading) == 0 && len(res.up) == 0 {
		return nil, fmt.Errorf("no gpu-pod-exporter series in Prometheus at %s: %s found nothing", r.q.URL(), r.Expr(qLastReading))
	}
	// Processes with an SM utilization and no memory reading need their labels read: only when there are any.
	if res.smWithoutMemory() {
		if err := run(func(q query) bool { return q.followUp }); err != nil {
			return nil, err
		}
	}
	c := res.cluster(r.cfg.ScrapeInterval)
	seen := make(map[string]bool)
	for _, ws := range warnings {
		for _, w := range ws {
			if !seen[w] {
				seen[w] = true
				c.Warnings = append(c.Warnings, "Prometheus "+w)
			}
		}
	}
	c.Warnings = append(c.Warnings, res.problems()...)
	return c, nil
}

// results are the answers of one reading's queries; each query's handler writes only its own fields, so that the
// queries can run at once.
type results struct {
	nodeLabel string
	intern    [nQueries]map[string]string

	evaluated   [nQueries]float64 // the server's evaluation time, as each query's samples say it
	lastReading map[string]float64
	up          map[string]float64
	samples     map[string]float64 // of up, in the interval window
	sourceUp    map[string]float64
	allocKnown  map[string]bool
	simulated   map[string]bool

	memory  []ps.Row
	sm      map[processKey]float64
	smOnly  []ps.Row
	gpus    []gpuInfo
	reading map[gpuKey]*gpuReading
	mps     map[gpuKey]bool
	mig     map[gpuKey]int
	pods    map[gpuKey]int
	idle    []signal
	unreq   []signal

	// bad counts series left out because a label that must be a number is not, by query.
	bad [nQueries]int
}

type gpuKey struct{ node, uuid string }

type processKey struct {
	node, uuid string
	pid        uint32
}

type gpuInfo struct {
	node, uuid, name string
	index            int
	mig, simulated   bool
}

type gpuReading struct {
	utilization, memUsed, memTotal, temperature, power, workloads gpu.Value
}

type signal struct {
	node, uuid               string
	gpu                      int
	gi, ci                   *int
	namespace, pod, containr string
}

func newResults(nodeLabel string) *results {
	r := &results{
		nodeLabel: nodeLabel, lastReading: map[string]float64{}, up: map[string]float64{}, samples: map[string]float64{},
		sourceUp: map[string]float64{}, allocKnown: map[string]bool{}, simulated: map[string]bool{},
		sm: map[processKey]float64{}, reading: map[gpuKey]*gpuReading{}, mps: map[gpuKey]bool{}, mig: map[gpuKey]int{},
		pods: map[gpuKey]int{},
	}
	for i := range r.intern {
		r.intern[i] = map[string]string{}
	}
	return r
}

// node names the series' node: its node label, else its instance.
func (r *results) node(m map[string]string) string {
	if n := m[r.nodeLabel]; n != "" {
		return n
	}
	return m["instance"]
}

// handler is what query i does with each sample, and notes the server's evaluation time.
func (r *results) handler(i int) func(promapi.Sample) error {
	each := r.sampleHandler(i)
	return func(s promapi.Sample) error {
		r.evaluated[i] = s.Time
		return each(s)
	}
}

// sampleHandler is what query i does with each sample. Label values are interned per query, so that the thousands
// of rows that share a namespace or a process name share its string.
func (r *results) sampleHandler(i int) func(promapi.Sample) error {
	in := r.intern[i]
	str := func(s string) string {
		if v, ok := in[s]; ok {
			return v
		}
		in[s] = s
		return s
	}
	node := func(m map[string]string) string { return str(r.node(m)) }
	gk := func(m map[string]string) gpuKey { return gpuKey{node(m), str(m["uuid"])} }
	switch i {
	case qLastReading:
		return func(s promapi.Sample) error {
			n := node(s.Metric)
			r.lastReading[n] = max(r.lastReading[n], s.Value)
			return nil
		}
	case qTargets:
		return func(s promapi.Sample) error {
			n := node(s.Metric)
			if v, ok := r.up[n]; !ok || s.Value < v {
				r.up[n] = s.Value // one target down is the node's exporter down
			}
			return nil
		}
	case qIntervals:
		return func(s promapi.Sample) error {
			n := node(s.Metric)
			r.samples[n] = max(r.samples[n], s.Value)
			return nil
		}
	case qHealth:
		return func(s promapi.Sample) error {
			n := node(s.Metric)
			switch s.Metric["__name__"] {
			case "gpu_pod_exporter_source_up":
				r.sourceUp[n] = s.Value
			case "gpu_pod_exporter_kubelet_unmapped_devices":
				r.allocKnown[n] = true
			case "gpu_info":
				r.simulated[n] = r.simulated[n] || s.Metric["simulated"] == "true"
			}
			return nil
		}
	case qProcessMemory, qProcessSMOnly:
		return func(s promapi.Sample) error {
			row, ok := processRow(s.Metric, node(s.Metric), str)
			if !ok {
				r.bad[i]++
				return nil
			}
			v := s.Value
			if i == qProcessMemory {
				b := uint64(v)
				row.MemoryUsedBytes = &b
				r.memory = append(r.memory, row)
			} else {
				row.SMUtilization = &v
				r.smOnly = append(r.smOnly, row)
			}
			return nil
		}
	case qProcessSM:
		return func(s promapi.Sample) error {
			pid, err := strconv.ParseUint(s.Metric["pid"], 10, 32)
			if err != nil {
				r.bad[i]++
				return nil
			}
			r.sm[processKey{node(s.Metric), str(s.Metric["uuid"]), uint32(pid)}] = s.Value
			return nil
		}
	case qGPUs:
		return func(s promapi.Sample) error {
			idx, err := strconv.Atoi(s.Metric["gpu"])
			if err != nil {
				r.bad[i]++
				return nil
			}
			k := gk(s.Metric)
			r.gpus = append(r.gpus, gpuInfo{node: k.node, uuid: k.uuid, index: idx, name: str(s.Metric["name"]),
				mig: s.Metric["mig_mode"] == "enabled", simulated: s.Metric["simulated"] == "true"})
			return nil
		}
	case qGPUReadings:
		return func(s promapi.Sample) error {
			k := gk(s.Metric)
			g := r.reading[k]
			if g == nil {
				g = &gpuReading{}
				r.reading[k] = g
			}
			v := gpu.Known(s.Value)
			switch s.Metric["__name__"] {
			case "gpu_utilization_ratio":
				g.utilization = v
			case "gpu_memory_used_bytes":
				g.memUsed = v
			case "gpu_memory_total_bytes":
				g.memTotal = v
			case "gpu_temperature_celsius":
				g.temperature = v
			case "gpu_power_usage_watts":
				g.power = v
			case "gpu_workloads":
				g.workloads = v
			}
			return nil
		}
	case qMPS:
		return func(s promapi.Sample) error { r.mps[gk(s.Metric)] = true; return nil }
	case qMIG:
		return func(s promapi.Sample) error { r.mig[gk(s.Metric)] = int(s.Value); return nil }
	case qAllocatedPods:
		return func(s promapi.Sample) error { r.pods[gk(s.Metric)] = int(s.Value); return nil }
	case qIdle, qUnrequested:
		return func(s promapi.Sample) error {
			sig, ok := signalOf(s.Metric, node(s.Metric), str)
			if !ok {
				r.bad[i]++
				return nil
			}
			if i == qIdle {
				r.idle = append(r.idle, sig)
			} else {
				r.unreq = append(r.unreq, sig)
			}
			return nil
		}
	}
	panic(fmt.Sprintf("query %d has no handler", i))
}

// processRow is a process series' row: its labels, as the exporter wrote them from the same identity ps prints.
func processRow(m map[string]string, node string, str func(string) string) (ps.Row, bool) {
	idx, err1 := strconv.Atoi(m["gpu"])
	pid, err2 := strconv.ParseUint(m["pid"], 10, 32)
	gi, ok1 := optionalIndex(m["gpu_instance"])
	ci, ok2 := optionalIndex(m["compute_instance"])
	if err1 != nil || err2 != nil || !ok1 || !ok2 || (gi == nil) != (ci == nil) {
		return ps.Row{}, false
	}
	row := ps.Row{Node: node, GPU: idx, UUID: str(m["uuid"]), PID: uint32(pid), ProcessName: str(m["process_name"]),
		ProcessType: str(m["process_type"]), GPUInstance: gi, ComputeInstance: ci}
	for _, l := range attribution.IdentityLabels {
		if l.Use&attribution.OnProcesses != 0 && l.Use&attribution.InPS != 0 {
			*l.Get(&row.Identity) = str(m[l.Name])
		}
	}
	return row, true
}

// optionalIndex reads a MIG instance label: empty is none.
func optionalIndex(s string) (*int, bool) {
	if s == "" {
		return nil, true
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return nil, false
	}
	return &n, true
}

func signalOf(m map[string]string, node string, str func(string) string) (signal, bool) {
	idx, err := strconv.Atoi(m["gpu"])
	gi, ok1 := optionalIndex(m["gpu_instance"])
	ci, ok2 := optionalIndex(m["compute_instance"])
	if err != nil || !ok1 || !ok2 {
		return signal{}, false
	}
	return signal{node: node, uuid: str(m["uuid"]), gpu: idx, gi: gi, ci: ci, namespace: str(m["namespace"]), pod: m["pod"],
		containr: str(m["container"])}, true
}

// problems are the series left out, one line per query.
func (r *results) problems() []string {
	var out []string
	for i, n := range r.bad {
		if n > 0 {
			out = append(out, fmt.Sprintf("%d series of %s left out: a gpu, pid or MIG instance label that is not a number", n, queries[i].name))
		}
	}
	return out
}

// cluster joins the answers: a node per name seen, its state from up, its last reading and its scrape interval;
// each process's row with its SM utilization; each GPU's line with its readings and signals.
func (r *results) cluster(interval time.Duration) *top.Cluster {
	now := slices.Max(r.evaluated[:])
	c := &top.Cluster{Time: time.UnixMilli(int64(math.Round(now * 1000)))}
	names := make(map[string]bool)
	for n := range r.lastReading {
		names[n] = true
	}
	for n := range r.up {
		names[n] = true
	}
	for name := range names {
		n := top.Node{Name: name, AllocationsKnown: r.allocKnown[name], Simulated: r.simulated[name]}
		last, seen := r.lastReading[name]
		n.LastSeen = seen
		if seen {
			n.Age = time.Duration((now - last) * float64(time.Second)).Round(time.Second)
		}
		every := interval
		if every == 0 {
			every = defaultInterval
			if k := r.samples[name]; k > 0 {
				every = time.Duration(float64(intervalWindow) / k)
			}
		}
		up, upKnown := r.up[name]
		source, sourceKnown := r.sourceUp[name]
		switch {
		case upKnown && up == 0:
			n.State = top.NodeDown
		case !seen || n.Age > 2*every:
			n.State = top.NodeStale
		case sourceKnown && source == 0:
			n.State = top.NodeSourceDown
		}
		c.Nodes = append(c.Nodes, n)
	}
	slices.SortFunc(c.Nodes, func(a, b top.Node) int { return strings.Compare(a.Name, b.Name) })

	c.Rows = r.rows()
	c.GPUs, c.Signals = r.gpuLines()
	return c
}

// smWithoutMemory reports whether a process has an SM utilization and no memory reading.
func (r *results) smWithoutMemory() bool {
	withMemory := make(map[processKey]bool, len(r.memory))
	for _, row := range r.memory {
		withMemory[processKey{row.Node, row.UUID, row.PID}] = true
	}
	for k := range r.sm {
		if !withMemory[k] {
			return true
		}
	}
	return false
}

// rows are the processes, by node, GPU and PID, as ps orders a node's.
func (r *results) rows() []ps.Row {
	rows := append(r.memory, r.smOnly...)
	for i := range rows[:len(r.memory)] {
		if v, ok := r.sm[processKey{rows[i].Node, rows[i].UUID, rows[i].PID}]; ok {
			rows[i].SMUtilization = &v
		}
	}
	slices.SortFunc(rows, func(a, b ps.Row) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.PID, b.PID))
	})
	if rows == nil {
		rows = []ps.Row{}
	}
	return rows
}

// gpuLines are the GPUs' lines and the allocation signals, by node and GPU.
func (r *results) gpuLines() ([]top.GPU, []top.Signal) {
	idlePods := make(map[gpuKey]map[string]bool)
	unreqPods := make(map[gpuKey]map[string]bool)
	var sigs []top.Signal
	count := func(m map[gpuKey]map[string]bool, s signal) {
		k := gpuKey{s.node, s.uuid}
		if m[k] == nil {
			m[k] = map[string]bool{}
		}
		m[k][s.namespace+"/"+s.pod] = true
	}
	for _, s := range r.idle {
		count(idlePods, s)
		sigs = append(sigs, top.NewSignal(top.IdleAllocation, s.node, s.gpu, s.gi, s.ci, s.namespace+"/"+s.pod+"/"+s.containr))
	}
	for _, s := range r.unreq {
		count(unreqPods, s)
		sigs = append(sigs, top.NewSignal(top.Unrequested, s.node, s.gpu, s.gi, s.ci, s.namespace+"/"+s.pod+"/"+s.containr))
	}
	gpus := make([]top.GPU, 0, len(r.gpus))
	for _, info := range r.gpus {
		k := gpuKey{info.node, info.uuid}
		rd := r.reading[k]
		if rd == nil {
			rd = &gpuReading{}
		}
		workloads := int(rd.workloads.V)
		g := top.GPU{
			Node: info.node, Index: info.index, Name: strings.TrimPrefix(info.name, "NVIDIA "), Utilization: rd.utilization,
			MemoryUsed: rd.memUsed, MemoryTotal: rd.memTotal, Temperature: rd.temperature, Power: rd.power,
			Mode:          top.SharingMode(info.mig, r.mig[k], rd.workloads.Valid, r.mps[k], workloads),
			InUse:         workloads > 0,
			AllocatedPods: r.pods[k], IdlePods: len(idlePods[k]), Unrequested: len(unreqPods[k]),
			AllocationsUnknown: !r.allocKnown[info.node],
		}
		gpus = append(gpus, g)
	}
	slices.SortFunc(gpus, func(a, b top.GPU) int { return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(a.Index, b.Index)) })
	return gpus, sigs
}
