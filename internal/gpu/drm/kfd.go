package drm

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
)

// KFD, amdgpu's compute driver (/dev/kfd, which ROCm uses), publishes each compute process under
// /sys/class/kfd/kfd/proc/<pid>, named by its PID in the initial PID namespace, with vram_<gpu_id>: the bytes of
// VRAM it allocated on each GPU (drivers/gpu/drm/amd/amdkfd/kfd_process.c). GPUs are named there by KFD's gpu_id,
// which the topology (kfd_topology.c: topology/nodes/<n>/gpu_id and properties) ties to a render node.

// kfdTopology maps KFD's gpu_ids to PCI addresses.
type kfdTopology struct {
	generation string
	gpus       map[uint64]string
	cut        error // the nodes were more than a reading reads: a truncation
}

// maxKFDNodes bounds the topology nodes read: a CPU node per socket and one per GPU or compute partition.
const maxKFDNodes = 1024

func kfdDir(sysfs string) string { return filepath.Join(sysfs, "class", "kfd", "kfd") }

// readKFDTopology reads the topology, at most max of its nodes, when its generation_id changed since last (nil:
// never read); renders maps render node minors to PCI addresses. It returns nil, nil where there is no KFD (no
// amdgpu, or an older kernel).
func readKFDTopology(f *files, sysfs string, renders map[int]string, last *kfdTopology, max int) (*kfdTopology, error) {
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
	nodes, cut, err := dirNames(filepath.Join(dir, "nodes"), max)
	if err != nil {
		return nil, fmt.Errorf("reading KFD's topology: %w", err)
	}
	t := &kfdTopology{generation: gen, gpus: make(map[uint64]string)}
	if cut {
		t.cut = &truncation{dir: filepath.Join(dir, "nodes"), max: max,
			lost: "the compute processes of the GPUs past them are not listed"}
	}
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

// Bounds on KFD's process list: the compute processes of a node, and the entries of one's directory (a few per GPU
// it may use). The vram files kept open take their places in the source's budget of kept files, as the attribute
// files do (past it, a file is opened and closed at each reading).
const (
	maxKFDProcesses = 1 << 16
	maxKFDFiles     = 256
)

// kfdReader reads the compute processes' VRAM, reading by reading. It remembers each process's vram_<gpu_id> files,
// which KFD creates with the process, one per GPU (kfd_init_apertures makes the process's data of every GPU when
// the process is created), and keeps them open: a reading reads each again with one pread, without listing the
// process's directory. A kept file stays tied to the process's directory: once KFD removes it (the process exited,
// whether or not its PID is reused since), reading the file fails with ENODEV (kernfs), and the process's files are
// listed again at the next reading. They are listed again too when the topology changed, and, for a process with a
// file not kept open (past the budget), every fullLookEvery: the file is opened by its path at each reading, which
// could be another process's after its PID was reused.
type kfdReader struct {
	dir    string // <sysfs>/class/kfd/kfd/proc
	list   *procfs.Reader
	budget *procfs.KeptFiles // of the files kept open; nil: none kept
	procs  map[uint32]*kfdProcess
	kept   int // vram files open
	// Reused from one reading to the next.
	pids []uint32
	uses []kfdUse
}

type kfdProcess struct {
	vram    []kfdVRAM
	listed  time.Time
	topo    *kfdTopology // the topology it was listed with
	allKept bool         // every file kept open
}

// kfdVRAM is one vram_<gpu_id> file of a process, of a GPU of the topology, open as fd (-1 past the budget).
type kfdVRAM struct {
	path string
	pci  string
	fd   int
}

// kfdUse is a compute process's VRAM on one GPU, by PCI address: the sum of its files of the GPU (one, or one per
// compute partition of it).
type kfdUse struct {
	pid   uint32
	pci   string
	bytes float64
}

func newKFDReader(sysfs string, budget *procfs.KeptFiles) *kfdReader {
	dir := filepath.Join(kfdDir(sysfs), "proc")
	// KFD's process directory is named as /proc's are, by PID: the procfs reader lists them.
	return &kfdReader{dir: dir, list: procfs.NewReader(dir), budget: budget, procs: make(map[uint32]*kfdProcess)}
}

// read reads every compute process's VRAM per GPU, in the order of their PIDs, at most max processes: past them,
// it returns the uses read and a truncation. A process that exits while it is read is left out. The uses are good
// until the next read.
func (k *kfdReader) read(f *files, t *kfdTopology, now time.Time, max int) ([]kfdUse, error) {
	pids, err := k.list.AppendPIDs(k.pids[:0])
	if err != nil {
		return nil, fmt.Errorf("listing KFD's compute processes: %w", err)
	}
	slices.Sort(pids)
	var cut error
	if len(pids) > max {
		cut = &truncation{dir: k.dir, max: max, lost: "the compute processes past them, of the highest PIDs, are not listed"}
	}
	k.pids = pids[:min(len(pids), max)]
	for pid, p := range k.procs {
		if _, live := slices.BinarySearch(k.pids, pid); !live {
			k.drop(pid, p)
		}
	}
	uses := k.uses[:0]
	for _, pid := range k.pids {
		p := k.procs[pid]
		if p == nil || p.topo != t || !p.allKept && now.Sub(p.listed) >= fullLookEvery {
			if p = k.look(pid, p, t, now); p == nil {
				continue // exited
			}
		}
		first, failed := len(uses), false
		p.allKept = true
		for i := range p.vram {
			n, err := k.readVRAM(f, &p.vram[i])
			if err != nil {
				failed = true // gone, or its files changed: listed again next time
				continue
			}
			j := first
			for j < len(uses) && uses[j].pci != p.vram[i].pci {
				j++
			}
			if j == len(uses) {
				uses = append(uses, kfdUse{pid: pid, pci: p.vram[i].pci})
			}
			uses[j].bytes += float64(n)
			p.allKept = p.allKept && p.vram[i].fd >= 0
		}
		if failed {
			k.drop(pid, p)
		}
	}
	k.uses = uses
	return uses, cut
}

// look lists a process's vram files of the topology's GPUs, keeping open those it had open already; nil when the
// process is gone.
func (k *kfdReader) look(pid uint32, p *kfdProcess, t *kfdTopology, now time.Time) *kfdProcess {
	dir := filepath.Join(k.dir, strconv.FormatUint(uint64(pid), 10))
	names, _, err := dirNames(dir, maxKFDFiles)
	if err != nil {
		if p != nil {
			k.drop(pid, p)
		}
		return nil
	}
	if p == nil {
		if len(k.procs) >= maxKFDProcesses {
			return nil
		}
		p = &kfdProcess{}
		k.procs[pid] = p
	}
	old := p.vram
	p.vram, p.listed, p.topo = nil, now, t
	for _, name := range names {
		id, ok := strings.CutPrefix(name, "vram_")
		if !ok {
			continue // pasid, sdma_<gpu_id>, stats_<gpu_id>
		}
		gpuID, err := strconv.ParseUint(id, 10, 64)
		pci, ours := t.gpus[gpuID]
		if err != nil || !ours {
			continue
		}
		v := kfdVRAM{path: filepath.Join(dir, name), pci: pci, fd: -1}
		if i := slices.IndexFunc(old, func(o kfdVRAM) bool { return o.path == v.path }); i >= 0 {
			v.fd, old[i].fd = old[i].fd, -1
		}
		p.vram = append(p.vram, v)
	}
	for _, o := range old {
		k.close(o)
	}
	return p
}

// readVRAM reads one vram file, through its kept fd, opening it (and keeping it, within the budget) where it has
// none.
func (k *kfdReader) readVRAM(f *files, v *kfdVRAM) (uint64, error) {
	fd, again := v.fd, v.fd >= 0
	if !again {
		var err error
		if fd, err = open(v.path); err != nil {
			return 0, err
		}
		if k.budget != nil && k.budget.Reserve() {
			v.fd = fd
			k.kept++
		} else {
			defer syscall.Close(fd)
		}
	}
	b, err := f.readFD(fd, v.path, again)
	if err != nil {
		return 0, err
	}
	return parseAttr(b, v.path)
}

// drop forgets a process, closing its files.
func (k *kfdReader) drop(pid uint32, p *kfdProcess) {
	for _, v := range p.vram {
		k.close(v)
	}
	p.vram = nil
	delete(k.procs, pid)
}

func (k *kfdReader) close(v kfdVRAM) {
	if v.fd >= 0 {
		syscall.Close(v.fd)
		k.budget.Release()
		k.kept--
	}
}

// closeAll closes every kept file.
func (k *kfdReader) closeAll() {
	for pid, p := range k.procs {
		k.drop(pid, p)
	}
}
