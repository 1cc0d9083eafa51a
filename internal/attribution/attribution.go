// Package attribution finds who owns each GPU process: it reads the process's name and cgroup from procfs, derives
// pod, container, Slurm job and systemd unit from the cgroup path, and asks the container runtimes for names.
//
// Follow one PID: Attribute reads <procfs>/<pid>/stat for its name and start time (internal/procfs), and keeps the
// file open for the next scrape; the first time it sees that PID with that start time, it reads
// <procfs>/<pid>/cgroup, which cgroup.Parse turns into pod UID, container ID, runtime, QoS, Slurm job and systemd
// unit (internal/cgroup). The container ID is named by the runtimes' APIs through a cache (names.go, which asks
// them through resolvers.go), so that in steady state a scrape makes one read system call per PID and no runtime
// call.
package attribution

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/runtime"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/selfmetrics"
)

// Defaults for the zero values of Config.
const (
	DefaultLookupBudget         = 250 * time.Millisecond
	DefaultLookupTimeout        = 2 * time.Second
	DefaultNegativeTTL          = 30 * time.Second
	DefaultMaxConcurrentLookups = 8
	DefaultMaxPendingLookups    = 256
)

// Owner is what attribution learned about one PID.
type Owner struct {
	// Name is the process name: /proc/<pid>/comm, else what the GPU source called it.
	Name     string
	Identity Identity
	// Started is when the process started (its stat's start time after the machine's boot); zero when unknown.
	Started time.Time
}

// Config configures an Attributor. Zero durations take the defaults above.
type Config struct {
	ProcFS string // the host's proc filesystem, usually /proc
	// Preset gives the owners of processes that a GPU source already knows (the simulated node): they are kept
	// as they are, without reading procfs or asking runtimes. Nil: none.
	Preset Preset
	// Resolvers name containers, tried in the order that the container's runtime calls for (see chainFor); a
	// runtime without a resolver leaves only the cgroup-derived labels.
	Resolvers []runtime.Resolver
	// PodLabels is the allowlist of pod label keys (--kubernetes.pod-labels) kept in identity.PodLabels. Empty:
	// none.
	PodLabels []string
	// LookupBudget is the longest a scrape waits for the runtimes to name containers it has not seen before.
	// Lookups still running then finish in the background and serve the next scrape; this one keeps the
	// cgroup-derived labels.
	LookupBudget time.Duration
	// LookupTimeout is the deadline of one runtime call.
	LookupTimeout time.Duration
	// NegativeTTL is how long a container that no runtime knows, or that could not be looked up because a runtime
	// failed, is left unasked.
	NegativeTTL time.Duration
	// Users names process owners (--collector.process-user). Nil: owners get no user, not even one a simulated node
	// presets.
	Users UserResolver
	// MaxConcurrentLookups bounds the runtime calls in flight (a node starting many containers at once).
	MaxConcurrentLookups int
	// MaxPendingLookups bounds the lookups started and not ended, running or waiting for one of the
	// MaxConcurrentLookups: a container found beyond it keeps its cgroup labels and is looked up at a later scrape.
	MaxPendingLookups int
	// KeptFiles is the budget of process files kept open between readings (procfs.KeptFileBudget). Nil: 4,096.
	KeptFiles *procfs.KeptFiles
	Logger    *slog.Logger
	// Now is the clock for NegativeTTL; tests inject one. Default time.Now.
	Now func() time.Time
}

// Preset is a GPU source that knows who owns some of its processes: the simulated node, whose PIDs need not
// exist. PresetOwners returns them by PID, and PresetStarted when those that it says started; the maps are read-only.
type Preset interface {
	PresetOwners() map[uint32]Identity
	PresetStarted() map[uint32]time.Time
}

// UserResolver names the owner of a process: its user name, or its uid when the node's user database does not
// name it (internal/users).
type UserResolver interface {
	User(pid uint32) (string, error)
}

// Attributor labels GPU processes with their owners. It is safe for concurrent use.
type Attributor struct {
	procfs  string
	preset  Preset
	users   UserResolver
	logger  *slog.Logger
	metrics *metrics
	self    selfmetrics.Set // metrics, as a prometheus.Collector
	health  *procfs.Health
	kept    *procfs.KeptFiles
	names   *names
	// podCaches are the resolvers that keep pods between lookups: told the pods of each complete reading.
	podCaches []runtime.PodCache

	mu sync.Mutex
	// procs are the cgroup-derived identities of the processes of the last reading, by PID: a process is read once
	// for its whole life, told from a later process with the same PID by its start time. A process that leaves the
	// GPUs leaves this map at the next reading, so it holds no more than the node's GPU processes.
	procs map[uint32]*procEntry
	// keptComm is set on the kernel's procfs, where the file kept open for a process is its comm: tied to the
	// process like stat (ESRCH once it has exited, even with its PID reused), and a third of stat's cost to read
	// (0.7 against 2.5 µs here), which at thousands of processes is a third of a scrape. The start time is then
	// read once, when the process is first seen. A tree that is not procfs (a fake one in tests and in make bench)
	// ties no file to a process, and keeps stat, whose start time tells a reused PID.
	keptComm bool
	// boot is when the machine booted, from which a process's start time is a time; zero when procfs does not say.
	boot time.Time
}

// Boot is when the machine booted, as the processes' Started times count from it; zero when procfs does not say.
func (a *Attributor) Boot() time.Time { return a.boot }

// New returns an Attributor. Call Close to stop the lookups it may still have running.
func New(cfg Config) *Attributor {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ProcFS == "" {
		cfg.ProcFS = "/proc"
	}
	if cfg.LookupBudget <= 0 {
		cfg.LookupBudget = DefaultLookupBudget
	}
	if cfg.LookupTimeout <= 0 {
		cfg.LookupTimeout = DefaultLookupTimeout
	}
	if cfg.NegativeTTL <= 0 {
		cfg.NegativeTTL = DefaultNegativeTTL
	}
	if cfg.MaxConcurrentLookups <= 0 {
		cfg.MaxConcurrentLookups = DefaultMaxConcurrentLookups
	}
	if cfg.MaxPendingLookups <= 0 {
		cfg.MaxPendingLookups = DefaultMaxPendingLookups
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.KeptFiles == nil {
		cfg.KeptFiles = procfs.NewKeptFiles(maxOpenStat)
	}
	m := newMetrics(cfg.Resolvers)
	n := newNames(cfg, m)
	kernel, _ := procfs.IsProcFS(cfg.ProcFS)
	var boot time.Time
	if kernel {
		boot, _ = procfs.BootTime(cfg.ProcFS)
	}
	var podCaches []runtime.PodCache
	for _, r := range cfg.Resolvers {
		if c, ok := r.(runtime.PodCache); ok {
			podCaches = append(podCaches, c)
		}
	}
	return &Attributor{
		procfs:    cfg.ProcFS,
		keptComm:  kernel,
		boot:      boot,
		preset:    cfg.Preset,
		users:     cfg.Users,
		logger:    cfg.Logger,
		metrics:   m,
		self:      m.set(n, cfg.Resolvers),
		health:    procfs.NewHealth(cfg.ProcFS, cfg.Logger),
		kept:      cfg.KeptFiles,
		names:     n,
		podCaches: podCaches,
	}
}

// Close stops lookups still running in the background and waits for them, and closes the stat files it keeps.
// Attribute still works after Close, with cache hits and cgroup-derived labels only.
func (a *Attributor) Close() error {
	a.names.close()
	a.mu.Lock()
	defer a.mu.Unlock()
	for pid, e := range a.procs {
		e.closeStat()
		delete(a.procs, pid)
	}
	return nil
}

// pending is one process being attributed.
type pending struct {
	pid   uint32
	owner Owner
	// outer is the pod's container that holds the process's container (Docker-in-Docker in a pod), named in its
	// stead when the runtimes cannot name the inner one.
	outer string
	// delegated is set for a process below a user manager, whose cgroup names the user chose: its container ID is
	// not looked up in the runtimes, which would give it the names of whichever container has that ID.
	delegated bool
}

// Attribute returns the owner of every process in the snapshot, keyed by PID. It never fails: what cannot be
// learned is left empty. Every value is valid UTF-8, as label values must be. It waits at most the lookup budget (or until ctx ends) for the runtimes.
func (a *Attributor) Attribute(ctx context.Context, snap *gpu.Snapshot) map[uint32]Owner {
	n := 0
	for _, d := range snap.Devices {
		n += len(d.Processes)
	}
	owners := make(map[uint32]Owner, n)
	procs := make([]pending, 0, n)
	var r *procfs.Reader
	var tally procfs.Tally
	var preset map[uint32]Identity
	var presetStarted map[uint32]time.Time
	if a.preset != nil {
		preset, presetStarted = a.preset.PresetOwners(), a.preset.PresetStarted()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := make(map[uint32]*procEntry, len(a.procs))
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if _, done := owners[p.PID]; done {
				continue
			}
			if id, ok := preset[p.PID]; ok {
				if a.users == nil {
					id.User = ""
				}
				owners[p.PID] = Owner{Name: p.Name, Identity: id, Started: presetStarted[p.PID]}
				continue
			}
			if r == nil {
				r = procfs.NewReader(a.procfs)
			}
			o, outer, delegated := a.fromProcFS(r, p, &tally, seen)
			owners[p.PID] = o
			procs = append(procs, pending{pid: p.PID, owner: o, outer: outer, delegated: delegated})
		}
	}
	for pid, e := range a.procs {
		if _, ok := seen[pid]; !ok {
			e.closeStat()
		}
	}
	a.procs = seen
	a.health.Update(tally)

	// One lookup per container, however many of its processes use GPUs.
	want := make(map[string]lookupHint)
	for _, p := range procs {
		if p.delegated {
			continue
		}
		if id := p.owner.Identity; id.ContainerID != "" {
			want[id.ContainerID] = lookupHint{runtime: id.Runtime, inPod: id.PodUID != ""}
		}
		if p.outer != "" {
			// Looked up alongside the inner container, not after it, so that both fit in one budget.
			if _, ok := want[p.outer]; !ok {
				want[p.outer] = lookupHint{inPod: true}
			}
		}
	}
	complete := snapshotComplete(snap)
	named, unnamed := a.names.lookup(ctx, want, complete)
	for _, p := range procs {
		o := p.owner
		if c, ok := named[o.Identity.ContainerID]; ok {
			applyNames(c, &o.Identity, false)
			owners[p.pid] = o
		} else if c, ok := named[p.outer]; ok && unnamed[o.Identity.ContainerID] {
			applyNames(c, &o.Identity, true)
			owners[p.pid] = o
		}
	}
	if complete && len(a.podCaches) > 0 {
		// The runtimes forget the pods no GPU process is in any more, as the name cache forgets their containers.
		pods := make(map[string]bool)
		for _, o := range owners {
			if o.Identity.PodUID != "" {
				pods[o.Identity.PodUID] = true
			}
		}
		for _, c := range a.podCaches {
			c.KeepPods(pods)
		}
	}
	for pid, o := range owners {
		if !utf8.ValidString(o.Name) || !o.Identity.isValidUTF8() {
			o.Name = strings.ToValidUTF8(o.Name, "\uFFFD")
			o.Identity = o.Identity.validUTF8()
			owners[pid] = o
		}
	}
	return owners
}

// snapshotComplete reports whether the snapshot lists every GPU process on the node. Only then does a container
// missing from it mean that the container is gone: a device whose process list could not be read says nothing
// about its containers, and evicting them would cost a runtime call each at the next scrape.
func snapshotComplete(snap *gpu.Snapshot) bool {
	for _, d := range snap.Devices {
		if !d.ProcessesListed {
			return false
		}
	}
	for _, e := range snap.Errors {
		if e.Operation == gpu.OpDevice || e.Operation == gpu.OpProcesses {
			return false
		}
	}
	return true
}
