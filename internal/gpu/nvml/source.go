//go:build linux && cgo

package nvml

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// ErrLibraryNotFound is returned by New when libnvidia-ml.so.1 cannot be loaded, so that --gpu.source=auto can try
// the next source.
var ErrLibraryNotFound = errors.New("NVML library libnvidia-ml.so.1 not found: install the NVIDIA driver, " +
	"or run the container with the NVIDIA runtime (NVIDIA_DRIVER_CAPABILITIES=utility) or mount the driver libraries")

// Default timings. The event wait bounds how long Close waits for the XID goroutine; the first utilization window
// keeps the first per-process reading recent instead of averaging the driver's whole sample buffer.
const (
	defaultEventWait                = 500 * time.Millisecond
	defaultUtilizationWindow        = 5 * time.Second
	defaultEventErrorBackoff        = 5 * time.Second
	sourceName                      = "nvml"
	notAvailable             uint64 = 0xFFFFFFFFFFFFFFFF // NVML_VALUE_NOT_AVAILABLE for unsigned long long fields
)

// Config configures the NVML source.
type Config struct {
	// Library is the NVML entry point: gonvml.New() in production, a mock in tests. Required.
	Library gonvml.Interface
	// Logger receives warnings about fields and devices that cannot be read; nil discards them.
	Logger *slog.Logger
	// Now returns the current time; nil means time.Now. Used for the first per-process utilization window.
	Now func() time.Time
	// EventWait is how long one wait for XID events blocks; 0 means 500ms. Close takes up to this long.
	EventWait time.Duration
	// EventErrorBackoff is the pause after a failed event wait other than a timeout; 0 means 5s.
	EventErrorBackoff time.Duration
	// UtilizationWindow is how far back the first per-process utilization read of a device looks; 0 means 5s.
	UtilizationWindow time.Duration
	// ProcessFallback, if set, lists the processes of GPUs whose lists NVML cannot read; Close closes it.
	ProcessFallback gpu.Source
}

// Source reads GPUs through NVML. Snapshot calls must not overlap (the caller serializes them); the XID goroutine
// runs alongside and shares only the XID counts, which are locked.
type Source struct {
	lib               gonvml.Interface
	syms              symbols
	fields            []deviceField // the field values the driver defines
	records           recordLister  // the source's own process lists (records.go); nil: go-nvml's
	log               *slog.Logger
	now               func() time.Time
	utilizationWindow time.Duration

	// reading holds a token while a snapshot (or Close) runs: it guards the state below, which only Snapshot
	// touches, and lets Close wait for a reading with a deadline.
	reading chan struct{}
	// lastSeen is the newest process utilization sample timestamp (µs) per device UUID.
	lastSeen map[string]uint64
	// warned remembers which device/operation failures were already logged at warning level.
	warned map[string]bool
	// identity is the last identity read of each GPU by UUID (name, PCI bus ID, MIG mode, minor number), for a
	// GPU that is kept in the snapshot only for its XID counts: its gpu_info then stays the same series. It holds
	// GPUs ever read, as many as the node has had.
	identity map[string]gpu.Device
	gpm      gpmState
	// fabricRead reads the versioned fabric information (a test replaces it: go-nvml's versioned call cannot be
	// mocked); fabricV2Only is set once the driver answered that it does not know version 3.
	fabricRead   func(h gonvml.Device, v3 bool) (fabricInfo, gonvml.Return)
	fabricV2Only bool
	// fallback lists processes NVML cannot; fallbackSaid is set once that was logged.
	fallback     gpu.Source
	fallbackSaid bool

	// driverFailures counts consecutive readings that found the driver gone; nextReinit and reinitBackoff pace
	// re-initializing NVML.
	driverFailures int
	nextReinit     time.Time
	reinitBackoff  time.Duration

	xid       *xidWatcher
	closeWait time.Duration
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var (
	_ gpu.Source           = (*Source)(nil)
	_ prometheus.Collector = (*Source)(nil)
)

// New initializes NVML and starts counting XID errors. It fails with an error wrapping ErrLibraryNotFound when
// libnvidia-ml.so.1 is missing.
func New(cfg Config) (*Source, error) {
	if cfg.Library == nil {
		return nil, errors.New("creating NVML source: no NVML library given")
	}
	s := &Source{
		lib:               cfg.Library,
		log:               cfg.Logger,
		now:               cfg.Now,
		utilizationWindow: cfg.UtilizationWindow,
		lastSeen:          map[string]uint64{},
		identity:          map[string]gpu.Device{},
		warned:            map[string]bool{},
		gpm:               gpmState{entities: map[gpmKey]*gpmEntity{}, supported: map[string]bool{}},
		fabricRead:        readFabricInfo,
		fallback:          cfg.ProcessFallback,
		closeWait:         defaultCloseWait,
		reading:           make(chan struct{}, 1),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.utilizationWindow <= 0 {
		s.utilizationWindow = defaultUtilizationWindow
	}
	if err := initLibrary(cfg.Library); err != nil {
		return nil, err
	}
	s.configure()
	wait, backoff := cfg.EventWait, cfg.EventErrorBackoff
	if wait <= 0 {
		wait = defaultEventWait
	}
	if backoff <= 0 {
		backoff = defaultEventErrorBackoff
	}
	s.xid = newXIDWatcher(cfg.Library, s.log, wait, backoff)
	s.xid.start()
	return s, nil
}

// configure learns what the loaded driver has: its optional functions, the field values its branch defines, and
// whether its process lists need the source's own calls.
func (s *Source) configure() {
	syms, err := lookupSymbols(s.lib)
	if err != nil {
		s.log.Warn("cannot tell which NVML functions the driver has; assuming a current driver", "err", err)
	}
	s.syms = syms
	branch := 0
	if v, ret := s.lib.SystemGetDriverVersion(); ret == gonvml.SUCCESS {
		branch = driverBranch(v)
	}
	s.fields = fieldsOf(branch)
	s.fabricV2Only = false
	s.records = nil
	records, err := newOwnLists(syms.processRecordsTooLong)
	switch {
	case err == nil:
		s.records = records
		if syms.processRecordsTooLong {
			s.log.Info("this NVIDIA driver writes 32-byte process records where go-nvml expects 24; reading them as they are")
		}
	case syms.processRecordsTooLong:
		s.log.Warn("GPU processes will not be listed", "err", errProcessRecordsTooLong, "lookup", err)
	default:
		// go-nvml's lists: they read the same records, but retry INSUFFICIENT_SIZE without bound.
		s.log.Debug("listing GPU processes through go-nvml", "lookup", err)
	}
}

// driverBranch is the major version of a driver version such as "580.95.05"; 0 when it cannot be read.
func driverBranch(version string) int {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// initLibrary loads and initializes NVML. go-nvml reports a failed dlopen as ERROR_LIBRARY_NOT_FOUND; a library
// built without the dlopen wrapper could panic instead, which is treated the same way.
func initLibrary(lib gonvml.Interface) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w (%v)", ErrLibraryNotFound, r)
		}
	}()
	switch ret := lib.Init(); ret {
	case gonvml.SUCCESS:
		return nil
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return ErrLibraryNotFound
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("initializing NVML: the NVIDIA kernel driver is not loaded (is this a GPU node? %s): %w", gpu.FixDriverNotLoaded, ret)
	case gonvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("initializing NVML: no permission to open /dev/nvidia* (run privileged or with the NVIDIA runtime): %w", ret)
	case gonvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return fmt.Errorf("initializing NVML: libnvidia-ml.so.1 does not match the loaded kernel driver (%s): %w", gpu.FixVersionMismatch, ret)
	default:
		return fmt.Errorf("initializing NVML: %w", ret)
	}
}

// Name implements gpu.Source.
func (s *Source) Name() string { return sourceName }

// Close waits for a reading still in progress (a scrape that timed out lets it finish in the background), stops
// the XID goroutine, frees its event set and shuts NVML down: shutting down under a reading would unload the code it
// runs. A reading still inside the driver after closeWait leaves NVML loaded; the process is ending anyway. Close is
// safe to call more than once, and later snapshots fail.
func (s *Source) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		timer := time.NewTimer(s.closeWait)
		defer timer.Stop()
		select {
		case s.reading <- struct{}{}:
		case <-timer.C:
			s.closeErr = fmt.Errorf("shutting down NVML: a GPU reading is still running after %v; NVML left loaded", s.closeWait)
			return
		}
		defer func() { <-s.reading }()
		s.xid.stop()
		s.gpm.freeAll()
		if ret := s.lib.Shutdown(); ret != gonvml.SUCCESS {
			s.closeErr = fmt.Errorf("shutting down NVML: %w", ret)
		}
		if s.fallback != nil {
			if err := s.fallback.Close(); err != nil {
				s.closeErr = errors.Join(s.closeErr, err)
			}
		}
	})
	return s.closeErr
}

// errClosed is the error of a snapshot taken after Close.
var errClosed = errors.New("reading GPUs: the NVML source is closed")

// deviceCount counts the GPUs. When NVML answers that the driver is not loaded or NVML is not initialized, and has
// done so for reinitAfter consecutive readings (the driver was unloaded and reloaded, for a reset or a fabric manager
// restart), NVML is shut down and initialized again, at most once per backoff, which doubles up to maxReinitBackoff.
func (s *Source) deviceCount() (int, error) {
	count, ret := s.lib.DeviceGetCount()
	if ret == gonvml.SUCCESS {
		s.driverFailures, s.reinitBackoff = 0, 0
		return count, nil
	}
	err := fmt.Errorf("counting GPUs: %w", ret)
	if ret != gonvml.ERROR_DRIVER_NOT_LOADED && ret != gonvml.ERROR_UNINITIALIZED {
		return 0, err
	}
	s.driverFailures++
	now := s.now()
	if s.driverFailures < reinitAfter || now.Before(s.nextReinit) {
		return 0, err
	}
	s.reinitBackoff = min(max(2*s.reinitBackoff, minReinitBackoff), maxReinitBackoff)
	s.nextReinit = now.Add(s.reinitBackoff)
	s.xid.stop()
	s.gpm.freeAll()
	s.lib.Shutdown() // NVML may already consider itself shut down; the result does not matter
	if initErr := initLibrary(s.lib); initErr != nil {
		s.log.Warn("re-initializing NVML failed; trying again later", "err", initErr, "retry_in", s.reinitBackoff)
		return 0, fmt.Errorf("%w; re-initializing NVML: %w", err, initErr)
	}
	s.configure()
	clear(s.lastSeen)
	s.xid.start()
	s.log.Info("NVML re-initialized after the driver was unavailable")
	count, ret = s.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return 0, fmt.Errorf("counting GPUs after re-initializing NVML: %w", ret)
	}
	s.driverFailures, s.reinitBackoff = 0, 0
	return count, nil
}

// Re-initialization after the driver went away: after this many consecutive failed readings, then with a backoff.
const (
	reinitAfter      = 3
	minReinitBackoff = 10 * time.Second
	maxReinitBackoff = 5 * time.Minute
	defaultCloseWait = 10 * time.Second
)

var xidWatcherUpDesc = prometheus.NewDesc("gpu_pod_exporter_xid_watcher_up",
	"1 while XID errors are being counted (the NVML event set is registered and waited on), 0 while it is being "+
		"registered again after a failure or no GPU supports XID events.", nil, nil)

// Describe implements prometheus.Collector: the source's own self-metrics.
func (s *Source) Describe(ch chan<- *prometheus.Desc) { ch <- xidWatcherUpDesc }

// Collect implements prometheus.Collector.
func (s *Source) Collect(ch chan<- prometheus.Metric) {
	up := 0.0
	if s.xid.isUp() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(xidWatcherUpDesc, prometheus.GaugeValue, up)
}

// Snapshot implements gpu.Source. NVML calls cannot be interrupted, so ctx is checked between devices.
func (s *Source) Snapshot(ctx context.Context) (*gpu.Snapshot, error) {
	s.reading <- struct{}{}
	defer func() { <-s.reading }()

	if s.closed.Load() {
		return nil, errClosed
	}
	snap := &gpu.Snapshot{Time: s.now()}
	count, err := s.deviceCount()
	if err != nil {
		return nil, err
	}
	if v, ret := s.lib.SystemGetDriverVersion(); ret == gonvml.SUCCESS {
		snap.DriverVersion = v
	} else {
		snap.Errors = append(snap.Errors, s.fail(-1, "", gpu.OpDriverVersion, ret))
	}
	if v, ret := s.lib.SystemGetCudaDriverVersion(); ret == gonvml.SUCCESS {
		snap.CUDAVersion = formatCUDAVersion(v)
	} else if !unsupported(ret) {
		snap.Errors = append(snap.Errors, s.fail(-1, "", gpu.OpCUDAVersion, ret))
	}

	names := map[uint32]string{}
	seen := map[string]bool{}
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading GPU %d of %d: %w", i, count, err)
		}
		dev, errs := s.readDeviceRecovering(i, names)
		snap.Errors = append(snap.Errors, errs...)
		if dev == nil {
			continue
		}
		seen[dev.UUID] = true
		dev.XIDErrors = s.xid.countsOf(dev.UUID)
		snap.Devices = append(snap.Devices, *dev)
		s.identity[dev.UUID] = gpu.Device{Name: dev.Name, PCIBusID: dev.PCIBusID, MIGMode: dev.MIGMode, MinorNumber: dev.MinorNumber}
	}
	s.processesFromFallback(ctx, snap)
	// A GPU that fell off the bus (XID 79) cannot be read, but the XID that says so must still be exported, under
	// the identity it last had.
	for _, d := range s.xid.unreadGPUs(seen) {
		if id, ok := s.identity[d.UUID]; ok {
			d.Name, d.PCIBusID, d.MIGMode, d.MinorNumber = id.Name, id.PCIBusID, id.MIGMode, id.MinorNumber
		}
		snap.Devices = append(snap.Devices, d)
	}
	// Forget utilization timestamps and GPM samples of GPUs that are gone so the state stays as small as the node.
	for uuid := range s.lastSeen {
		if !seen[uuid] {
			delete(s.lastSeen, uuid)
		}
	}
	s.gpm.forgetUnseen(seen)
	return snap, nil
}

// processesFromFallback lists, with the fallback source, the processes of the GPUs whose lists NVML could not read,
// once per snapshot, and drops the NVML process errors of the GPUs it listed.
func (s *Source) processesFromFallback(ctx context.Context, snap *gpu.Snapshot) {
	if s.fallback == nil {
		return
	}
	var unlisted []int
	for i := range snap.Devices {
		if !snap.Devices[i].ProcessesListed {
			unlisted = append(unlisted, i)
		}
	}
	if len(unlisted) == 0 {
		return
	}
	other, err := s.fallback.Snapshot(ctx)
	if err != nil {
		snap.Errors = append(snap.Errors, s.fail(-1, "", gpu.OpProcesses,
			fmt.Errorf("listing the processes NVML could not with %s: %w", s.fallback.Name(), err)))
		return
	}
	listed := map[string]*gpu.Device{}
	for i := range other.Devices {
		if other.Devices[i].ProcessesListed {
			listed[other.Devices[i].UUID] = &other.Devices[i]
		}
	}
	var filled []int
	for _, i := range unlisted {
		d := &snap.Devices[i]
		o, ok := listed[d.UUID]
		if !ok {
			continue
		}
		d.Processes, d.ProcessesListed = o.Processes, true
		filled = append(filled, d.Index)
		snap.Errors = slices.DeleteFunc(snap.Errors, func(e gpu.DeviceError) bool {
			return e.Index == d.Index && e.Operation == gpu.OpProcesses
		})
	}
	if len(filled) > 0 && !s.fallbackSaid {
		s.fallbackSaid = true
		s.log.Info("NVML cannot list the processes of some GPUs; listing them with "+s.fallback.Name(), "gpus", filled)
	}
}

// readDeviceRecovering reads GPU i and turns a panic inside go-nvml (its wrappers slice their buffers by counts the
// driver returns) into a device error, so that one GPU cannot end the exporter or the reading of the others.
func (s *Source) readDeviceRecovering(i int, names map[uint32]string) (dev *gpu.Device, errs []gpu.DeviceError) {
	defer func() {
		if r := recover(); r != nil {
			dev, errs = nil, []gpu.DeviceError{s.fail(i, s.xid.uuidOf(i), gpu.OpDevice, fmt.Errorf("reading GPU %d: go-nvml panicked: %v", i, r))}
		}
	}()
	return s.readDevice(i, names)
}

// fail turns a failed NVML call into a DeviceError, logging it at warning level only the first time that device and
// operation fail so that a permanently broken field does not fill the log on every scrape.
func (s *Source) fail(index int, uuid string, op gpu.Operation, err error) gpu.DeviceError {
	key := fmt.Sprintf("%d/%s/%s", index, uuid, op)
	level := slog.LevelDebug
	if !s.warned[key] {
		s.warned[key] = true
		level = slog.LevelWarn
	}
	s.log.Log(context.Background(), level, "NVML read failed", "gpu", index, "uuid", uuid, "operation", op, "err", err)
	return gpu.DeviceError{Index: index, UUID: uuid, Operation: op, Err: err}
}

// unsupported reports whether a return code means the driver simply has no such value for this device: the field
// is then left out without being an error.
func unsupported(ret gonvml.Return) bool {
	switch ret {
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND, gonvml.ERROR_NO_DATA:
		return true
	}
	return false
}

// formatCUDAVersion turns NVML's 12040 into "12.4".
func formatCUDAVersion(v int) string {
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
}
