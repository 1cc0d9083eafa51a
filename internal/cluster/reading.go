package cluster

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// reading joins the answers into the view: a node per name seen, its state from up, its last reading and its
// scrape interval, departed nodes left out; each process's row with its SM utilization; each GPU's line with its
// readings, health and signals; a node scraped twice shown once; the history.
func (r *results) view(interval time.Duration) *view.Reading {
	now := 0.0
	for i, t := range r.evaluated {
		if !queries[i].history {
			now = max(now, t)
		}
	}
	v := &view.Reading{Time: time.UnixMilli(int64(math.Round(now * 1000))), Cluster: true}
	names := make(map[string]bool)
	for n := range r.lastReading {
		names[n] = true
	}
	for n := range r.up {
		names[n] = true
	}
	current := make(map[string]bool) // nodes whose series are current: their GPUs, processes and signals are shown
	r.isCurrent = current
	for name := range names {
		n := view.Node{Name: name, AllocationsKnown: r.allocKnown[name], Simulated: r.simulated[name]}
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
		up, targeted := r.up[name]
		source, sourceKnown := r.sourceUp[name]
		switch {
		case !targeted && (!seen || n.Age > Departed):
			continue // its target is gone, and so is its last reading: it has left
		case targeted && up == 0:
			n.State = view.NodeDown
		case !seen || n.Age > 2*every:
			n.State = view.NodeStale
		case sourceKnown && source == 0:
			n.State = view.NodeSourceDown
		}
		current[name] = !n.Stale()
		v.Nodes = append(v.Nodes, n)
	}

	// A GPU belongs to one node: where two nodes name the same GPU (one exporter scraped by two jobs that name its
	// node differently: the chart's ServiceMonitor by the node's name, annotation discovery by the pod's address),
	// the name that is not a host:port address keeps it, else the one that sorts first, and a node left with no
	// GPU of its own is the other's alias.
	owner := make(map[string]string) // GPU UUID → node
	reported := make(map[string]bool)
	claim := func(node, uuid string) {
		reported[node] = true
		if o, ok := owner[uuid]; !ok || preferred(node, o) {
			owner[uuid] = node
		}
	}
	for _, g := range r.gpus {
		claim(g.node, g.uuid)
	}
	for _, p := range r.memory {
		claim(p.Node, p.UUID)
	}
	for _, p := range r.smOnly {
		claim(p.Node, p.UUID)
	}
	for k := range r.health {
		claim(k.node, k.uuid)
	}
	for k := range r.counts {
		claim(k.node, k.uuid)
	}
	owns := make(map[string]bool)
	for _, node := range owner {
		owns[node] = true
	}
	v.Nodes = slices.DeleteFunc(v.Nodes, func(n view.Node) bool { return reported[n.Name] && !owns[n.Name] })
	mine := func(node, uuid string) bool { return current[node] && owner[uuid] == node }

	v.Processes, v.Duplicates = r.processes(mine)
	if w := r.unlisted(v.Processes, mine); w != "" {
		v.Warnings = append(v.Warnings, w)
	}
	gpus, dup := r.gpuLines(mine)
	v.GPUs = gpus
	v.Duplicates += dup
	if len(r.gpus) == 0 {
		// ps reads no GPU lines: the GPUs with a health problem still have theirs, for their notes.
		for k, h := range r.health {
			if mine(k.node, k.uuid) {
				v.GPUs = append(v.GPUs, view.GPU{Node: k.node, Index: h.index, UUID: k.uuid})
			}
		}
	}
	for i := range v.GPUs {
		g := &v.GPUs[i]
		if h := r.health[gpuKey{g.Node, g.UUID}]; h != nil {
			g.Health, g.Severity = h.Problems()
		}
	}
	sigs, dup := r.signals(mine)
	v.Signals = sigs
	v.Duplicates += dup
	if len(r.utilization) > 0 || len(r.memoryRatio) > 0 || len(r.workloadSM) > 0 {
		v.History = view.NewHistory()
		for k, points := range r.utilization {
			v.History.GPU(view.GPUKey(k.node, k.uuid)).Utilization = points
		}
		for k, points := range r.memoryRatio {
			v.History.GPU(view.GPUKey(k.node, k.uuid)).Memory = points
		}
		v.History.Workloads = r.workloadSM
	}
	for _, n := range r.dropped {
		v.Dropped += n
	}
	view.Summarize(v)
	if len(r.gpus) == 0 {
		// Summarize counted the health notes' GPUs as the nodes' GPUs: ps has no count of them.
		for i := range v.Nodes {
			v.Nodes[i].GPUs, v.Nodes[i].Busy = 0, 0
		}
	}
	return v
}

// preferred reports whether a node's name is the one to keep of two names of one node: a name over an address.
func preferred(name, other string) bool {
	address := func(s string) bool { return strings.Contains(s, ":") }
	if address(name) != address(other) {
		return !address(name)
	}
	return name < other
}

// processes are the rows of the current nodes, each process once: a process is one (GPU UUID, PID, MIG instance),
// as the node's view lists it, and where it was read twice (a node scraped by two jobs) the series of the node that
// keeps the GPU is kept. dup counts the rows left out as read twice.
func (r *results) processes(mine func(node, uuid string) bool) (procs []view.Process, dup int) {
	seen := make(map[processKey]bool, len(r.memory))
	procs = make([]view.Process, 0, len(r.memory)+len(r.smOnly))
	for _, list := range [][]view.Process{r.memory, r.smOnly} {
		for i := range list {
			p := &list[i]
			k := keyOf(p)
			k.node = "" // a GPU is one node's
			switch {
			case !mine(p.Node, p.UUID) && r.isCurrent[p.Node]:
				dup++ // its GPU is another node's: this is the other's alias
				continue
			case !mine(p.Node, p.UUID):
				continue // a stale node's
			case seen[k]:
				dup++
				continue
			}
			seen[k] = true
			procs = append(procs, *p)
			if sm, ok := r.sm[keyOf(p)]; ok && !math.IsNaN(sm) && !p.SM.Valid {
				procs[len(procs)-1].SM = gpu.Known(sm)
			}
		}
	}
	r.memory, r.smOnly = nil, nil // the rows are procs now
	return procs, dup
}

// unlisted says how many processes the current nodes' GPUs count and the rows do not list, "" when none: a process
// whose exporter knows neither its memory nor its SM utilization has no series to be a row (nor has any process of
// an exporter run with --no-collector.processes), and is not to go missing without a word.
func (r *results) unlisted(rows []view.Process, mine func(node, uuid string) bool) string {
	listed := make(map[gpuKey]int, len(r.counts))
	for i := range rows {
		listed[gpuKey{rows[i].Node, rows[i].UUID}]++
	}
	type missing struct {
		gpuKey
		index, n int
	}
	var gpus []missing
	total := 0
	for k, c := range r.counts {
		if n := c.n - listed[k]; n > 0 && mine(k.node, k.uuid) {
			gpus = append(gpus, missing{k, c.index, n})
			total += n
		}
	}
	if total == 0 {
		return ""
	}
	slices.SortFunc(gpus, func(a, b missing) int { return cmp.Or(strings.Compare(a.node, b.node), cmp.Compare(a.index, b.index)) })
	const named = 3
	where := make([]string, 0, named+1)
	for _, g := range gpus[:min(len(gpus), named)] {
		where = append(where, fmt.Sprintf("%d on GPU %d of %s", g.n, g.index, g.node))
	}
	if len(gpus) > named {
		where = append(where, fmt.Sprintf("%d more GPUs", len(gpus)-named))
	}
	processes := "processes"
	if total == 1 {
		processes = "process"
	}
	return fmt.Sprintf("%d %s not listed: their exporters wrote no memory or SM utilization series for them "+
		"(none known, or --no-collector.processes): %s", total, processes, strings.Join(where, ", "))
}

// gpuLines are the current nodes' GPUs, each UUID once, with their readings and allocation counts.
func (r *results) gpuLines(mine func(node, uuid string) bool) ([]view.GPU, int) {
	gpus := make([]view.GPU, 0, len(r.gpus))
	seen := make(map[string]bool, len(r.gpus))
	dup := 0
	for _, info := range r.gpus {
		if !mine(info.node, info.uuid) || seen[info.uuid] {
			if seen[info.uuid] || r.isCurrent[info.node] {
				dup++ // read twice, or its node is another's alias
			}
			continue
		}
		seen[info.uuid] = true
		k := gpuKey{info.node, info.uuid}
		g := view.GPU{
			Node: info.node, Index: info.index, UUID: info.uuid, Name: strings.TrimPrefix(info.name, "NVIDIA "),
			MIG: info.mig, MIGInstances: r.mig[k], MPS: r.mps[k], AllocatedPods: r.pods[k], AllocationsUnknown: !r.allocKnown[info.node],
		}
		values := r.readings[k]
		for i, f := range gpuLine {
			if values != nil {
				f.set(&g, values[i])
			}
		}
		gpus = append(gpus, g)
	}
	slices.SortFunc(gpus, func(a, b view.GPU) int { return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(a.Index, b.Index)) })
	return gpus, dup
}

// signals are the current nodes' allocation signals, each once, with each GPU's counts of pods idle and using it
// unrequested.
func (r *results) signals(mine func(node, uuid string) bool) ([]view.Signal, int) {
	var out []view.Signal
	seen := make(map[signal]bool)
	dup := 0
	for _, list := range []struct {
		kind view.SignalKind
		sigs []signal
	}{{view.IdleAllocation, r.idle}, {view.Unrequested, r.unreq}} {
		for _, s := range list.sigs {
			if !mine(s.node, s.uuid) {
				if r.isCurrent[s.node] {
					dup++ // its node is another's alias
				}
				continue
			}
			k := s
			k.node = ""
			if seen[k] {
				dup++
				continue
			}
			seen[k] = true
			out = append(out, view.AllocationSignal(list.kind, s.node, s.gpu, s.mig, s.gi, s.ci, s.namespace, s.pod, s.containr))
		}
	}
	return out, dup
}
