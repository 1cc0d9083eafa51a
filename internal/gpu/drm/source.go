package drm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
)

// Config configures a Source. Zero values take the defaults.
type Config struct {
	SysFS  string // default /sys
	ProcFS string // default /proc
	// FirstIndex is the gpu index of the first device (in PCI order): on a node that also has NVIDIA GPUs, it
	// follows theirs.
	FirstIndex int
	// Bounds on the open files looked at per process and per reading; DefaultMaxFDsPerProcess and
	// DefaultMaxFDsPerReading by default.
	MaxFDsPerProcess, MaxFDsPerReading int
	// KeptFiles is the budget of files kept open between readings, shared with attribution's, so that the two
	// together leave descriptors for connections: the DRM files' fdinfo and the sysfs attributes (KFD's included)
	// take their places in it, and past it they are read by path. nil: a budget of this source's own.
	KeptFiles *procfs.KeptFiles
	// Logger says once what keeps the readings incomplete and how to mend it (no permission to read other
	// processes' files, a bound reached); each reading counts it in its errors. nil: not logged.
	Logger *slog.Logger
	Now    func() time.Time
}

// Source reads the node's amdgpu, i915 and xe GPUs (gpu.Source). Like every source it is called one Snapshot at
// a time.
type Source struct {
	cfg      Config
	bounds   bounds
	files    files
	scan     *scanner
	known    map[string]*device
	cards    []string  // /sys/class/drm's entries at the last reading
	cardsCut error     // they were more than a reading reads: a truncation
	devs     []*device // the GPUs they were
	topo     *kfdTopology
	kfd      *kfdReader
	// Counters of the previous reading, for the rates between two: each client's engine counters and each
	// device's energy, by PCI address.
	rates  rates
	energy map[string]energy
	// Reused from one reading to the next: the uses of the process being assembled, and the processes each
	// device had.
	uses   []usage
	counts map[string]int
	logged map[string]bool // the problems logged, by kind
}

// ErrNoDevice is New's error on a node without an amdgpu, i915 or xe GPU.
var ErrNoDevice = errors.New("no GPU of the amdgpu, i915 or xe driver in /sys/class/drm")

// New opens the source, which needs at least one GPU of its drivers.
func New(cfg Config) (*Source, error) {
	cfg.SysFS = cmp.Or(cfg.SysFS, "/sys")
	cfg.ProcFS = cmp.Or(cfg.ProcFS, "/proc")
	cfg.MaxFDsPerProcess = cmp.Or(cfg.MaxFDsPerProcess, DefaultMaxFDsPerProcess)
	cfg.MaxFDsPerReading = cmp.Or(cfg.MaxFDsPerReading, DefaultMaxFDsPerReading)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.KeptFiles == nil {
		cfg.KeptFiles = procfs.NewKeptFiles(maxKept)
	}
	s := &Source{cfg: cfg, bounds: defaultBounds, files: files{budget: cfg.KeptFiles},
		scan: newScanner(cfg.ProcFS, cfg.KeptFiles), known: make(map[string]*device),
		rates: rates{clients: make(map[rateKey]*clientCounters)}, energy: make(map[string]energy),
		kfd: newKFDReader(cfg.SysFS, cfg.KeptFiles), counts: make(map[string]int)}
	devs, err := discover(&s.files, cfg.SysFS, cfg.ProcFS, s.known)
	if err != nil {
		return nil, err
	}
	if len(devs) == 0 {
		return nil, fmt.Errorf("%w (under %s)", ErrNoDevice, cfg.SysFS)
	}
	return s, nil
}

// Present reports which drivers of this source drive GPUs in sysfs, for --gpu.source=auto: those that a card's
// PCI device is bound to, as New finds them. It reads links only, no attribute.
func Present(sysfs string) []string {
	class := filepath.Join(sysfs, "class", "drm")
	names, _, _ := dirNames(class, maxCards)
	var drivers []string
	for _, n := range names {
		if _, ok := numbered(n, "card"); !ok {
			continue
		}
		cardDir := filepath.Join(class, n)
		if _, ok := pciOf(filepath.Join(cardDir, "device")); !ok {
			continue
		}
		if d := driverOf(cardDir); Drivers[d] != "" && !slices.Contains(drivers, d) {
			drivers = append(drivers, d)
		}
	}
	slices.Sort(drivers)
	return drivers
}

// Name implements gpu.Source.
func (s *Source) Name() string { return "drm" }

// Close implements gpu.Source: it closes the files kept open from one reading to the next.
func (s *Source) Close() error {
	s.scan.closeAll()
	s.kfd.closeAll()
	s.files.closeAll()
	return nil
}

// Snapshot implements gpu.Source.
func (s *Source) Snapshot(ctx context.Context) (*gpu.Snapshot, error) {
	now := s.cfg.Now()
	s.files.reading(now)
	devs, err := s.devices()
	if err != nil {
		return nil, err
	}
	snap := &gpu.Snapshot{Time: now, Devices: make([]gpu.Device, len(devs))}
	if s.cardsCut != nil {
		snap.Errors = append(snap.Errors, gpu.DeviceError{Index: -1, Operation: gpu.OpDevice, Err: s.cardsCut})
	}
	energies := make(map[string]energy, len(devs))
	amd := false
	for i, d := range devs {
		out := &snap.Devices[i]
		*out = gpu.Device{Index: s.cfg.FirstIndex + i, UUID: d.uuid, Name: d.name, PCIBusID: d.pci, Vendor: d.vendor,
			DriverVersion: d.version, DRMCard: d.card}
		errs, e := readDevice(&s.files, d, out, s.energy[d.pci], now)
		snap.Errors = append(snap.Errors, errs...)
		energies[d.pci] = e
		amd = amd || d.driver == "amdgpu"
	}
	s.energy = energies
	if len(devs) > 0 {
		snap.DriverVersion = devs[0].version
	}

	var kfd []kfdUse
	kfdListed := true
	if amd {
		kfd, err = s.readKFD(devs, now)
		if err != nil {
			kfdListed = false
			snap.Errors = append(snap.Errors, gpu.DeviceError{Index: -1, Operation: gpu.OpProcesses, Err: err})
		}
	}
	sc := s.scan.scan(ctx, devs, s.cfg.MaxFDsPerProcess, s.cfg.MaxFDsPerReading, now)
	snap.Errors = append(snap.Errors, sc.errors(s.cfg)...)
	if sc.denied > 0 {
		s.logOnce("denied", "the open files of some processes cannot be read, so their AMD and Intel GPU use is "+
			"unknown and no GPU's process list is complete: give the exporter CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH "+
			"(the Helm chart's drm.enabled) and, where AppArmor confines its container, a profile that allows ptrace "+
			"read of other processes (docs/reference.md, \"AMD and Intel GPUs\", Permissions)",
			"processes", sc.denied, "first", sc.deniedErr)
	}
	listed := sc.err == nil && sc.denied == 0 && sc.failed == 0 && !sc.truncated
	for i, d := range devs {
		snap.Devices[i].ProcessesListed = listed && (d.driver != "amdgpu" || kfdListed)
	}
	s.assemble(snap, devs, kfd, sc.clients, now)
	for _, e := range snap.Errors {
		if t := (*truncation)(nil); errors.As(e.Err, &t) {
			s.logOnce(t.dir, "a directory lists more entries than the exporter reads: "+t.lost, "error", t)
		}
	}
	return snap, nil
}

// devices lists the GPUs: again only when /sys/class/drm lists other entries than at the last reading (a GPU
// bound or unbound, a driver reloaded), the device links being what they were while the entries are.
func (s *Source) devices() ([]*device, error) {
	class := filepath.Join(s.cfg.SysFS, "class", "drm")
	names, cut, err := dirNames(class, s.bounds.cards)
	if err != nil {
		return nil, fmt.Errorf("listing DRM devices: %w", err)
	}
	s.cardsCut = nil
	if cut {
		s.cardsCut = &truncation{dir: class, max: s.bounds.cards, lost: "the GPUs of the cards past them are not read"}
	}
	if s.cards != nil && slices.Equal(names, s.cards) {
		return s.devs, nil
	}
	devs := discoverCards(&s.files, s.cfg.SysFS, s.cfg.ProcFS, names, s.known)
	clear(s.known)
	for _, d := range devs {
		s.known[d.card] = d
	}
	s.cards, s.devs = names, devs
	return devs, nil
}

// readKFD reads the compute processes' VRAM; nil, nil where the kernel has no KFD. Past a bound on KFD's
// directories it returns the processes read and a truncation.
func (s *Source) readKFD(devs []*device, now time.Time) ([]kfdUse, error) {
	renders := make(map[int]string, len(devs))
	for _, d := range devs {
		if d.render >= 0 {
			renders[d.render] = d.pci
		}
	}
	t, err := readKFDTopology(&s.files, s.cfg.SysFS, renders, s.topo, s.bounds.kfdNodes)
	if err != nil || t == nil {
		return nil, err
	}
	s.topo = t
	uses, err := s.kfd.read(&s.files, t, now, s.bounds.kfdProcesses)
	return uses, cmp.Or(err, t.cut)
}

// errors says what kept the scan of open files from being complete.
func (sc scan) errors(cfg Config) []gpu.DeviceError {
	var errs []error
	if sc.err != nil {
		errs = append(errs, sc.err)
	}
	if sc.denied > 0 {
		errs = append(errs, fmt.Errorf("the open files of %d processes could not be read (%w): reading other "+
			"processes' DRM clients needs CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (drm.enabled) and, under AppArmor, "+
			"a profile that allows it", sc.denied, sc.deniedErr))
	}
	if sc.failed > 0 {
		errs = append(errs, fmt.Errorf("the open files of %d processes could not be looked at: %w", sc.failed, sc.failedErr))
	}
	if sc.truncated {
		errs = append(errs, fmt.Errorf("stopped looking at processes' open files after %d of them (or at the "+
			"reading's deadline): %d processes were not looked at", cfg.MaxFDsPerReading, sc.cut))
	} else if sc.cut > 0 {
		errs = append(errs, fmt.Errorf("%d processes have more than %d open files, of which only the first were "+
			"looked at", sc.cut, cfg.MaxFDsPerProcess))
	}
	out := make([]gpu.DeviceError, len(errs))
	for i, err := range errs {
		out[i] = gpu.DeviceError{Index: -1, Operation: gpu.OpProcesses, Err: err}
	}
	return out
}

// logOnce logs a problem of a kind at its first reading, at warning level: each reading counts it in its errors,
// and the line says what to do about it.
func (s *Source) logOnce(kind, msg string, args ...any) {
	if s.cfg.Logger == nil || s.logged[kind] {
		return
	}
	if s.logged == nil {
		s.logged = make(map[string]bool)
	}
	s.logged[kind] = true
	s.cfg.Logger.Warn(msg, args...)
}

// deviceMemory reports whether a memory region of a driver's fdinfo is the device's own memory: amdgpu's vram,
// xe's vram0, vram1 (one per tile), i915's local0, local1. The others (gtt, system, stolen, cpu) are host memory.
func deviceMemory(region string) bool {
	if n, ok := strings.CutPrefix(region, "vram"); ok {
		return strings.TrimLeft(n, "0123456789") == ""
	}
	n, ok := strings.CutPrefix(region, "local")
	return ok && n != "" && strings.TrimLeft(n, "0123456789") == ""
}

// usage is one process's use of one device, summed over its clients.
type usage struct {
	pid     uint32
	dev     int
	kfd     bool
	kfdVRAM float64
	drmVRAM float64
	hasDRM  bool // a DRM client with device memory
	// The busy fraction of each kind of engine between the last two readings, the engines of one kind summed over
	// the process's clients; rated: at least one client was seen at the previous reading.
	busy                 [numKinds]float64
	hasBusy              [numKinds]bool
	rated                bool
	usedGraphics, usedCC bool // the client ever used a graphics, or a compute, engine
}

// assemble builds each device's process list from KFD's compute processes and the DRM clients, both in the order
// of their PIDs, and keeps the clients' counters for the next reading's rates. It goes through the processes in
// that order, so that each device's list comes in it too.
func (s *Source) assemble(snap *gpu.Snapshot, devs []*device, kfd []kfdUse, clients []client, now time.Time) {
	for i, d := range devs {
		if n := s.counts[d.pci]; n > 0 {
			snap.Devices[i].Processes = make([]gpu.Process, 0, n) // as many as at the last reading, likely
		}
	}
	s.rates.reading++
	for len(kfd) > 0 || len(clients) > 0 {
		pid := uint32(math.MaxUint32)
		if len(kfd) > 0 {
			pid = kfd[0].pid
		}
		if len(clients) > 0 {
			pid = min(pid, clients[0].pid)
		}
		s.uses = s.uses[:0]
		for ; len(kfd) > 0 && kfd[0].pid == pid; kfd = kfd[1:] {
			if dev := deviceOf(devs, kfd[0].pci); dev >= 0 && kfd[0].bytes > 0 {
				u := s.use(pid, dev)
				u.kfd, u.kfdVRAM = true, kfd[0].bytes
			}
		}
		for ; len(clients) > 0 && clients[0].pid == pid; clients = clients[1:] {
			s.addClient(&clients[0], devs[clients[0].dev], now)
		}
		slices.SortFunc(s.uses, func(a, b usage) int { return cmp.Compare(a.dev, b.dev) })
		for i := range s.uses {
			u := &s.uses[i]
			d := &snap.Devices[u.dev]
			d.Processes = append(d.Processes, u.process(devs[u.dev].driver))
		}
	}
	s.rates.sweep()
	clear(s.counts)
	for i, d := range devs {
		s.counts[d.pci] = len(snap.Devices[i].Processes)
	}
}

// deviceOf returns the index of the device at a PCI address; -1 for none. A node has a few devices.
func deviceOf(devs []*device, pci string) int {
	for i, d := range devs {
		if d.pci == pci {
			return i
		}
	}
	return -1
}

// use returns the process's use of a device, among the uses of the process being assembled, adding it.
func (s *Source) use(pid uint32, dev int) *usage {
	for i := range s.uses {
		if s.uses[i].dev == dev {
			return &s.uses[i]
		}
	}
	s.uses = append(s.uses, usage{pid: pid, dev: dev})
	return &s.uses[len(s.uses)-1]
}

// addClient adds one DRM client to its process's use of its device: its device memory, and its engines' use since
// the previous reading that saw it.
func (s *Source) addClient(c *client, d *device, now time.Time) {
	u := s.use(c.pid, c.dev)
	for _, r := range c.Regions {
		if r.HasResident && deviceMemory(r.Name) {
			u.drmVRAM += float64(r.Resident)
			u.hasDRM = true
		}
	}
	for _, e := range c.Engines {
		kind := engineKinds[e.Name]
		if e.BusyNS > 0 || e.Cycles > 0 {
			u.usedGraphics = u.usedGraphics || kind == graphicsEngine
			u.usedCC = u.usedCC || kind == computeEngine
		}
	}
	prev, rated := s.rates.clients[c.rateKey(d.pci)]
	if rated {
		u.rated = true
		for _, e := range c.Engines {
			kind := engineKinds[e.Name]
			pe, found := prev.engine(e.Name)
			if !found && d.driver == "amdgpu" {
				// amdgpu prints an engine once the client used it: not printed before, it had been idle.
				pe, found = Engine{Name: e.Name, HasBusyNS: true}, true
			}
			if f, ok := fraction(pe, found, e, now.Sub(prev.at)); ok && kind != otherEngine {
				u.busy[kind] += f
				u.hasBusy[kind] = true
			}
		}
	}
	s.rates.keep(c, d.pci, prev, now)
}

// process turns a process's use of a device into the snapshot's terms.
func (u *usage) process(driver string) gpu.Process {
	p := gpu.Process{PID: u.pid, Type: gpu.ProcessGraphics}
	switch {
	case u.kfd && u.usedGraphics:
		p.Type = gpu.ProcessComputeAndGraphics
	case u.kfd, u.usedCC && !u.usedGraphics:
		p.Type = gpu.ProcessCompute
	}
	// KFD counts the VRAM a compute process allocated through it; on recent kernels the process's DRM file, whose
	// address space KFD uses, counts the same buffers and any others: the larger is the process's.
	if u.kfd || u.hasDRM {
		p.UsedMemoryBytes = gpu.Known(max(u.kfdVRAM, u.drmVRAM))
	}
	if !u.rated {
		return p
	}
	// amdgpu prints an engine only once the client used it (amdgpu_fdinfo.c): an engine not printed was idle.
	idleUnlisted := driver == "amdgpu"
	ratio := func(kinds ...engineKind) gpu.Value {
		var v gpu.Value
		for _, k := range kinds {
			if u.hasBusy[k] {
				v = gpu.Known(max(v.V, min(u.busy[k], 1)))
			}
		}
		if !v.Valid && idleUnlisted {
			v = gpu.Known(0)
		}
		return v
	}
	// The compute work of a KFD (ROCm) process does not pass through its DRM file, whose engine times therefore
	// say nothing of it: its SM utilization is unknown rather than the DRM file's.
	if !u.kfd {
		p.SMUtilizationRatio = ratio(graphicsEngine, computeEngine)
	}
	p.EncoderUtilizationRatio = ratio(encodeEngine, videoEngine)
	p.DecoderUtilizationRatio = ratio(decodeEngine, videoEngine)
	return p
}

var _ gpu.Source = (*Source)(nil)
