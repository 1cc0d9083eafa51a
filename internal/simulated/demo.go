package simulated

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// DemoNode is the name of the built-in demo node: --demo alone is --demo=node-a.
const DemoNode = "node-a"

var demoName = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// CheckDemoName says whether a name can be given to --demo: a built-in node's (Presets), or a DNS label of
// lower-case letters, digits, dots and dashes (a node's name).
func CheckDemoName(name string) error {
	if _, ok := presets[name]; ok {
		return nil
	}
	if !demoName.MatchString(name) {
		return fmt.Errorf("%q is not a node name: lower-case letters, digits, dots and dashes, at most 63", name)
	}
	return nil
}

// DemoNamed returns a demo node by name: DemoNode is the built-in one (Demo), a preset's name (Presets) that
// preset; any other name is a node of its own, derived from DemoNode and the same at every start: its own GPU and
// MIG UUIDs, PIDs, pods (names, UIDs and container IDs), Slurm job and DRA pool, its GPUs' faults on other GPUs and
// its GPUs busier or idler, so that a few demo exporters behind one Prometheus are a cluster whose nodes differ.
func DemoNamed(name string) (*Source, error) {
	if name == DemoNode {
		name = ""
	}
	if _, ok := presets[name]; ok {
		return Preset(name)
	}
	if err := CheckDemoName(name); err != nil {
		return nil, err
	}
	cfg, err := parse(demoYAML)
	if err != nil {
		panic("built-in demo node is invalid: " + err.Error())
	}
	derive(cfg, name)
	if err := validate(cfg); err != nil {
		panic(fmt.Sprintf("demo node %q derived invalid: %v", name, err))
	}
	now := time.Now()
	return &Source{cfg: cfg, now: time.Now, loaded: now, opened: now}, nil
}

// derive turns the demo node into node name's.
func derive(cfg *nodeConfig, name string) {
	seed := hash(name, "")
	hex := func(what string, n int) string {
		var b strings.Builder
		for i := 0; b.Len() < n; i++ {
			fmt.Fprintf(&b, "%016x", hash(name, fmt.Sprint(what, "\x00", i)))
		}
		return b.String()[:n]
	}
	uuid := func(old string) string {
		prefix, _, _ := strings.Cut(old, "-")
		h := hex(old, 32)
		return fmt.Sprintf("%s-%s-%s-%s-%s-%s", prefix, h[:8], h[8:12], h[12:16], h[16:20], h[20:32])
	}
	uuids := make(map[string]string)
	pods := make(map[string]string) // namespace/pod → its new name
	pod := func(namespace, old string) string {
		k := namespace + "/" + old
		if p, ok := pods[k]; ok {
			return p
		}
		parts := strings.Split(old, "-")
		last := parts[len(parts)-1]
		if _, err := strconv.Atoi(last); err == nil {
			parts[len(parts)-1] = strconv.FormatUint(hash(name, k)%10, 10) // a StatefulSet's ordinal
		} else if len(parts) > 1 {
			parts[len(parts)-1] = base36(hash(name, k), len(last)) // a ReplicaSet's random suffix
		} else {
			parts = append(parts, base36(hash(name, k), 5))
		}
		pods[k] = strings.Join(parts, "-")
		return pods[k]
	}
	pidShift := uint32(1000 + seed%3000*1000)
	// Faults, slowdowns and degraded links move to other GPUs of the same kind, each GPU's to one other; load
	// scales by up to ±30%.
	kinds := make(map[string][]int)
	for i := range cfg.GPUs {
		kinds[cfg.GPUs[i].Name] = append(kinds[cfg.GPUs[i].Name], i)
	}
	faulty := make([]faults, len(cfg.GPUs))
	for i := range cfg.GPUs {
		faulty[i] = faultsOf(&cfg.GPUs[i])
	}
	for _, same := range kinds {
		if len(same) < 2 {
			continue
		}
		k := 1 + int(seed%uint64(len(same)-1))
		for n, i := range same {
			faulty[i].apply(&cfg.GPUs[same[(n+k)%len(same)]])
		}
	}
	for i := range cfg.GPUs {
		g := &cfg.GPUs[i]
		scale := 0.7 + float64(hash(name, g.UUID)%61)/100
		if g.UtilizationRatio != nil && *g.UtilizationRatio > 0 {
			*g.UtilizationRatio = ratio(min(float64(*g.UtilizationRatio)*scale, 1))
		}
		uuids[g.UUID] = uuid(g.UUID)
		g.UUID = uuids[g.UUID]
		for m := range g.MIGInstances {
			uuids[g.MIGInstances[m].UUID] = uuid(g.MIGInstances[m].UUID)
			g.MIGInstances[m].UUID = uuids[g.MIGInstances[m].UUID]
		}
		for p := range g.Processes {
			proc := &g.Processes[p]
			proc.PID += pidShift
			if proc.SMUtilizationRatio != nil {
				*proc.SMUtilizationRatio = ratio(min(float64(*proc.SMUtilizationRatio)*scale, 1))
			}
			if proc.Identity == nil {
				continue
			}
			id := &proc.Identity.Identity
			if id.Pod != "" {
				id.Pod = pod(id.Namespace, id.Pod)
			}
			if id.PodUID != "" {
				id.PodUID = uuid("-" + id.PodUID)[1:]
			}
			if id.ContainerID != "" {
				id.ContainerID = hex(id.ContainerID, len(id.ContainerID))
			}
			if id.SlurmJobID != "" {
				if n, err := strconv.Atoi(id.SlurmJobID); err == nil {
					id.SlurmJobID = strconv.Itoa(n + 1 + int(seed%9000))
				}
			}
		}
	}
	if cfg.Allocations != nil {
		for i := range *cfg.Allocations {
			a := &(*cfg.Allocations)[i]
			a.Pod = pod(a.Namespace, a.Pod)
			for d, id := range a.DeviceIDs {
				device, replica, shared := strings.Cut(id, "::") // a time-slicing replica, GPU-…::1
				if u, ok := uuids[device]; ok && shared {
					a.DeviceIDs[d] = u + "::" + replica
				} else if ok {
					a.DeviceIDs[d] = u
				}
			}
			if a.Claim != nil && a.Claim.Pool != "" {
				a.Claim.Pool = name
			}
		}
	}
}

// faults are what a GPU's reading says is wrong with it.
type faults struct {
	xids         map[uint64]uint64
	remapped     *remappedRowsConfig
	recovery     *recoveryAction
	clockEvents  *[]clockReason
	pcieWidth    *count
	pcieMaxWidth *count
}

func faultsOf(g *gpuConfig) faults {
	f := faults{xids: g.XIDErrors, remapped: g.RemappedRows, recovery: g.RecoveryAction, clockEvents: g.ClockEventsActive}
	if g.PCIe != nil {
		f.pcieWidth, f.pcieMaxWidth = g.PCIe.Width, g.PCIe.MaxWidth
	}
	return f
}

func (f faults) apply(g *gpuConfig) {
	g.XIDErrors, g.RemappedRows, g.RecoveryAction, g.ClockEventsActive = f.xids, f.remapped, f.recovery, f.clockEvents
	if g.PCIe != nil {
		pcie := *g.PCIe
		pcie.Width, pcie.MaxWidth = f.pcieWidth, f.pcieMaxWidth
		g.PCIe = &pcie
	}
}

func hash(name, what string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(what))
	return h.Sum64()
}

// base36 writes n digits of v in lower-case base 36, as Kubernetes' random name suffixes are.
func base36(v uint64, n int) string {
	const digits = "bcdfghjklmnpqrstvwxz2456789" // the alphabet of Kubernetes' rand.String
	b := make([]byte, n)
	for i := range b {
		b[i] = digits[v%uint64(len(digits))]
		v /= uint64(len(digits))
	}
	return string(b)
}
