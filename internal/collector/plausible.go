package collector

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// plausible is the range of a device family's values, in its unit, and for a counter the most it can grow in a
// second (0: not checked). Drivers answer "not available" with a sentinel rather than an error for some GPUs and
// fields: NVML_VALUE_NOT_AVAILABLE (-1, so 0xFFFFFFFF in an unsigned int and 2^64-1 in an unsigned long long, as
// nvml.h defines it for the fields that say so), and values as wild now and then (a sample of 37,100%, which
// the NVML source drops where it reads them). Written as they are, one scrape shows a utilization of 4.29e7, a
// temperature of 4.29e9 °C, 4.29 MW or an NVLink rate of 1.5e15 MB/s. So a value outside its family's range, or a
// counter that grew faster than it can, is left out (absent, as an unknown value is) for that reading and counted
// in gpu_pod_exporter_implausible_values_total. A counter that went back is written: a driver reload restarts it,
// and Prometheus reads that as a reset.
type plausible struct{ min, max, rate float64 }

// holds reports whether v is in the range.
func (p plausible) holds(v float64) bool { return v >= p.min && v <= p.max } // false for NaN

// The ranges of the families, by what they measure. They are far wider than any GPU's, and narrower than the
// sentinels.
var (
	identity = plausible{min: 1, max: 1} // an info family's 1
	fraction = plausible{min: 0, max: 1}
	// NVML: the fan speed "may exceed 100% in certain cases" (nvmlDeviceGetFanSpeed).
	fanSpeed    = plausible{min: 0, max: 2}
	temperature = plausible{min: -40, max: 200}
	power       = plausible{min: 0, max: 10_000} // W: a GB200 superchip's module draws 2,700
	// J since the driver loaded: 10 kW for 3,000 years; it grows at most by the most a board draws.
	energy      = plausible{min: 0, max: 1e15, rate: 10_000}
	memoryBytes = plausible{min: 0, max: 1 << 50} // 1 PiB; a B300 has 288 GB
	frequency   = plausible{min: 0, max: 1e11}    // Hz: GDDR memory clocks read 10 to 16 GHz
	// s a policy held the clocks down since the driver loaded: at most a second a second (twice, for the
	// readings' own timing).
	violationTime    = plausible{min: 0, max: 1e10, rate: 2}
	performanceState = plausible{min: 0, max: 15} // P0 to P15; NVML's "unknown" is 32
	// Counts of errors in unsigned long long counters (ECC, NVLink errors): 2^64-1 is out.
	wideCount = plausible{min: 0, max: 1 << 53}
	// Counts in unsigned ints (PCIe replays, remapped rows, retired pages): 0xFFFFFFFF is NVML's "not available".
	narrowCount    = plausible{min: 0, max: math.MaxUint32 - 1}
	ownCount       = plausible{min: 0, max: math.Inf(1)} // what the exporter counts itself
	flag           = plausible{min: 0, max: 1}
	recoveryAction = plausible{min: 0, max: 4}  // NVML_GPU_RECOVERY_ACTION_NONE to _DRAIN_AND_RESET
	pcieGeneration = plausible{min: 1, max: 16} // 1 to 7 exist
	pcieWidth      = plausible{min: 1, max: 32}
	fabricState    = plausible{min: 0, max: 3} // NVML_GPU_FABRIC_STATE_NOT_SUPPORTED to _COMPLETED
	// Bytes since the driver loaded, in counters that wrap at 2^64 bytes (PCIe) and 2^64 KiB (NVLink), so 2^64-1 is
	// out; growing at most 1 TB/s (PCIe 7.0 x16: 256 GB/s each way) and 10 TB/s (NVLink 5: 1.8 TB/s).
	pcieTraffic   = plausible{min: 0, max: math.Nextafter(0x1p64, 0), rate: 1e12}
	nvlinkTraffic = plausible{min: 0, max: math.Nextafter(0x1p74, 0), rate: 1e13}
)

// implausibleDesc counts the values left out.
var implausibleDesc = prometheus.NewDesc("gpu_pod_exporter_implausible_values_total", implausibleHelp,
	[]string{"family", "reason"}, nil)

const implausibleHelp = "Values of device families left out of readings because they were outside the family's " +
	"range (reason out_of_range: a driver's \"not available\" such as 0xFFFFFFFF, or garbage) or a counter grew faster " +
	"than it can (jump); only for families that had any."

// plausibility decides, once per reading, which device values are written: it keeps each rate-checked counter's last
// value, and counts what it left out. Scrapes that share a reading make the same decisions; only the first to write
// a reading counts.
type plausibility struct {
	mu       sync.Mutex
	newest   time.Time // the newest reading seen
	previous time.Time // the one before it
	counters map[counterKey]*counterState
	left     map[leftOut]uint64
}

// counterKey is one counter series: its family's row, its GPU, and its one label value beyond gpu and uuid.
type counterKey struct {
	row         int
	uuid, label string
}

// counterState is a counter's value at a reading, and whether that reading's value jumped.
type counterState struct {
	v    float64
	at   time.Time
	jump bool
}

type leftOut struct{ family, reason string }

func newPlausibility() *plausibility {
	return &plausibility{counters: make(map[counterKey]*counterState), left: make(map[leftOut]uint64)}
}

// reading tells of a reading taken at at, and reports whether it is new: the scrape that writes it first counts.
// The counters not read in the last two readings are forgotten.
func (p *plausibility) reading(at time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !at.After(p.newest) {
		return false
	}
	p.previous, p.newest = p.newest, at
	for k, c := range p.counters {
		if c.at.Before(p.previous) {
			delete(p.counters, k)
		}
	}
	return true
}

// check reports whether v, a value of family f (row row) of GPU uuid at the reading of time at, is written; one left
// out is counted when count is set.
func (p *plausibility) check(f *deviceFamily, row int, uuid, label string, v float64, at time.Time, count bool) bool {
	reason := ""
	switch {
	case !f.within.holds(v):
		reason = "out_of_range"
	case f.within.rate > 0 && p.jumped(counterKey{row, uuid, label}, v, at, f.within.rate):
		reason = "jump"
	default:
		return true
	}
	if count {
		p.mu.Lock()
		p.left[leftOut{f.name, reason}]++
		p.mu.Unlock()
	}
	return false
}

// jumped reports whether a counter grew faster than rate a second since the reading before. A value that jumped is
// left out of its reading and the next ones count from it: a real jump costs one reading, a wrong value is undone
// by the next, which then reads as a reset. A reading older than the newest is not judged.
func (p *plausibility) jumped(k counterKey, v float64, at time.Time, rate float64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.counters[k]
	switch {
	case c == nil:
		p.counters[k] = &counterState{v: v, at: at}
		return false
	case at.Equal(c.at):
		return c.jump // decided for this reading by the scrape that wrote it first
	case at.Before(c.at):
		return false
	}
	dt := max(at.Sub(c.at).Seconds(), 1)
	*c = counterState{v: v, at: at, jump: v-c.v > rate*dt}
	return c.jump
}

// Describe implements prometheus.Collector.
func (p *plausibility) Describe(ch chan<- *prometheus.Desc) { ch <- implausibleDesc }

// Collect implements prometheus.Collector.
func (p *plausibility) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	keys := make([]leftOut, 0, len(p.left))
	for k := range p.left {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b leftOut) int {
		return cmp.Or(cmp.Compare(a.family, b.family), cmp.Compare(a.reason, b.reason))
	})
	counts := make([]uint64, len(keys))
	for i, k := range keys {
		counts[i] = p.left[k]
	}
	p.mu.Unlock()
	for i, k := range keys {
		ch <- prometheus.MustNewConstMetric(implausibleDesc, prometheus.CounterValue, float64(counts[i]), k.family, k.reason)
	}
}
