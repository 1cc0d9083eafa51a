//go:build linux && cgo

package nvml

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// maxSizeRetries bounds the calls made when NVML answers INSUFFICIENT_SIZE because processes appeared between
// asking for the count and reading the list: a driver that keeps answering it is given up on for the reading.
const maxSizeRetries = 3

// procKey identifies one process on one GPU or MIG instance.
type procKey struct {
	pid    uint32
	mig    bool
	gi, ci int
}

// procEntry merges what the compute, graphics and MPS lists say about one process.
type procEntry struct {
	compute, graphics, mps bool
	memory                 gpu.Value
}

// processType names the merged kind. An MPS client also shows up in the compute list on recent drivers; it is
// reported as "mps", as itself, not as the MPS server.
func (e *procEntry) processType() string {
	switch {
	case e.mps:
		return gpu.ProcessMPS
	case e.compute && e.graphics:
		return gpu.ProcessComputeAndGraphics
	case e.graphics:
		return gpu.ProcessGraphics
	default:
		return gpu.ProcessCompute
	}
}

// retrySize repeats call while NVML answers INSUFFICIENT_SIZE, a bounded number of times. go-nvml already grows its
// buffer for the process lists, but GetProcessUtilization asks for the count and then reads, and processes that
// start in between make the second call fail that way.
func retrySize[T any](call func() (T, gonvml.Return)) (T, gonvml.Return) {
	var v T
	var ret gonvml.Return
	for range maxSizeRetries {
		if v, ret = call(); ret != gonvml.ERROR_INSUFFICIENT_SIZE {
			break
		}
	}
	return v, ret
}

// readProcesses lists the processes of a GPU: from its MIG device handles in MIG mode (NVML gives per-instance
// lists there), else from the GPU itself. It returns listed=false, with no processes, when any list could not be
// read, because a partial list would undercount.
func (r *deviceReader) readProcesses(h gonvml.Device, migEnabled bool, migs []migDevice, migComplete bool, names map[uint32]string) ([]gpu.Process, bool) {
	if r.lost != nil {
		return nil, false
	}
	if r.s.syms.processRecordsTooLong && r.s.records == nil {
		r.errs = append(r.errs, r.s.fail(r.index, r.uuid, gpu.OpProcesses, errProcessRecordsTooLong))
		return nil, false
	}
	set := map[procKey]*procEntry{}
	gpuRef := deviceRef{gpu: r.index, migSlot: -1}
	if migEnabled {
		if !migComplete || !r.listMIGProcesses(h, gpuRef, migs, set) {
			return nil, false
		}
	} else if r.listProcesses(h, gpuRef, listOnGPU, nil, set) != listed {
		return nil, false
	}

	// NVML does not give per-process utilization on MIG-enabled GPUs.
	var util map[uint32]*gonvml.ProcessUtilizationSample
	utilKnown := false
	if !migEnabled && len(set) > 0 {
		util, utilKnown = r.readProcessUtilization(h, set)
	}

	procs := make([]gpu.Process, 0, len(set))
	for k, e := range set {
		p := gpu.Process{
			PID:             k.pid,
			Name:            r.s.processName(k.pid, names),
			Type:            e.processType(),
			UsedMemoryBytes: e.memory,
			MIG:             k.mig,
			GPUInstance:     k.gi,
			ComputeInstance: k.ci,
		}
		if s, sampled := util[k.pid]; utilKnown && (s != nil || !sampled) {
			// NVML returns a sample only for processes with non-zero utilization, so a listed process without
			// one was idle since the last read: 0 is a real reading here, not a missing one. A process whose
			// samples were all garbage (nil) has no value.
			if s == nil {
				s = &gonvml.ProcessUtilizationSample{}
			}
			p.SMUtilizationRatio = gpu.Known(float64(s.SmUtil) / 100)
			p.MemoryUtilizationRatio = gpu.Known(float64(s.MemUtil) / 100)
			p.EncoderUtilizationRatio = gpu.Known(float64(s.EncUtil) / 100)
			p.DecoderUtilizationRatio = gpu.Known(float64(s.DecUtil) / 100)
		}
		procs = append(procs, p)
	}
	slices.SortFunc(procs, func(a, b gpu.Process) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.GPUInstance, b.GPUInstance),
			cmp.Compare(a.ComputeInstance, b.ComputeInstance))
	})
	return procs, true
}

// listResult says how listing the processes of one handle went.
type listResult int

const (
	listed listResult = iota
	listUnsupported
	listFailed
)

// listScope says where a list comes from, which decides the instance IDs of its processes.
type listScope int

const (
	listOnGPU          listScope = iota // a GPU not in MIG mode: never MIG processes
	listOnMIGDevice                     // a MIG device handle: every process runs on that instance
	listOnGPUInMIGMode                  // the parent of MIG devices: NVML's aggregate list with instance IDs
)

// listMIGProcesses lists the processes of every MIG device. Where per-instance lists are not supported (NVML names
// vGPU host mode), it falls back to the parent GPU's aggregate list, whose entries carry their instance IDs.
func (r *deviceReader) listMIGProcesses(h gonvml.Device, gpuRef deviceRef, migs []migDevice, set map[procKey]*procEntry) bool {
	for i := range migs {
		switch r.listProcesses(migs[i].handle, deviceRef{gpu: r.index, migSlot: migs[i].slot}, listOnMIGDevice, &migs[i], set) {
		case listed:
			continue
		case listUnsupported:
			clear(set)
			return r.listProcesses(h, gpuRef, listOnGPUInMIGMode, nil, set) == listed
		default:
			return false
		}
	}
	return true
}

// listProcesses adds the compute, graphics and MPS processes of one GPU or MIG device handle to set. The compute
// list must be readable; graphics and MPS lists that the device or driver does not support are taken as empty.
// NVML sets instance IDs to 0xFFFFFFFF for processes not on a MIG instance, and go-nvml does so for every entry of
// the v1 structs of old drivers; such IDs never make a process a MIG process. Where the source's own calls could be
// looked up in the driver's library (records.go), they read the lists of ref: go-nvml's retry INSUFFICIENT_SIZE
// without bound and cannot read the 32-byte records of some 535 drivers. go-nvml's lists of h are read otherwise,
// as with its mocks.
func (r *deviceReader) listProcesses(h gonvml.Device, ref deviceRef, scope listScope, mig *migDevice, set map[procKey]*procEntry) listResult {
	lists := []struct {
		call     func() ([]gonvml.ProcessInfo, gonvml.Return)
		required bool
		mark     func(*procEntry)
	}{
		{h.GetComputeRunningProcesses, true, func(e *procEntry) { e.compute = true }},
		{h.GetGraphicsRunningProcesses, false, func(e *procEntry) { e.graphics = true }},
		{h.GetMPSComputeRunningProcesses, false, func(e *procEntry) { e.mps = true }},
	}
	if !r.s.syms.mpsProcesses {
		lists = lists[:2]
	}
	for i, l := range lists {
		var infos []gonvml.ProcessInfo
		var ret gonvml.Return
		var err error
		if r.s.records != nil {
			infos, ret, err = r.s.records.list(processList(i), ref) // retries INSUFFICIENT_SIZE itself
		} else {
			infos, ret = retrySize(l.call)
		}
		switch {
		case err != nil:
			if r.lost == nil {
				r.errs = append(r.errs, r.s.fail(r.index, r.uuid, gpu.OpProcesses, fmt.Errorf(
					"listing the processes of GPU %d: %w; read again at the next reading", r.index, err)))
			}
			return listFailed
		case ret == gonvml.SUCCESS:
		case unsupported(ret) && l.required:
			return listUnsupported
		case unsupported(ret):
			continue
		case ret == gonvml.ERROR_INSUFFICIENT_SIZE && r.lost == nil:
			r.errs = append(r.errs, r.s.fail(r.index, r.uuid, gpu.OpProcesses, fmt.Errorf("listing the processes of GPU %d: "+
				"NVML kept answering INSUFFICIENT_SIZE however much room it was given, %d times in a row (the exporter "+
				"stops there, where go-nvml would go on without end); read again at the next reading: %w",
				r.index, maxSizeRetries, ret)))
			return listFailed
		default:
			r.ok(gpu.OpProcesses, ret)
			return listFailed
		}
		for _, info := range infos {
			key := processKey(info, scope, mig)
			e := set[key]
			if e == nil {
				e = &procEntry{}
				set[key] = e
			}
			l.mark(e)
			// Every list reports the process's whole usage, so the lists are not summed; the largest known
			// value wins, in case one list reports it as not available.
			if m := usedMemory(info.UsedGpuMemory); m.Valid && (!e.memory.Valid || m.V > e.memory.V) {
				e.memory = m
			}
		}
	}
	return listed
}

// invalidInstanceID is NVML's instance ID of a process that is not on a MIG instance.
const invalidInstanceID = 0xFFFFFFFF

func processKey(info gonvml.ProcessInfo, scope listScope, mig *migDevice) procKey {
	key := procKey{pid: info.Pid}
	switch scope {
	case listOnMIGDevice:
		key.mig, key.gi, key.ci = true, mig.gpuInstance, mig.computeInstance
	case listOnGPUInMIGMode:
		if info.GpuInstanceId != invalidInstanceID && info.ComputeInstanceId != invalidInstanceID {
			key.mig, key.gi, key.ci = true, int(info.GpuInstanceId), int(info.ComputeInstanceId)
		}
	}
	return key
}

// usedMemory reads UsedGpuMemory, where NVML_VALUE_NOT_AVAILABLE means unknown (e.g. without the privileges to see
// other processes' memory).
func usedMemory(v uint64) gpu.Value {
	if v == notAvailable {
		return gpu.Value{}
	}
	return gpu.Known(float64(v))
}

// readProcessUtilization returns the newest sample per listed PID since the last read of this GPU; a PID whose
// samples were all dropped maps to nil. known is false when utilization cannot be read; NOT_FOUND means no process
// had any utilization since the last read, which is known. The first read of a GPU looks back UtilizationWindow
// instead of passing 0, which would average the driver's whole sample buffer.
//
// Drivers return garbage now and then (a sample of 37,100%, timestamps from before the asked-for time or from the
// future, PIDs that are not running on the GPU), so, as nvtop does, only samples of listed PIDs with every field at
// most 100% and lastSeen < timestamp <= now + utilizationClockSlack are kept, and the last-seen timestamp advances
// only to the newest kept sample. listed are the GPU's processes: without MIG, a process's key is its PID alone.
func (r *deviceReader) readProcessUtilization(h gonvml.Device, listed map[procKey]*procEntry) (samples map[uint32]*gonvml.ProcessUtilizationSample, known bool) {
	// go-nvml asks for the sample count, then reads into a slice of that length and slices it by the count the
	// driver returns, which is larger when processes started in between: a panic (go-nvml#11, #27). The reading is
	// then lost, not the GPU.
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("reading process_utilization of GPU %d: go-nvml panicked (samples appeared during the read): %v", r.index, p)
			r.errs = append(r.errs, r.s.fail(r.index, r.uuid, gpu.OpProcessUtilization, err))
			samples, known = nil, false
		}
	}()
	now := r.s.now()
	last, ok := r.s.lastSeen[r.uuid]
	if !ok {
		last = uint64(now.Add(-r.s.utilizationWindow).UnixMicro())
	}
	// A reading right after another (two Prometheus servers, ps during a scrape) would find no new sample and read
	// every busy process as idle. Looking back at least a second cannot double-count: the newest sample per PID wins.
	since := min(last, uint64(now.Add(-minUtilizationLookback).UnixMicro()))
	list, ret := retrySize(func() ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
		return h.GetProcessUtilization(since)
	})
	if ret == gonvml.ERROR_NOT_FOUND {
		r.s.lastSeen[r.uuid] = last
		return nil, true
	}
	if !r.ok(gpu.OpProcessUtilization, ret) {
		return nil, false
	}
	latest := uint64(now.Add(utilizationClockSlack).UnixMicro())
	samples = make(map[uint32]*gonvml.ProcessUtilizationSample, len(list))
	newest, dropped := last, 0
	for i := range list {
		s := &list[i]
		if listed[procKey{pid: s.Pid}] == nil {
			dropped++
			continue
		}
		if s.SmUtil > 100 || s.MemUtil > 100 || s.EncUtil > 100 || s.DecUtil > 100 || s.TimeStamp <= since || s.TimeStamp > latest {
			dropped++
			if _, ok := samples[s.Pid]; !ok {
				samples[s.Pid] = nil
			}
			continue
		}
		if prev := samples[s.Pid]; prev == nil || s.TimeStamp > prev.TimeStamp {
			samples[s.Pid] = s
		}
		newest = max(newest, s.TimeStamp)
	}
	if dropped > 0 {
		r.s.log.Debug("dropped per-process utilization samples that are out of range, out of time or of unlisted processes",
			"gpu", r.index, "uuid", r.uuid, "dropped", dropped, "returned", len(list))
	}
	r.s.lastSeen[r.uuid] = newest
	return samples, true
}

// utilizationClockSlack is how far in the future a sample's timestamp may be: the driver stamps samples with the
// same CPU clock, so only a small skew between its read and ours is real.
const utilizationClockSlack = 2 * time.Second

// minUtilizationLookback is the shortest window asked of GetProcessUtilization: longer than the driver's sample
// period on every GPU generation (1/6 s to 1 s).
const minUtilizationLookback = time.Second

// processName asks NVML for a process's name, once per PID per snapshot. It fails for processes outside the
// exporter's PID namespace; the name is then empty and attribution reads /proc instead.
func (s *Source) processName(pid uint32, names map[uint32]string) string {
	if n, ok := names[pid]; ok {
		return n
	}
	n, ret := s.lib.SystemGetProcessName(int(pid))
	if ret != gonvml.SUCCESS {
		n = ""
	}
	names[pid] = n
	return n
}
