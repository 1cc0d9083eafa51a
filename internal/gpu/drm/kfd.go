package drm

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// KFD, amdgpu's compute driver (/dev/kfd, which ROCm uses), publishes each compute process under
// /sys/class/kfd/kfd/proc/<pid>, named by its PID in the initial PID namespace, with vram_<gpu_id>: the bytes of
// VRAM it allocated on each GPU (drivers/gpu/drm/amd/amdkfd/kfd_process.c). GPUs are named there by KFD's gpu_id,
// which the topology (kfd_topology.c: topology/nodes/<n>/gpu_id and properties) ties to a render node.

// kfdTopology maps KFD's gpu_ids to PCI addresses.
type kfdTopology struct {
	generation string
	gpus       map[uint64]string
}

// maxKFDNodes bounds the topology nodes read: a CPU node per socket and one per GPU or compute partition.
const maxKFDNodes = 1024

func kfdDir(sysfs string) string { return filepath.Join(sysfs, "class", "kfd", "kfd") }

// readKFDTopology reads the topology when its generation_id changed since last (nil: never read); renders maps
// render node minors to PCI addresses. It returns nil, nil where there is no KFD (no amdgpu, or an older kernel).
func readKFDTopology(f *files, sysfs string, renders map[int]string, last *kfdTopology) (*kfdTopology, error) {
	dir := filepath.Join(kfdDir(sysfs), "topology")
	gen, err := f.text(filepath.Join(dir, "generation_id"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading KFD's topology: %w", err)
	}
	if last != nil && last.generation == gen && len(last.gpus) > 0 {
		return last, nil
	}
	nodes, err := dirNames(filepath.Join(dir, "nodes"), maxKFDNodes)
	if err != nil {
		return nil, fmt.Errorf("reading KFD's topology: %w", err)
	}
	t := &kfdTopology{generation: gen, gpus: make(map[uint64]string)}
	for _, n := range nodes {
		id, err := f.uint(filepath.Join(dir, "nodes", n, "gpu_id"))
		if err != nil || id == 0 { // a CPU node has gpu_id 0
			continue
		}
		props, err := f.read(filepath.Join(dir, "nodes", n, "properties"))
		if err != nil {
			continue
		}
		if pci, ok := renders[int(property(props, "drm_render_minor"))]; ok {
			t.gpus[id] = pci
		}
	}
	return t, nil
}

// property reads one "name value" line of a KFD properties file; 0 when absent.
func property(props []byte, name string) uint64 {
	for len(props) > 0 {
		line := props
		if i := bytes.IndexByte(props, '\n'); i >= 0 {
			line, props = props[:i], props[i+1:]
		} else {
			props = nil
		}
		k, v, ok := bytes.Cut(line, []byte(" "))
		if ok && string(k) == name {
			n, _ := parseUint(trimSpace(v))
			return n
		}
	}
	return 0
}

// kfdMemory is a compute process's VRAM on each GPU, by PCI address.
type kfdMemory map[string]float64

// Bounds on KFD's process list: the compute processes of a node, and the GPUs of one.
const (
	maxKFDProcesses = 1 << 16
	maxKFDFiles     = 256
)

// kfdFiles remembers each compute process's vram_<gpu_id> files, which KFD creates with the process, one per GPU
// it may use: a reading opens them without listing the process's directory again. A process's files are listed
// again when one is gone, and at least every fullLookEvery (a PID reused by another compute process).
type kfdFiles map[uint32]kfdProcess

type kfdProcess struct {
	vram   []kfdVRAM
	listed time.Time
}

// kfdVRAM is one vram_<gpu_id> file of a process, of a GPU of the topology.
type kfdVRAM struct {
	path string
	pci  string
}

// readKFDProcesses reads every compute process's VRAM per GPU. A process that exits while it is read is left out.
func readKFDProcesses(f *files, sysfs string, t *kfdTopology, known kfdFiles, now time.Time) (map[uint32]kfdMemory, error) {
	dir := filepath.Join(kfdDir(sysfs), "proc")
	pids, err := dirNames(dir, maxKFDProcesses)
	if err != nil {
		return nil, fmt.Errorf("listing KFD's compute processes: %w", err)
	}
	procs := make(map[uint32]kfdMemory, len(pids))
	live := make(map[uint32]bool, len(pids))
	for _, p := range pids {
		pid64, err := strconv.ParseUint(p, 10, 32)
		if err != nil || pid64 == 0 {
			continue
		}
		pid := uint32(pid64)
		live[pid] = true
		k, ok := known[pid]
		if !ok || now.Sub(k.listed) >= fullLookEvery {
			names, err := dirNames(filepath.Join(dir, p), maxKFDFiles)
			if err != nil {
				delete(known, pid)
				continue // exited
			}
			k = kfdProcess{listed: now}
			for _, name := range names {
				id, ok := strings.CutPrefix(name, "vram_")
				if !ok {
					continue // pasid, sdma_<gpu_id>, stats_<gpu_id>
				}
				gpuID, err := strconv.ParseUint(id, 10, 64)
				if pci, ours := t.gpus[gpuID]; err == nil && ours {
					k.vram = append(k.vram, kfdVRAM{path: filepath.Join(dir, p, name), pci: pci})
				}
			}
			known[pid] = k
		}
		var mem kfdMemory
		for _, v := range k.vram {
			n, err := f.uint(v.path)
			if err != nil {
				delete(known, pid) // gone, or its files changed: listed again next time
				continue
			}
			if mem == nil {
				mem = make(kfdMemory, 1)
			}
			mem[v.pci] += float64(n)
		}
		procs[pid] = mem
	}
	for pid := range known {
		if !live[pid] {
			delete(known, pid)
		}
	}
	return procs, nil
}
