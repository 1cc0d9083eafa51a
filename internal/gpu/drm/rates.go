package drm

import (
	"time"
)

// engineKind is what an engine does, as the process families tell it: graphics or compute (the SM utilization of
// a process), video encode or decode.
type engineKind uint8

const (
	otherEngine engineKind = iota // copy (DMA), video enhancement, JPEG, VPE: no family
	graphicsEngine
	computeEngine
	encodeEngine
	decodeEngine
	videoEngine // Intel's video engine encodes and decodes: both families
	numKinds
)

// engineKinds are the engine names of each driver's fdinfo: amdgpu's (amdgpu_fdinfo.c, amdgpu_ip_name), i915's
// (i915_drm_client.c, uabi_class_names) and xe's (xe_hw_engine.c, xe_hw_engine_class_to_str). No name means two
// things in two drivers.
var engineKinds = map[string]engineKind{
	"gfx": graphicsEngine, "compute": computeEngine, "enc": encodeEngine, "enc_1": encodeEngine, "dec": decodeEngine,
	"render": graphicsEngine, "video": videoEngine,
	"rcs": graphicsEngine, "ccs": computeEngine, "vcs": videoEngine,
}

// rateKey names one client across readings: its device's PCI address (a device's index can change when another
// leaves) and its client ID, or for a client without one its process and fd.
type rateKey struct {
	pci string
	id  uint64
	pid uint32
	fd  int
}

func (c *client) rateKey(pci string) rateKey {
	if c.HasID {
		return rateKey{pci: pci, id: c.ID}
	}
	return rateKey{pci: pci, pid: c.pid, fd: c.fd}
}

// clientCounters are one client's engine counters at the last reading that saw it.
type clientCounters struct {
	at      time.Time
	engines []Engine
	reading uint64
}

func (c *clientCounters) engine(name string) (Engine, bool) {
	for _, e := range c.engines {
		if e.Name == name {
			return e, true
		}
	}
	return Engine{}, false
}

// rates keeps the counters of the clients of the last reading, for the next one's rates.
type rates struct {
	clients map[rateKey]*clientCounters
	reading uint64 // the reading under way, counted
	scratch []Engine
}

// keep records a client's counters at this reading; prev are its counters at the previous one (nil for a client
// not seen then), which it overwrites. Of each counter it keeps the larger of this reading's and the previous
// one's: the document lets a driver report a value lower than one it reported before, and asks userspace to stay
// with the larger until the counter catches up.
func (r *rates) keep(c *client, pci string, prev *clientCounters, now time.Time) {
	engines := append(r.scratch[:0], c.Engines...)
	r.scratch = engines
	if prev == nil {
		prev = &clientCounters{}
		r.clients[c.rateKey(pci)] = prev
	} else {
		for i := range engines {
			p, found := prev.engine(engines[i].Name)
			if !found {
				continue
			}
			e := &engines[i]
			if p.HasBusyNS && e.HasBusyNS && p.BusyNS > e.BusyNS {
				e.BusyNS = p.BusyNS
			}
			if p.HasCycles && e.HasCycles && p.Cycles > e.Cycles {
				e.Cycles = p.Cycles
			}
			if p.HasTotalCycles && e.HasTotalCycles && p.TotalCycles > e.TotalCycles {
				e.TotalCycles = p.TotalCycles
			}
		}
	}
	prev.engines = append(prev.engines[:0], engines...)
	prev.at, prev.reading = now, r.reading
}

// sweep forgets the clients this reading did not see.
func (r *rates) sweep() {
	for k, c := range r.clients {
		if c.reading != r.reading {
			delete(r.clients, k)
		}
	}
}

// fraction is the fraction of the time between two readings in which an engine class was busy with the client's
// work, over the class's capacity: busy cycles over total cycles where the driver counts both (xe, on the GPU's
// own clock), else busy nanoseconds over the wall time. A counter below the previous one counts as no progress.
func fraction(prev Engine, found bool, cur Engine, elapsed time.Duration) (float64, bool) {
	if !found {
		return 0, false
	}
	capacity := float64(max(cur.Capacity, 1))
	switch {
	case cur.HasCycles && cur.HasTotalCycles && prev.HasCycles && prev.HasTotalCycles:
		if cur.TotalCycles <= prev.TotalCycles {
			return 0, false
		}
		var busy uint64
		if cur.Cycles > prev.Cycles {
			busy = cur.Cycles - prev.Cycles
		}
		return min(float64(busy)/float64(cur.TotalCycles-prev.TotalCycles)/capacity, 1), true
	case cur.HasBusyNS && prev.HasBusyNS:
		if elapsed <= 0 {
			return 0, false
		}
		var busy uint64
		if cur.BusyNS > prev.BusyNS {
			busy = cur.BusyNS - prev.BusyNS
		}
		return min(float64(busy)/float64(elapsed.Nanoseconds())/capacity, 1), true
	}
	return 0, false
}
