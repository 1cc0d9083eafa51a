package drmfake

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// The nodes the tests share. Their values are chosen to look like the real thing; testdata/SOURCES.md says which
// come from public captures (the MI300X's IDs, temperatures, clocks and power cap from a rocm-smi capture) and
// which are made up.

// MI300X GPUs' PCI addresses: the first four and their unique IDs are a public rocm-smi capture's, the others
// continue the same platform's layout.
var (
	mi300xBuses     = []int{0x05, 0x26, 0x46, 0x65, 0x85, 0xa6, 0xc6, 0xe5}
	mi300xUniqueIDs = []string{"2c5ab07d91e3f640", "8d1457e2c20f59d2", "b4fa34630e85d42a", "e8986800e182538a",
		"eff71edc82169115", "7f0e4c2d58a1b396", "a3d96b10e47f2c58", "c81f5e7a092b6d34"}
	mi300xKFDIDs = []uint64{45538, 63271, 9170, 20113, 52882, 35007, 58731, 1289}
)

// MI300X GPU readings.
const (
	MI300XVRAMTotal   = 205822885888 // 192 GB of HBM3, as mem_info_vram_total reports it
	MI300XDriverVRAM  = 301989888    // what the driver itself holds in VRAM on an idle GPU
	MI300XPowerCapW   = 750
	MI300XName        = "AMD Instinct MI300X OAM"
	MI300XDriver      = "6.7.0"
	MI300XKernel      = "6.8.0-60-generic"
	mi300xSclkBusyMHz = 2100
	mi300xSclkIdleMHz = 131
	mi300xMclkBusyMHz = 1300
	mi300xMclkIdleMHz = 900
)

// MI300XGPU is one GPU of the MI300X node and what it reads.
type MI300XGPU struct {
	PCI, UUID               string
	Card, Render            int
	KFDGPUID                uint64
	Busy, MemBusy           int     // percent
	PowerW, JunctionC, MemC float64 // watts, degrees
	SclkMHz, MclkMHz        int
	VRAMUsed                uint64
	processVRAM             uint64
}

// MI300XProcess is one process of the MI300X node, and on which GPU (index into the node's GPUs).
type MI300XProcess struct {
	PID  uint32
	Comm string
	GPU  int
	// KFDVRAM is its VRAM as KFD counts it (0: not a KFD process); DRMVRAM as its DRM client counts it.
	KFDVRAM, DRMVRAM uint64
	// Memory is what the exporter reports: the larger of the two.
	Memory uint64
	// DecNS and JpegNS are its video decode and JPEG engines' busy time at the first reading; the second adds
	// DecStepNS.
	DecNS, JpegNS, DecStepNS uint64
	ClientID                 uint64
	// SharesWith is the PID whose DRM client this process inherited (fork), or 0.
	SharesWith uint32
}

// MI300XNode is an 8-GPU MI300X node: a 4-rank training job on GPUs 0-3, an inference server on GPU 4, nothing
// on GPU 5 (allocated to an idle notebook in the tests), a video decoding pod on GPU 6 whose worker shares its
// DRM client, and a job on GPU 7 that no allocation covers; a BMC's display controller (ast, card0) that the
// source must pass over; processes with only sockets and files open.
type MI300XNode struct {
	GPUs      []MI300XGPU
	Processes []MI300XProcess
}

// NewMI300X returns the MI300X node.
func NewMI300X() *MI300XNode {
	const gib = 1 << 30
	n := &MI300XNode{}
	busy := []int{97, 96, 98, 95, 62, 0, 3, 44}
	memBusy := []int{41, 40, 43, 39, 55, 0, 1, 22}
	power := []float64{612, 598, 605, 620, 455, 131, 168, 389}
	junction := []float64{71, 73, 70, 74, 62, 35, 41, 58}
	mem := []float64{63, 64, 62, 66, 57, 33, 36, 52}
	for i, bus := range mi300xBuses {
		g := MI300XGPU{PCI: PCIAddress(bus), UUID: "GPU-" + mi300xUniqueIDs[i], Card: i + 1, Render: 128 + i,
			KFDGPUID: mi300xKFDIDs[i], Busy: busy[i], MemBusy: memBusy[i], PowerW: power[i], JunctionC: junction[i],
			MemC: mem[i], SclkMHz: mi300xSclkIdleMHz, MclkMHz: mi300xMclkIdleMHz}
		if busy[i] > 10 {
			g.SclkMHz, g.MclkMHz = mi300xSclkBusyMHz, mi300xMclkBusyMHz
		}
		n.GPUs = append(n.GPUs, g)
	}
	for r := range 4 {
		n.add(MI300XProcess{PID: uint32(4101 + r), Comm: "python3", GPU: r, KFDVRAM: 160 * gib,
			DRMVRAM: 160*gib + 2<<20, ClientID: uint64(1101 + r)})
	}
	n.add(MI300XProcess{PID: 4201, Comm: "vllm", GPU: 4, KFDVRAM: 180 * gib, DRMVRAM: 180*gib + 6<<20, ClientID: 1201})
	n.add(MI300XProcess{PID: 4401, Comm: "ffmpeg", GPU: 6, DRMVRAM: 1536 << 20, DecNS: 8_000_000_000,
		JpegNS: 120_000_000, DecStepNS: 1_000_000_000, ClientID: 1401})
	n.add(MI300XProcess{PID: 4402, Comm: "ffmpeg", GPU: 6, ClientID: 1401, SharesWith: 4401})
	// A KFD process whose DRM file counts less than KFD does (an older kernel's DRM file without KFD's buffers).
	n.add(MI300XProcess{PID: 4501, Comm: "python3", GPU: 7, KFDVRAM: 90 * gib, DRMVRAM: 64 << 20, ClientID: 1501})
	for i := range n.GPUs {
		n.GPUs[i].VRAMUsed = MI300XDriverVRAM + n.GPUs[i].processVRAM
	}
	return n
}

func (n *MI300XNode) add(p MI300XProcess) {
	if p.SharesWith == 0 {
		p.Memory = max(p.KFDVRAM, p.DRMVRAM)
		n.GPUs[p.GPU].processVRAM += p.Memory
	}
	n.Processes = append(n.Processes, p)
}

// Node is the MI300X node in files; second is the readings after the first: each decoding client's busy time
// grows by its DecStepNS.
func (n *MI300XNode) Node(second bool) *Node {
	node := &Node{KernelRelease: MI300XKernel, ModuleVersions: map[string]string{"amdgpu": MI300XDriver},
		OtherCards: map[int][2]string{0: {"ast", "0000:02:00.0"}}}
	for _, g := range n.GPUs {
		node.GPUs = append(node.GPUs, GPU{Card: g.Card, Render: g.Render, PCI: g.PCI, Driver: "amdgpu",
			KFDGPUID: g.KFDGPUID,
			Attrs: map[string]string{
				"vendor": "0x1002", "device": "0x74a1", "product_name": MI300XName,
				"unique_id": g.UUID[len("GPU-"):], "gpu_busy_percent": strconv.Itoa(g.Busy),
				"mem_busy_percent": strconv.Itoa(g.MemBusy), "mem_info_vram_total": strconv.Itoa(MI300XVRAMTotal),
				"mem_info_vram_used": strconv.FormatUint(g.VRAMUsed, 10), "pcie_replay_count": "0",
				"current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe",
				"current_link_width": "16", "max_link_width": "16",
			},
			// gc 9.4.3 hides the edge sensor (temp1): junction and mem only (amdgpu_pm.c).
			Hwmon: map[string]string{
				"name": "amdgpu", "temp2_input": milli(g.JunctionC), "temp2_label": "junction",
				"temp3_input": milli(g.MemC), "temp3_label": "mem",
				"power1_input": micro(g.PowerW), "power1_cap": micro(MI300XPowerCapW), "power1_label": "PPT",
				"freq1_input": strconv.Itoa(g.SclkMHz * 1_000_000), "freq1_label": "sclk",
				"freq2_input": strconv.Itoa(g.MclkMHz * 1_000_000), "freq2_label": "mclk",
			},
		})
	}
	byPID := make(map[uint32]MI300XProcess)
	for _, p := range n.Processes {
		byPID[p.PID] = p
	}
	for _, p := range n.Processes {
		owner := p
		if p.SharesWith != 0 {
			owner = byPID[p.SharesWith]
		}
		g := n.GPUs[owner.GPU]
		dec := owner.DecNS
		if second {
			dec += owner.DecStepNS
		}
		c := AMDGPUClient{PDev: g.PCI, ID: owner.ClientID, VRAM: owner.DRMVRAM, GTT: 8 << 20,
			EnginesNS: map[string]uint64{"dec": dec, "jpeg": owner.JpegNS}, EngineList: []string{"dec", "jpeg"}}
		fp := Process{PID: p.PID, Other: 3, DRM: []File{{Minor: g.Render, FDInfo: c.FDInfo()}}}
		if p.KFDVRAM > 0 {
			fp.KFD = map[uint64]uint64{g.KFDGPUID: p.KFDVRAM}
		}
		node.Processes = append(node.Processes, fp)
	}
	// A process with only sockets and files open, and one of another user's with a DRM file of a GPU no process
	// of the node uses: neither is a GPU process of these GPUs.
	node.Processes = append(node.Processes, Process{PID: 900, Other: 48})
	return node
}

// XeGPU is one GPU of the xe node and what it reads.
type XeGPU struct {
	PCI, UUID    string
	Card, Render int
	FreqMHz      int
	PkgC, VRAMC  float64
	EnergyJ      uint64 // energy1_input at the first reading, in joules; the second adds PowerW × the readings' interval
	PowerW       float64
	PowerLimitW  float64
}

// XeProcess is one process of the xe node.
type XeProcess struct {
	PID  uint32
	Comm string
	GPU  int
	VRAM uint64
	// CCSStep and VCSStep are the busy cycles its client adds between the two readings, against xeTotalStep total
	// cycles; Share is the PID whose client it also holds.
	CCSStep, VCSStep uint64
	ClientID         uint64
	SharesWith       uint32
}

// Xe node constants.
const (
	XeVRAMTotal  = 12884901888 // 12 GiB (tile0/physical_vram_size_bytes)
	XeKernel     = "6.15.2-arch1-1"
	xeTotalStart = 7655183225 // a GPU timestamp, as in xe_drm_client.c's example
	XeTotalStep  = 1_000_000_000
	XeVCSCap     = 2 // two video engines: a client's busy fraction is its cycles over twice the total
)

// XeNode is a node with two Intel Arc B580 GPUs (Battlemage, xe): a compute pod on GPU 0; a media pod on GPU 1
// whose worker shares the pod's DRM client and has one of its own, and a second compute pod on GPU 1.
type XeNode struct {
	GPUs      []XeGPU
	Processes []XeProcess
}

// NewXe returns the xe node.
func NewXe() *XeNode {
	n := &XeNode{GPUs: []XeGPU{
		{PCI: "0000:03:00.0", Card: 0, Render: 128, FreqMHz: 2850, PkgC: 58, VRAMC: 62, EnergyJ: 1_843_221, PowerW: 148, PowerLimitW: 190},
		{PCI: "0000:83:00.0", Card: 1, Render: 129, FreqMHz: 2400, PkgC: 51, VRAMC: 55, EnergyJ: 922_108, PowerW: 96, PowerLimitW: 190},
	}}
	for i := range n.GPUs {
		n.GPUs[i].UUID = "PCI-" + n.GPUs[i].PCI
	}
	n.Processes = []XeProcess{
		{PID: 5101, Comm: "python3", GPU: 0, VRAM: 8 << 30, CCSStep: 750_000_000, ClientID: 31},
		{PID: 5201, Comm: "gst-launch-1.0", GPU: 1, VRAM: 1 << 30, VCSStep: 900_000_000, ClientID: 41},
		{PID: 5202, Comm: "gst-launch-1.0", GPU: 1, VRAM: 256 << 20, VCSStep: 200_000_000, ClientID: 42, SharesWith: 5201},
		{PID: 5301, Comm: "python3", GPU: 1, VRAM: 3 << 30, CCSStep: 250_000_000, ClientID: 51},
	}
	return n
}

// Node is the xe node in files; interval is the time between the two readings, by which the energy counters grow.
func (n *XeNode) Node(second bool, interval float64) *Node {
	node := &Node{KernelRelease: XeKernel}
	for _, g := range n.GPUs {
		energy := float64(g.EnergyJ)
		if second {
			energy += g.PowerW * interval
		}
		node.GPUs = append(node.GPUs, GPU{Card: g.Card, Render: g.Render, PCI: g.PCI, Driver: "xe",
			Attrs: map[string]string{
				"vendor": "0x8086", "device": "0xe20b",
				"tile0/physical_vram_size_bytes": strconv.Itoa(XeVRAMTotal),
				"tile0/gt0/freq0/act_freq":       strconv.Itoa(g.FreqMHz),
				"current_link_speed":             "16.0 GT/s PCIe", "max_link_speed": "16.0 GT/s PCIe",
				"current_link_width": "8", "max_link_width": "8",
			},
			Hwmon: map[string]string{
				"name": "xe", "temp2_input": milli(g.PkgC), "temp2_label": "pkg",
				"temp3_input": milli(g.VRAMC), "temp3_label": "vram",
				"energy1_input": strconv.FormatFloat(energy*1e6, 'f', 0, 64), "energy1_label": "card",
				"energy2_input": strconv.FormatFloat(energy*1.1e6, 'f', 0, 64), "energy2_label": "pkg",
				"power1_max": micro(g.PowerLimitW), "power1_label": "card", "fan1_input": "1180",
			},
		})
	}
	for _, p := range n.Processes {
		g := n.GPUs[p.GPU]
		client := func(q XeProcess) File {
			c := XeClient{PDev: g.PCI, ID: q.ClientID, VRAM: q.VRAM, GTT: 4 << 20, Total: xeTotalStart,
				Cycles:   map[string]uint64{"rcs": 0, "bcs": 0, "vcs": 0, "vecs": 0, "ccs": 0},
				Capacity: map[string]int{"vcs": XeVCSCap, "vecs": 2}}
			// Work done before the first reading, on the engines the client uses.
			if q.CCSStep > 0 {
				c.Cycles["ccs"] = 3_000_000
			}
			if q.VCSStep > 0 {
				c.Cycles["vcs"] = 1_000_000
			}
			if second {
				c.Total += XeTotalStep
				c.Cycles["ccs"] += q.CCSStep
				c.Cycles["vcs"] += q.VCSStep
			}
			return File{Minor: g.Render, FDInfo: c.FDInfo()}
		}
		fp := Process{PID: p.PID, Other: 5, DRM: []File{client(p)}}
		if p.SharesWith != 0 {
			for _, q := range n.Processes {
				if q.PID == p.SharesWith {
					fp.DRM = append(fp.DRM, client(q))
				}
			}
		}
		node.Processes = append(node.Processes, fp)
	}
	return node
}

// RewriteFDInfo writes the processes' fdinfo files again with node's contents, for a second reading of a node
// written before.
func (n *Node) RewriteFDInfo(procfs string) error {
	for _, p := range n.Processes {
		for i, f := range p.DRM {
			path := filepath.Join(procfs, strconv.FormatUint(uint64(p.PID), 10), "fdinfo", strconv.Itoa(p.Other+i))
			if err := os.WriteFile(path, []byte(f.FDInfo), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// RewriteHwmon writes the GPUs' hwmon files again with node's contents.
func (n *Node) RewriteHwmon(sysfs string) error {
	for _, g := range n.GPUs {
		dev := filepath.Join(sysfs, "devices", "pci"+g.PCI[:7], g.PCI[:7]+":00:01.1", g.PCI, "hwmon", fmt.Sprintf("hwmon%d", g.Card+2))
		for name, v := range g.Hwmon {
			if err := os.WriteFile(filepath.Join(dev, name), []byte(v+"\n"), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

func milli(c float64) string { return strconv.FormatFloat(c*1000, 'f', 0, 64) }
func micro(w float64) string { return strconv.FormatFloat(w*1e6, 'f', 0, 64) }
