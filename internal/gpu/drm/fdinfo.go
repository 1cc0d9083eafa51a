// Package drm reads the GPUs that the Linux kernel's DRM drivers amdgpu, i915 and xe drive, with no vendor
// library: devices from sysfs (/sys/class/drm, hwmon, PCI), processes and their use from the DRM usage stats of
// each open DRM file (/proc/<pid>/fdinfo) and, for AMD's ROCm compute, from KFD (/sys/class/kfd/kfd/proc).
package drm

import (
	"bytes"
	"errors"
	"math"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Client is what one /proc/<pid>/fdinfo/<fd> of an open DRM file says about its DRM client, as the kernel's
// Documentation/gpu/drm-usage-stats.rst specifies the keys (testdata/SOURCES.md has the sources of every key read).
// A key that is absent, malformed or carries a unit its type does not take is left out, never read as 0.
type Client struct {
	// Driver is drm-driver, the only mandatory key: amdgpu, i915, xe, ...
	Driver string
	// PDev is drm-pdev, the PCI address of the device (0000:03:00.0); empty for a device that is not PCI.
	PDev string
	// ID is drm-client-id, valid when HasID: unique per device (with PDev) or per system, so that a client open
	// through several fds, or inherited by several processes, is counted once.
	ID    uint64
	HasID bool
	// Engines are the drm-engine-, drm-cycles-, drm-total-cycles- and drm-engine-capacity- keys, by engine name,
	// in the order first seen.
	Engines []Engine
	// Regions are the memory keys (drm-total-, drm-shared-, drm-resident-, drm-purgeable-, drm-active-, and the
	// deprecated drm-memory-, an alias of resident), by region name, in the order first seen.
	Regions []Region
}

// Engine is the usage of one engine (or class of identical engines) by one client.
type Engine struct {
	Name string
	// BusyNS is drm-engine-<name>: the time the engine spent busy with the client's work, in nanoseconds.
	BusyNS    uint64
	HasBusyNS bool
	// Cycles is drm-cycles-<name>, the busy cycles; TotalCycles is drm-total-cycles-<name>, a timestamp in the
	// same unit, so that Δcycles / Δtotal is the busy fraction measured on the GPU's own clock (xe).
	Cycles, TotalCycles       uint64
	HasCycles, HasTotalCycles bool
	// Capacity is drm-engine-capacity-<name>: how many identical engines the name stands for. 0 when the key is
	// absent, which the document says means 1.
	Capacity uint64
}

// Region is the memory one client holds in one memory region, in bytes. Each has a Has bit: a region the driver
// lists without, say, the active key has no active value.
type Region struct {
	Name                                           string
	Total, Shared, Resident, Purgeable, Active     uint64
	HasTotal, HasShared, HasResident, HasPurgeable bool
	HasActive                                      bool
}

// Bounds on what one fdinfo file may make the parser keep. A driver prints a dozen engines and a handful of
// regions; the rest of a file that claims more is ignored rather than kept.
const (
	maxEngines = 32
	maxRegions = 32
	maxNameLen = 64
)

// errNoDriver is the error of a file without drm-driver: not a DRM file, or a driver without usage stats.
var errNoDriver = errors.New("no drm-driver key: not a DRM file with usage stats")

// ParseFDInfo reads one fdinfo file. It follows the document's file format: one key-value pair per line, the key
// and value delimited by ':', whitespace after the delimiter ignored, keys prefixed "drm-" and free of whitespace,
// numbers with an optional unit of the key's type. Keys not prefixed drm- (pos, flags, amdgpu's pasid and amd-*)
// and unknown drm- keys are ignored. The first of a repeated key counts. A file without drm-driver is an error.
func ParseFDInfo(b []byte) (Client, error) {
	var c Client
	if err := c.parse(b); err != nil {
		return Client{}, err
	}
	return c, nil
}

// parse is ParseFDInfo into c, whose engines and regions it overwrites in place: a reading parses each DRM file
// again into what its last reading left, so that a client costs no allocation while it prints the same engines
// and regions, whose names, and its drm-pdev, are kept from then rather than made again.
func (c *Client) parse(b []byte) error {
	*c = Client{PDev: c.PDev, Engines: c.Engines[:0], Regions: c.Regions[:0]}
	lastPDev := c.PDev
	c.PDev = ""
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		c.parseLine(line, lastPDev)
	}
	if c.Driver == "" {
		return errNoDriver
	}
	return nil
}

// parseLine reads one line; lastPDev is the drm-pdev the client had before, whose string is reused when it is
// the same. The keys are told apart by their first letter, then their prefix, in the order that keeps
// drm-total-cycles- an engine's key rather than the memory region "cycles-...".
func (c *Client) parseLine(line []byte, lastPDev string) {
	if len(line) < 5 || string(line[:4]) != "drm-" {
		return
	}
	colon := bytes.IndexByte(line, ':')
	if colon < 0 {
		return
	}
	// A key with whitespace is no key: it matches none of the fixed keys, and validName refuses the engine or
	// region name of a prefixed one.
	k, value := line[4:colon], trimSpace(line[colon+1:])
	if len(k) == 0 {
		return
	}
	switch k[0] {
	case 'd':
		if string(k) == "driver" && c.Driver == "" && validValue(value) {
			c.Driver = name(value)
		}
	case 'p':
		if string(k) == "pdev" {
			c.parsePDev(value, lastPDev)
			return
		}
		c.parseMemory(k, value)
	case 'c':
		if string(k) == "client-id" {
			if !c.HasID {
				c.ID, c.HasID = parseUint(value)
			}
		} else if n, ok := bytes.CutPrefix(k, []byte("cycles-")); ok {
			if v, ok := parseUint(value); ok {
				if e := c.engine(n); e != nil && !e.HasCycles {
					e.Cycles, e.HasCycles = v, true
				}
			}
		}
	case 'e':
		if n, ok := bytes.CutPrefix(k, []byte("engine-capacity-")); ok {
			if v, ok := parseUint(value); ok && v > 0 {
				if e := c.engine(n); e != nil && e.Capacity == 0 {
					e.Capacity = v
				}
			}
		} else if n, ok := bytes.CutPrefix(k, []byte("engine-")); ok {
			if v, ok := parseWithUnit(value, nanoseconds); ok {
				if e := c.engine(n); e != nil && !e.HasBusyNS {
					e.BusyNS, e.HasBusyNS = v, true
				}
			}
		}
	case 't':
		if n, ok := bytes.CutPrefix(k, []byte("total-cycles-")); ok {
			if v, ok := parseUint(value); ok {
				if e := c.engine(n); e != nil && !e.HasTotalCycles {
					e.TotalCycles, e.HasTotalCycles = v, true
				}
			}
			return
		}
		c.parseMemory(k, value)
	default:
		c.parseMemory(k, value)
	}
}

// parsePDev reads drm-pdev, the first one counting.
func (c *Client) parsePDev(value []byte, last string) {
	switch {
	case c.PDev != "":
	case canonicalPCI(value):
		// As the kernel prints it (pci_name): the common case, without a reformat.
		c.PDev = last
		if string(value) != last {
			c.PDev = string(value)
		}
	default:
		if pdev, ok := gpu.ParsePCIBusID(string(value)); ok {
			c.PDev = pdev
		}
	}
}

// parseMemory reads a memory key: drm-<category>-<region>. drm-memory- is the deprecated alias of drm-resident-: a
// driver should print one of the two, and amdgpu prints both, so both fill Resident and the first seen counts.
func (c *Client) parseMemory(k, value []byte) {
	var category string
	switch k[0] {
	case 't':
		category = "total-"
	case 's':
		category = "shared-"
	case 'r':
		category = "resident-"
	case 'm':
		category = "memory-"
	case 'p':
		category = "purgeable-"
	case 'a':
		category = "active-"
	default:
		return
	}
	region, ok := bytes.CutPrefix(k, []byte(category))
	if !ok {
		return
	}
	n, ok := parseWithUnit(value, bytesUnits)
	if !ok {
		return
	}
	r := c.region(region)
	if r == nil {
		return
	}
	var v *uint64
	var has *bool
	switch k[0] {
	case 't':
		v, has = &r.Total, &r.HasTotal
	case 's':
		v, has = &r.Shared, &r.HasShared
	case 'r', 'm':
		v, has = &r.Resident, &r.HasResident
	case 'p':
		v, has = &r.Purgeable, &r.HasPurgeable
	default:
		v, has = &r.Active, &r.HasActive
	}
	if !*has {
		*v, *has = n, true
	}
}

// knownNames are the drivers', engines' and regions' names of the drivers this source reads, which name returns
// without allocating: a reading parses thousands of fdinfo files.
var knownNames = []string{"amdgpu", "i915", "xe",
	"gfx", "compute", "dma", "dec", "enc", "enc_1", "jpeg", "vpe",
	"render", "copy", "video", "video-enhance",
	"rcs", "bcs", "vcs", "vecs", "ccs", "other",
	"vram", "gtt", "cpu", "gds", "gws", "oa", "doorbell", "mmioremap",
	"system", "vram0", "vram1", "stolen", "system0", "local0", "local1", "stolen-system0", "stolen-local0"}

// name returns b as a string, a known name's own string when it is one.
func name(b []byte) string {
	for _, n := range knownNames {
		if string(b) == n {
			return n
		}
	}
	return string(b)
}

// reuse returns b as a string: last, the name that a parse before left in the same place, when it is the same.
func reuse(last string, b []byte) string {
	if last == string(b) {
		return last
	}
	return name(b)
}

// engine returns the client's engine of that name, adding it; nil for a name that is not a valid key string or
// past maxEngines.
func (c *Client) engine(n []byte) *Engine {
	if !validName(n) {
		return nil
	}
	for i := range c.Engines {
		if c.Engines[i].Name == string(n) {
			return &c.Engines[i]
		}
	}
	i := len(c.Engines)
	if i == maxEngines {
		return nil
	}
	if c.Engines == nil {
		c.Engines = make([]Engine, 0, 8)
	}
	var last string
	if i < cap(c.Engines) {
		last = c.Engines[:i+1][i].Name
	}
	c.Engines = append(c.Engines, Engine{Name: reuse(last, n)})
	return &c.Engines[i]
}

func (c *Client) region(n []byte) *Region {
	if !validName(n) {
		return nil
	}
	for i := range c.Regions {
		if c.Regions[i].Name == string(n) {
			return &c.Regions[i]
		}
	}
	i := len(c.Regions)
	if i == maxRegions {
		return nil
	}
	if c.Regions == nil {
		c.Regions = make([]Region, 0, 8)
	}
	var last string
	if i < cap(c.Regions) {
		last = c.Regions[:i+1][i].Name
	}
	c.Regions = append(c.Regions, Region{Name: reuse(last, n)})
	return &c.Regions[i]
}

// Engine returns the client's engine of that name.
func (c *Client) Engine(name string) (Engine, bool) {
	for _, e := range c.Engines {
		if e.Name == name {
			return e, true
		}
	}
	return Engine{}, false
}

// Region returns the client's region of that name.
func (c *Client) Region(name string) (Region, bool) {
	for _, r := range c.Regions {
		if r.Name == name {
			return r, true
		}
	}
	return Region{}, false
}

// validName accepts a <keystr>: not empty, no whitespace (the key has none) and no delimiter, printable ASCII.
func validName(s []byte) bool {
	if len(s) == 0 || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f || s[i] == ':' {
			return false
		}
	}
	return true
}

// validValue accepts a <valstr> the exporter may put in a label: printable ASCII, bounded.
func validValue(b []byte) bool {
	if len(b) == 0 || len(b) > maxNameLen {
		return false
	}
	for _, ch := range b {
		if ch < ' ' || ch >= 0x7f {
			return false
		}
	}
	return true
}

// unit is a unit a key's value may carry, and what it multiplies the number by; the empty unit is the default.
type unit struct {
	name   string
	factor uint64
}

var (
	// drm-engine-<keystr>: <uint> ns.
	nanoseconds = []unit{{"ns", 1}}
	// drm-<category>-<region>: <uint> [KiB|MiB], bytes by default.
	bytesUnits = []unit{{"", 1}, {"KiB", 1 << 10}, {"MiB", 1 << 20}}
)

// parseWithUnit reads "<uint>[ <unit>]" with one of the units allowed. A number that overflows 64 bits once scaled
// is not read.
func parseWithUnit(value []byte, units []unit) (uint64, bool) {
	num, rest := value, []byte(nil)
	for i, c := range value {
		if c == ' ' || c == '\t' {
			num, rest = value[:i], trimSpace(value[i:])
			break
		}
	}
	n, ok := parseUint(num)
	if !ok {
		return 0, false
	}
	for _, u := range units {
		if string(rest) == u.name {
			if n > math.MaxUint64/u.factor {
				return 0, false
			}
			return n * u.factor, true
		}
	}
	return 0, false
}

// parseUint reads an unsigned decimal integer, the whole value, as strconv.ParseUint(s, 10, 64) does.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var n uint64
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		d := uint64(ch - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// trimSpace trims ASCII white space, as bytes.TrimSpace does for ASCII, without its set's construction per call.
func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// canonicalPCI says whether b is a PCI address in gpu.ParsePCIBusID's form, dddd:bb:dd.f in lower-case hex with a
// device number up to 1f and a function up to 7, which it would return unchanged.
func canonicalPCI(b []byte) bool {
	if len(b) != 12 || b[4] != ':' || b[7] != ':' || b[10] != '.' || b[8] > '1' || b[11] < '0' || b[11] > '7' {
		return false
	}
	for _, i := range []int{0, 1, 2, 3, 5, 6, 8, 9} {
		if c := b[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// isSpace reports ASCII white space, as unicode.IsSpace does for ASCII.
func isSpace(c byte) bool { return asciiSpace[c] }

var asciiSpace = [256]bool{' ': true, '\t': true, '\r': true, '\n': true, '\v': true, '\f': true}
