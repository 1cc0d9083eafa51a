// Package cluster reads a whole cluster's GPUs, processes, health, allocation signals and exporter state from
// Prometheus, Thanos or Mimir, where the exporters' series already are, with a fixed set of queries (queries.go)
// over the families of families.go, into the view that ps and top render (internal/view). It aggregates nothing
// that PromQL does not.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/families"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/promapi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
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
	// At is the time to read the cluster at; zero is now.
	At time.Time
	// MaxAnswerBytes bounds the answers of one reading, all its queries together; 0 is
	// promapi.DefaultReadingBytes.
	MaxAnswerBytes int64
}

// Querier runs queries: a promapi.Client.
type Querier interface {
	Query(ctx context.Context, expr string, at time.Time, each func(promapi.Sample) error) ([]string, error)
	QueryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration, each func(promapi.Sample) error) ([]string, error)
	URL() string
}

// Reader reads the cluster.
type Reader struct {
	q     Querier
	cfg   Config
	exprs exprs
	// now is the clock that places the history's range when the reading is of now.
	now func() time.Time

	// history is what the last readings read of the recent past, kept so that the next reads only the steps
	// since (past[q]: the last step history query q read; zero when it did not run).
	mu      sync.Mutex
	history *view.History
	past    [nQueries]time.Time
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
	return &Reader{q: q, cfg: cfg, exprs: exprs{sel: cfg.Selector, by: by, resolution: resolution}, now: time.Now}
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

// What says what a reading reads.
type What struct {
	// Top: the GPUs' lines, the allocation signals and the GPUs' history, besides the processes and health.
	Top bool
	// Workloads: the workloads' history too (top's grouped view).
	Workloads bool
}

// Read reads the cluster: each node's state, every GPU process with its owner, each GPU's health, and with
// what.Top each GPU's line, the allocation signals and the history.
func (r *Reader) Read(ctx context.Context, what What) (*view.Reading, error) {
	// One budget for all the reading's answers.
	ctx = promapi.WithBudget(ctx, promapi.NewBudget(cmp.Or(r.cfg.MaxAnswerBytes, promapi.DefaultReadingBytes)))
	res := newResults(r.cfg.NodeLabel)
	at := r.cfg.At
	if at.IsZero() {
		at = r.now()
	}
	r.mu.Lock() // one reading at a time reads and keeps the history
	defer r.mu.Unlock()
	step := view.HistorySpan / view.HistoryPoints
	end := at.Truncate(step) // the history's points are on a grid of steps, the same from one reading to the next
	res.historyStart, res.step = end.Add(-view.HistorySpan+step), step
	// A history query reads the steps since it last read, all of them the first time.
	since := func(q int) time.Time {
		if last := r.past[q]; !last.IsZero() && !last.Before(res.historyStart) && !last.After(end) {
			return last.Add(step)
		}
		return res.historyStart
	}
	var warnings [nQueries][]string
	run := func(want func(int, query) bool) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var (
			wg   sync.WaitGroup
			sem  = make(chan struct{}, parallel)
			errs [nQueries]error
		)
		for i, q := range queries {
			if !want(i, q) {
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
				if q.history {
					warnings[i], errs[i] = r.q.QueryRange(ctx, q.expr(r.exprs), since(i), end, step, res.handler(i))
				} else {
					warnings[i], errs[i] = r.q.Query(ctx, q.expr(r.exprs), r.cfg.At, res.handler(i))
				}
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
	asked := func(i int, q query) bool {
		return !q.followUp && (!q.top || what.Top) && (!q.workloads || what.Workloads) &&
			(!q.history || !since(i).After(end))
	}
	if err := run(asked); err != nil {
		return nil, err
	}
	if len(res.lastReading) == 0 && len(res.up) == 0 {
		return nil, fmt.Errorf("no gpu-pod-exporter series in Prometheus at %s: %s found nothing", r.q.URL(), r.Expr(qLastReading))
	}
	// Processes with an SM utilization and no memory reading need their labels read: only when there are any.
	if res.smWithoutMemory() {
		if err := run(func(_ int, q query) bool { return q.followUp }); err != nil {
			return nil, err
		}
	}
	v := res.view(r.cfg.ScrapeInterval)
	if what.Top {
		r.keepHistory(v, end, what.Workloads)
	}
	seen := make(map[string]bool)
	for _, ws := range warnings {
		for _, w := range ws {
			if !seen[w] {
				seen[w] = true
				v.Warnings = append(v.Warnings, "Prometheus "+w)
			}
		}
	}
	v.Warnings = append(v.Warnings, res.problems()...)
	return v, nil
}

// keepHistory merges what the reading read of the past into what the readings before it read, gives the reading
// the whole, and keeps it for the next: a GPU's or workload's point that was not read again keeps its value.
func (r *Reader) keepHistory(v *view.Reading, end time.Time, workloads bool) {
	old, fresh := r.history, v.History
	if fresh == nil {
		fresh = view.NewHistory()
	}
	shift := func(q int) int {
		if r.past[q].IsZero() {
			return view.HistoryPoints // nothing of it kept
		}
		return int(end.Sub(r.past[q]) / (view.HistorySpan / view.HistoryPoints))
	}
	merge := func(into, kept []float64, by int) {
		for i := range into {
			if j := i + by; math.IsNaN(into[i]) && j >= 0 && j < len(kept) {
				into[i] = kept[j]
			}
		}
	}
	if old != nil {
		by := shift(qUtilizationHistory)
		for k, g := range old.GPUs {
			n := fresh.GPU(k)
			merge(n.Utilization, g.Utilization, by)
			merge(n.Memory, g.Memory, by)
		}
		if workloads {
			by = shift(qWorkloadHistory)
			for k, w := range old.Workloads {
				n := fresh.Workloads[k]
				if n == nil {
					n = view.Points()
					fresh.Workloads[k] = n
				}
				merge(n, w, by)
			}
		}
	}
	fresh.Forget()
	r.history, v.History = fresh, fresh
	r.past[qUtilizationHistory], r.past[qMemoryHistory] = end, end
	r.past[qWorkloadHistory] = time.Time{}
	if workloads {
		r.past[qWorkloadHistory] = end
	}
}

// results are the answers of one reading's queries; each query's handler writes only its own fields, so that the
// queries can run at once.
type results struct {
	nodeLabel string
	intern    [nQueries]map[string]string

	evaluated   [nQueries]float64 // the server's evaluation time, as each instant query's samples say it
	lastReading map[string]float64
	up          map[string]float64
	samples     map[string]float64 // of up, in the interval window
	sourceUp    map[string]float64
	allocKnown  map[string]bool
	simulated   map[string]bool

	memory   []view.Process
	sm       map[processKey]float64
	smOnly   []view.Process
	counts   map[gpuKey]processCount
	health   map[gpuKey]*gpuHealth
	gpus     []gpuSeries
	readings map[gpuKey][]gpu.Value // by the row of gpuLine
	mps      map[gpuKey]bool
	mig      map[gpuKey]int
	pods     map[gpuKey]int
	idle     []signal
	unreq    []signal

	historyStart time.Time
	step         time.Duration
	utilization  map[gpuKey][]float64
	memoryRatio  map[gpuKey][]float64
	workloadSM   map[string][]float64

	// isCurrent are the nodes whose readings are current, once known.
	isCurrent map[string]bool

	// bad counts series left out because a label that must be a number is not, and dropped the values left out
	// as unknown, by query.
	bad, dropped [nQueries]int
}

type gpuKey struct{ node, uuid string }

// processCount is how many processes a GPU has, as gpu_processes counts them: one per process per MIG instance,
// as the rows are.
type processCount struct{ index, n int }

// processKey is one process's row: a process on a GPU, or on one MIG instance of it, as the node's view has a row
// per process per MIG instance.
type processKey struct {
	node, uuid string
	pid        uint32
	mig        migInstance
}

// migInstance names a MIG instance of a GPU; the zero value is none.
type migInstance struct {
	set    bool
	gi, ci int
}

// keyOf is a row's processKey.
func keyOf(p *view.Process) processKey {
	k := processKey{node: p.Node, uuid: p.UUID, pid: p.PID}
	if p.MIG {
		k.mig = migInstance{true, p.GPUInstance, p.ComputeInstance}
	}
	return k
}

type gpuSeries struct {
	node, uuid, name string
	index            int
	mig, simulated   bool
}

type gpuHealth struct {
	index int
	view.Health
}

type signal struct {
	node, uuid               string
	gpu                      int
	mig                      bool
	gi, ci                   int
	namespace, pod, containr string
}

func newResults(nodeLabel string) *results {
	r := &results{
		nodeLabel: nodeLabel, lastReading: map[string]float64{}, up: map[string]float64{}, samples: map[string]float64{},
		sourceUp: map[string]float64{}, allocKnown: map[string]bool{}, simulated: map[string]bool{},
		sm: map[processKey]float64{}, counts: map[gpuKey]processCount{}, health: map[gpuKey]*gpuHealth{}, readings: map[gpuKey][]gpu.Value{},
		mps: map[gpuKey]bool{}, mig: map[gpuKey]int{}, pods: map[gpuKey]int{},
		utilization: map[gpuKey][]float64{}, memoryRatio: map[gpuKey][]float64{}, workloadSM: map[string][]float64{},
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
	if queries[i].history {
		return each
	}
	return func(s promapi.Sample) error {
		r.evaluated[i] = s.Time
		return each(s)
	}
}

// known is a sample's value of family f, or unknown (and counted as dropped) when f cannot hold it.
func (r *results) known(i int, f family, v float64) (float64, bool) {
	if !f.plausible(v) {
		r.dropped[i]++
		return 0, false
	}
	return v, true
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
	case qExporters:
		return func(s promapi.Sample) error {
			n := node(s.Metric)
			switch s.Metric["__name__"] {
			case sourceUp.Name:
				r.sourceUp[n] = s.Value
			case unmapped.Name:
				r.allocKnown[n] = true
			case gpuInfo.Name:
				r.simulated[n] = r.simulated[n] || s.Metric["simulated"] == "true"
			}
			return nil
		}
	case qProcessMemory, qProcessSMOnly:
		f := processMemory
		if i == qProcessSMOnly {
			f = processSM
		}
		return func(s promapi.Sample) error {
			p, ok := processRow(s.Metric, node(s.Metric), str)
			if !ok {
				r.bad[i]++
				return nil
			}
			v, ok := r.known(i, f, s.Value)
			if i == qProcessMemory {
				p.Memory = gpu.Value{V: v, Valid: ok}
				r.memory = append(r.memory, p)
			} else {
				p.SM = gpu.Value{V: v, Valid: ok}
				r.smOnly = append(r.smOnly, p)
			}
			return nil
		}
	case qProcessSM:
		return func(s promapi.Sample) error {
			pid, err := strconv.ParseUint(s.Metric["pid"], 10, 32)
			gi, giSet, ok1 := optionalIndex(s.Metric["gpu_instance"])
			ci, ciSet, ok2 := optionalIndex(s.Metric["compute_instance"])
			if err != nil || !ok1 || !ok2 || giSet != ciSet {
				r.bad[i]++
				return nil
			}
			k := processKey{node(s.Metric), str(s.Metric["uuid"]), uint32(pid), migInstance{giSet, gi, ci}}
			if v, ok := r.known(i, processSM, s.Value); ok {
				r.sm[k] = v
			} else {
				r.sm[k] = math.NaN() // known to have a series: not a process without a memory reading to ask for
			}
			return nil
		}
	case qProcessCounts:
		return func(s promapi.Sample) error {
			idx, err := strconv.Atoi(s.Metric["gpu"])
			if err != nil {
				r.bad[i]++
				return nil
			}
			if n, ok := r.known(i, processes, s.Value); ok {
				r.counts[gk(s.Metric)] = processCount{idx, int(n)}
			}
			return nil
		}
	case qGPUHealth:
		return func(s promapi.Sample) error { return r.healthSample(i, s, gk(s.Metric)) }
	case qGPUs:
		return func(s promapi.Sample) error {
			idx, err := strconv.Atoi(s.Metric["gpu"])
			if err != nil {
				r.bad[i]++
				return nil
			}
			k := gk(s.Metric)
			r.gpus = append(r.gpus, gpuSeries{node: k.node, uuid: k.uuid, index: idx, name: str(s.Metric["name"]),
				mig: s.Metric["mig_mode"] == "enabled", simulated: s.Metric["simulated"] == "true"})
			return nil
		}
	case qGPUReadings:
		return func(s promapi.Sample) error {
			row := slices.IndexFunc(gpuLine, func(f gpuLineFamily) bool { return f.Name == s.Metric["__name__"] })
			if row < 0 {
				return nil
			}
			k := gk(s.Metric)
			values := r.readings[k]
			if values == nil {
				values = make([]gpu.Value, len(gpuLine))
				r.readings[k] = values
			}
			v, ok := r.known(i, gpuLine[row].family, s.Value)
			values[row] = gpu.Value{V: v, Valid: ok}
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
	case qUtilizationHistory, qMemoryHistory:
		series := r.utilization
		f := utilization
		if i == qMemoryHistory {
			series, f = r.memoryRatio, family{Family: families.Family{Name: "memory ratio", Range: families.Fraction}}
		}
		return func(s promapi.Sample) error {
			k := gk(s.Metric)
			points := series[k]
			if points == nil {
				points = view.Points()
				series[k] = points
			}
			if v, ok := r.known(i, f, s.Value); ok {
				r.place(points, s.Time, v)
			}
			return nil
		}
	case qWorkloadHistory:
		return func(s promapi.Sample) error {
			var id attribution.Identity
			for _, l := range attribution.IdentityLabels {
				if l.Use&attribution.OnWorkloads != 0 {
					*l.Get(&id) = s.Metric[l.Name]
				}
			}
			k := view.WorkloadName(node(s.Metric), &id)
			points := r.workloadSM[k]
			if points == nil {
				points = view.Points()
				r.workloadSM[k] = points
			}
			if v, ok := r.known(i, workloadSM, s.Value); ok {
				r.place(points, s.Time, v)
			}
			return nil
		}
	}
	panic(fmt.Sprintf("query %d has no handler", i))
}

// place puts a point of a range answer at its place in the history.
func (r *results) place(points []float64, at float64, v float64) {
	t := time.UnixMilli(int64(math.Round(at * 1000)))
	i := int(t.Sub(r.historyStart).Round(r.step) / r.step)
	if i >= 0 && i < len(points) {
		points[i] = v
	}
}

// healthSample reads one series of the health query into its GPU's view.Health.
func (r *results) healthSample(i int, s promapi.Sample, k gpuKey) error {
	f, ok := familyNamed(s.Metric["__name__"])
	if !ok {
		return nil
	}
	v, ok := r.known(i, f, s.Value)
	if !ok {
		return nil
	}
	h := r.health[k]
	if h == nil {
		idx, err := strconv.Atoi(s.Metric["gpu"])
		if err != nil {
			r.bad[i]++
			return nil
		}
		h = &gpuHealth{index: idx}
		r.health[k] = h
	}
	value := gpu.Known(v)
	switch f.Name {
	case recoveryAction.Name:
		h.RecoveryAction = value
	case remapFailure.Name:
		h.RemapFailure = value
	case remapPending.Name:
		h.RemapPending = value
	case retirementPending.Name:
		h.RetirementPending = value
	case xidErrors.Name:
		if x, err := strconv.ParseUint(s.Metric["xid"], 10, 64); err == nil {
			h.XIDs = append(h.XIDs, x)
		}
	case clockEvents.Name:
		h.ClockEvents = append(h.ClockEvents, s.Metric["reason"])
	case pcieWidth.Name:
		h.PCIeWidth = value
	case pcieMaxWidth.Name:
		h.PCIeMaxWidth = value
	case pcieGeneration.Name:
		h.PCIeGeneration, h.Utilization = value, gpu.Known(1) // asked only while busy
	case pcieMaxGeneration.Name:
		h.PCIeMaxGeneration = value
	case nvlinks.Name:
		h.NVLinks += int(v)
		if s.Metric["state"] == "inactive" {
			h.NVLinksDown += int(v)
		}
	case fabricState.Name:
		h.FabricState = value
	case fabricHealthy.Name:
		h.FabricHealthy = value
	}
	return nil
}

// processRow is a process series' row: its labels, as the exporter wrote them from the same identity ps prints.
func processRow(m map[string]string, node string, str func(string) string) (view.Process, bool) {
	idx, err1 := strconv.Atoi(m["gpu"])
	pid, err2 := strconv.ParseUint(m["pid"], 10, 32)
	gi, giSet, ok1 := optionalIndex(m["gpu_instance"])
	ci, ciSet, ok2 := optionalIndex(m["compute_instance"])
	if err1 != nil || err2 != nil || !ok1 || !ok2 || giSet != ciSet {
		return view.Process{}, false
	}
	p := view.Process{Node: node, GPU: idx, UUID: str(m["uuid"]), PID: uint32(pid), Name: str(m["process_name"]),
		Type: str(m["process_type"]), MIG: giSet, GPUInstance: gi, ComputeInstance: ci}
	for _, l := range processIdentity {
		*l.Get(&p.Identity) = str(m[l.Name])
	}
	return p, true
}

var processIdentity = identityLabels()

// optionalIndex reads a MIG instance label: empty is none.
func optionalIndex(s string) (n int, set, ok bool) {
	if s == "" {
		return 0, false, true
	}
	n, err := strconv.Atoi(s)
	return n, true, err == nil
}

func signalOf(m map[string]string, node string, str func(string) string) (signal, bool) {
	idx, err := strconv.Atoi(m["gpu"])
	gi, giSet, ok1 := optionalIndex(m["gpu_instance"])
	ci, _, ok2 := optionalIndex(m["compute_instance"])
	if err != nil || !ok1 || !ok2 {
		return signal{}, false
	}
	return signal{node: node, uuid: str(m["uuid"]), gpu: idx, mig: giSet, gi: gi, ci: ci, namespace: str(m["namespace"]),
		pod: m["pod"], containr: str(m["container"])}, true
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

// smWithoutMemory reports whether a process has an SM utilization and no memory reading.
func (r *results) smWithoutMemory() bool {
	withMemory := make(map[processKey]bool, len(r.memory))
	for _, p := range r.memory {
		withMemory[keyOf(&p)] = true
	}
	for k := range r.sm {
		if !withMemory[k] {
			return true
		}
	}
	return false
}
