// Package drmfake writes the files a node's amdgpu, i915 and xe GPUs publish, in the kernel's layout, under a
// directory: a sysfs (/sys/class/drm with its device links, the PCI devices' attributes, hwmon, KFD's topology and
// compute processes) and the DRM parts of a procfs (each process's open DRM files and their fdinfo), for the DRM
// source's tests, the end-to-end tests and the benchmark. The files' formats and every value's source are in
// internal/gpu/drm/testdata/SOURCES.md. It is for tests only.
//
// A process's open DRM file is a symlink to a character device node of DRM's major number, as /proc/<pid>/fd/<n>
// links to /dev/dri/renderD<n>: making one needs CAP_MKNOD (root), which the suite's machines have.
package drmfake

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// drmMajor is DRM's character device major (include/uapi/linux/major.h).
const drmMajor = 226

// GPU is one GPU of the node.
type GPU struct {
	Card, Render int    // /dev/dri/card<Card>, renderD<Render>
	PCI          string // 0000:05:00.0
	Driver       string // amdgpu, i915, xe
	// Attrs are the PCI device's attribute files, by path below its directory (vendor, device, unique_id,
	// gpu_busy_percent, tile0/physical_vram_size_bytes, ...).
	Attrs map[string]string
	// CardAttrs are the DRM card's own attribute files (i915's gt_act_freq_mhz).
	CardAttrs map[string]string
	// Hwmon are the files of the device's hwmon directory; none: no hwmon.
	Hwmon map[string]string
	// KFDGPUID is the GPU's gpu_id in KFD's topology (amdgpu); 0: not in KFD.
	KFDGPUID uint64
}

// Process is one process of the node: its open DRM files and, for a ROCm process, its VRAM as KFD counts it.
type Process struct {
	PID uint32
	// DRM are its open DRM files, in fd order.
	DRM []File
	// Other is how many other files it has open (symlinks to /dev/null, a character device of another major),
	// before the DRM ones.
	Other int
	// KFD is its VRAM per GPU (by KFD gpu_id) under /sys/class/kfd/kfd/proc/<pid>; nil: not a KFD process.
	KFD map[uint64]uint64
}

// File is one open DRM file.
type File struct {
	Minor  int    // the device node's minor: a card's or a render node's
	FDInfo string // the file's /proc/<pid>/fdinfo/<fd>
}

// Node is a node's GPUs and the processes using them.
type Node struct {
	GPUs      []GPU
	Processes []Process
	// KernelRelease is /proc/sys/kernel/osrelease, the driver version of in-tree drivers.
	KernelRelease string
	// Module versions: /sys/module/<driver>/version, which an out-of-tree (DKMS) driver has.
	ModuleVersions map[string]string
	// OtherCards are DRM cards of drivers the source does not read (nvidia-drm, a BMC's ast), by card number:
	// the driver and PCI address.
	OtherCards map[int][2]string
}

// otherVendors are the PCI vendors of the drivers OtherCards may name.
var otherVendors = map[string]string{"nvidia": "0x10de", "ast": "0x1a03"}

// ErrNeedsRoot is Write's error where device nodes cannot be made.
var ErrNeedsRoot = errors.New("making DRM device nodes needs CAP_MKNOD (run as root)")

// Write writes the node under dir: sysfs at dir/sys, the processes at dir/proc (only their fd and fdinfo
// directories: the caller writes the rest of a process's files), and the device nodes the fds link to at dir/dev.
func (n *Node) Write(dir string) (sysfs, procfs string, err error) {
	sysfs, procfs = filepath.Join(dir, "sys"), filepath.Join(dir, "proc")
	w := &writer{}
	for _, g := range n.GPUs {
		w.gpu(sysfs, g)
	}
	for card, other := range n.OtherCards {
		w.card(sysfs, card, -1, other[1], other[0], otherVendors[other[0]])
	}
	for drv, v := range n.ModuleVersions {
		w.file(filepath.Join(sysfs, "module", drv, "version"), v+"\n")
	}
	if n.KernelRelease != "" {
		w.file(filepath.Join(procfs, "sys", "kernel", "osrelease"), n.KernelRelease+"\n")
	}
	if slices.ContainsFunc(n.GPUs, func(g GPU) bool { return g.KFDGPUID != 0 }) {
		w.kfdTopology(sysfs, n.GPUs)
	}
	w.dir(procfs)
	for _, p := range n.Processes {
		w.process(dir, sysfs, procfs, p)
	}
	return sysfs, procfs, w.err
}

type writer struct {
	err     error
	devices map[int]string // minor → device node made
}

func (w *writer) dir(path string) {
	if w.err == nil {
		w.err = os.MkdirAll(path, 0o755)
	}
}

func (w *writer) file(path, content string) {
	w.dir(filepath.Dir(path))
	if w.err == nil {
		w.err = os.WriteFile(path, []byte(content), 0o644)
	}
}

func (w *writer) link(path, target string) {
	w.dir(filepath.Dir(path))
	if w.err == nil {
		w.err = os.Symlink(target, path)
	}
}

// gpu writes a GPU the way sysfs lays it out: the PCI device under /sys/devices with its attributes, drm/card<N>
// and drm/renderD<N> below it, class/drm links to those, and the device's driver link.
func (w *writer) gpu(sysfs string, g GPU) {
	dev := w.card(sysfs, g.Card, g.Render, g.PCI, g.Driver, g.Attrs["vendor"])
	for _, name := range slices.Sorted(maps.Keys(g.Attrs)) {
		w.file(filepath.Join(dev, name), g.Attrs[name]+"\n")
	}
	for name, v := range g.CardAttrs {
		w.file(filepath.Join(dev, "drm", "card"+strconv.Itoa(g.Card), name), v+"\n")
	}
	if g.Hwmon != nil {
		hw := filepath.Join(dev, "hwmon", fmt.Sprintf("hwmon%d", g.Card+2))
		w.dir(hw)
		for name, v := range g.Hwmon {
			w.file(filepath.Join(hw, name), v+"\n")
		}
	}
}

// card writes a PCI device with a DRM card (and render node, render >= 0) bound to driver, and returns the
// device's directory.
func (w *writer) card(sysfs string, card, render int, pci, driver, vendor string) string {
	// Below a root port, as GPUs sit: /sys/devices/pci0000:00/0000:00:01.1/<pci>.
	rel := filepath.Join("devices", "pci"+pci[:7], pci[:7]+":00:01.1", pci)
	dev := filepath.Join(sysfs, rel)
	w.dir(dev)
	if vendor != "" {
		w.file(filepath.Join(dev, "vendor"), vendor+"\n")
	}
	// A display controller's class (0x03), as the PCI core lists it under /sys/bus/pci/devices.
	w.file(filepath.Join(dev, "class"), "0x030200\n")
	w.link(filepath.Join(sysfs, "bus", "pci", "devices", pci), relTo(filepath.Join(sysfs, "bus", "pci", "devices"), dev))
	w.dir(filepath.Join(sysfs, "bus", "pci", "drivers", driver))
	w.link(filepath.Join(dev, "driver"), relTo(dev, filepath.Join(sysfs, "bus", "pci", "drivers", driver)))
	nodes := []string{"card" + strconv.Itoa(card)}
	if render >= 0 {
		nodes = append(nodes, "renderD"+strconv.Itoa(render))
	}
	for _, node := range nodes {
		nd := filepath.Join(dev, "drm", node)
		w.dir(nd)
		w.link(filepath.Join(nd, "device"), relTo(nd, dev))
		w.link(filepath.Join(sysfs, "class", "drm", node), relTo(filepath.Join(sysfs, "class", "drm"), nd))
	}
	return dev
}

func relTo(from, to string) string {
	rel, err := filepath.Rel(from, to)
	if err != nil {
		panic(err)
	}
	return rel
}

// kfdTopology writes KFD's topology: node 0 a CPU (gpu_id 0), then one node per GPU, whose properties give its
// render node's minor and PCI location (kfd_topology.c, node_show).
func (w *writer) kfdTopology(sysfs string, gpus []GPU) {
	top := filepath.Join(sysfs, "class", "kfd", "kfd", "topology")
	w.file(filepath.Join(top, "generation_id"), "1\n")
	w.file(filepath.Join(top, "nodes", "0", "gpu_id"), "0\n")
	w.file(filepath.Join(top, "nodes", "0", "properties"), "cpu_cores_count 96\nsimd_count 0\ndrm_render_minor 0\n")
	n := 1
	for _, g := range gpus {
		if g.KFDGPUID == 0 {
			continue
		}
		node := filepath.Join(top, "nodes", strconv.Itoa(n))
		w.file(filepath.Join(node, "gpu_id"), strconv.FormatUint(g.KFDGPUID, 10)+"\n")
		var bus, dev, fn, domain uint64
		fmt.Sscanf(g.PCI, "%04x:%02x:%02x.%x", &domain, &bus, &dev, &fn)
		w.file(filepath.Join(node, "properties"), fmt.Sprintf("cpu_cores_count 0\nsimd_count 1216\nmem_banks_count 1\n"+
			"vendor_id 4098\ndevice_id 29857\nlocation_id %d\ndomain %d\ndrm_render_minor %d\nmax_engine_clk_fcompute 2100\n",
			bus<<8|dev<<3|fn, domain, g.Render))
		n++
	}
	w.dir(filepath.Join(sysfs, "class", "kfd", "kfd", "proc"))
}

// process writes a process's open files and fdinfo, and its KFD directory.
func (w *writer) process(root, sysfs, procfs string, p Process) {
	pdir := filepath.Join(procfs, strconv.FormatUint(uint64(p.PID), 10))
	w.dir(filepath.Join(pdir, "fd"))
	w.dir(filepath.Join(pdir, "fdinfo"))
	fd := 0
	for range p.Other {
		w.link(filepath.Join(pdir, "fd", strconv.Itoa(fd)), "/dev/null")
		w.file(filepath.Join(pdir, "fdinfo", strconv.Itoa(fd)), "pos:\t0\nflags:\t02\nmnt_id:\t5\nino:\t4\n")
		fd++
	}
	for _, f := range p.DRM {
		w.link(filepath.Join(pdir, "fd", strconv.Itoa(fd)), w.node(root, f.Minor))
		w.file(filepath.Join(pdir, "fdinfo", strconv.Itoa(fd)), f.FDInfo)
		fd++
	}
	if p.KFD != nil {
		kdir := filepath.Join(sysfs, "class", "kfd", "kfd", "proc", strconv.FormatUint(uint64(p.PID), 10))
		w.file(filepath.Join(kdir, "pasid"), "32770\n")
		for id, vram := range p.KFD {
			w.file(filepath.Join(kdir, "vram_"+strconv.FormatUint(id, 10)), strconv.FormatUint(vram, 10)+"\n")
			w.file(filepath.Join(kdir, "sdma_"+strconv.FormatUint(id, 10)), "0\n")
		}
	}
}

// node makes the DRM device node of a minor under root/dev/dri, once, and returns its path.
func (w *writer) node(root string, minor int) string {
	if w.devices == nil {
		w.devices = make(map[int]string)
	}
	if path, ok := w.devices[minor]; ok {
		return path
	}
	name := "card" + strconv.Itoa(minor)
	if minor >= 128 {
		name = "renderD" + strconv.Itoa(minor)
	}
	path := filepath.Join(root, "dev", "dri", name)
	w.dir(filepath.Dir(path))
	if w.err == nil {
		err := unix.Mknod(path, unix.S_IFCHR|0o600, int(unix.Mkdev(drmMajor, uint32(minor))))
		if errors.Is(err, unix.EPERM) {
			err = ErrNeedsRoot
		}
		w.err = err
	}
	w.devices[minor] = path
	return path
}

// PCIAddress is the PCI address of the i-th GPU of a generated node.
func PCIAddress(bus int) string { return fmt.Sprintf("0000:%02x:00.0", bus) }

// fdinfoHeader is the part of every fdinfo the VFS writes before the driver's keys (fs/proc/fd.c).
func fdinfoHeader(b *strings.Builder) {
	b.WriteString("pos:\t0\nflags:\t02100002\nmnt_id:\t27\nino:\t1057\n")
}
