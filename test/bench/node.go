package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// A benchmark node: a fake procfs with one directory per GPU process (comm, stat and a kubelet-shaped cgroup v1
// hybrid file, as on this kind of machine), and what the GPU source lists: a simulated node file, or a copy of an
// nvidia-smi fixture whose process lists name the same PIDs, with a fake nvidia-smi that only cats it.

const firstPID = 100000

// node is one generated node.
type node struct {
	dir        string
	procfs     string
	sysfs      string   // the drm source's node only
	simulated  string   // simulated node file
	smi        string   // fake nvidia-smi
	env        []string // the binary's environment, added to the bench's (the nvml node's stub library)
	gpus, pids int
	pidOf      func(i int) int // the i-th process's PID
	// health gives each simulated GPU the health, link and performance monitor readings of an H100 on a recent
	// driver (18 NVLinks, clock event reasons, violation times, profiling), as the NVML source reads them there.
	health bool
}

func fakePID(i int) int { return firstPID + i }

// containers is how many pod containers the processes run in: one each, up to 256, then several per container
// (a heavily time-sliced node).
func containers(pids int) int { return min(pids, 256) }

func podUID(c int) string      { return fmt.Sprintf("7a3c1f00-0000-4000-8000-%012d", c) }
func containerID(c int) string { return fmt.Sprintf("%064x", 0xc0ffee0000+c) }

func cgroupFile(c int) string {
	uid := strings.ReplaceAll(podUID(c), "-", "_")
	scope := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice/cri-containerd-" + containerID(c) + ".scope"
	var b strings.Builder
	for i, ctl := range []string{"misc", "rdma", "net_cls,net_prio", "hugetlb", "perf_event", "pids", "blkio", "freezer",
		"devices", "memory", "cpuset", "cpu,cpuacct"} {
		fmt.Fprintf(&b, "%d:%s:%s\n", 13-i, ctl, scope)
	}
	b.WriteString("1:name=systemd:" + scope + "\n0::/\n")
	return b.String()
}

// newNode writes a node of pids processes spread over gpus GPUs under dir.
func newNode(dir string, gpus, pids int, smiFixture string, health bool) (*node, error) {
	n := &node{dir: dir, procfs: filepath.Join(dir, "proc"), gpus: gpus, pids: pids, pidOf: fakePID, health: health}
	if err := n.writeProcfs(); err != nil {
		return nil, err
	}
	if err := n.writeSimulated(); err != nil {
		return nil, err
	}
	if smiFixture != "" {
		if err := n.writeSMI(smiFixture); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// writeProcfs writes the fake procfs's directory of each GPU process, in its pod's cgroup.
func (n *node) writeProcfs() error {
	for i := range n.pids {
		if err := e2eutil.WriteProc(n.procfs, uint32(n.pidOf(i)), "python3", cgroupFile(i%containers(n.pids))); err != nil {
			return err
		}
	}
	return nil
}

// newRealNode writes a simulated node file that lists real processes, read through the kernel's procfs.
func newRealNode(dir string, gpus int, pids []int) (*node, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	n := &node{dir: dir, procfs: "/proc", gpus: gpus, pids: len(pids), pidOf: func(i int) int { return pids[i] }}
	return n, n.writeSimulated()
}

// gpuOf is the GPU of the i-th process: round robin.
func (n *node) gpuOf(i int) int { return i % n.gpus }

func (n *node) writeSimulated() error {
	var b bytes.Buffer
	b.WriteString("driver_version: \"580.95.05\"\ncuda_version: \"13.0\"\ngpus:\n")
	for g := range n.gpus {
		fmt.Fprintf(&b, `  - uuid: GPU-00000000-0000-4000-8000-%012d
    name: NVIDIA H100 80GB HBM3
    pci_bus_id: "00000000:%02X:00.0"
    memory_total_bytes: 85520809984
    memory_used_bytes: 34359738368
    utilization_ratio: 0.5
    memory_utilization_ratio: 0.3
    temperature_celsius: 50
    power_usage_watts: 400
    power_limit_watts: 700
    energy_joules: 100000000
    fan_speed_ratio: 0.4
    performance_state: 0
    clocks_hertz: {sm: 1980000000, memory: 2619000000}
    ecc_errors: {corrected: 0, uncorrected: 0}
`, g, 0x10+g)
		if n.health {
			b.WriteString(h100Health)
		}
		b.WriteString("    processes:\n")
		for i := range n.pids {
			if n.gpuOf(i) != g {
				continue
			}
			fmt.Fprintf(&b, "      - {pid: %d, name: python3, type: compute, used_memory_bytes: 268435456, sm_utilization_ratio: 0.01, memory_utilization_ratio: 0.01}\n",
				n.pidOf(i))
		}
	}
	n.simulated = filepath.Join(n.dir, "node.yaml")
	return os.WriteFile(n.simulated, b.Bytes(), 0o644)
}

// h100Health is one H100's health, link and profiling readings in the simulated node format.
var h100Health = func() string {
	var b strings.Builder
	b.WriteString(`    memory_reserved_bytes: 502267904
    memory_temperature_celsius: 48
    power_management_limit_watts: 700
    vgpu_licensed: false
    pcie: {generation: 5, max_generation: 5, width: 16, max_width: 16, replays: 0, tx_bytes: 1800000000000000, rx_bytes: 5200000000000000, tx_bytes_per_second: 1800000000, rx_bytes_per_second: 5200000000}
    nvlink:
      tx_bytes: 61842563072
      rx_bytes: 61842563072
      tx_bytes_per_second: 1000000000
      rx_bytes_per_second: 1000000000
      links:
`)
	for l := range 18 {
		fmt.Fprintf(&b, "        - {link: %d, active: true, crc_flit_errors: 0, crc_data_errors: 0, replay_errors: 0, recovery_errors: 0}\n", l)
	}
	b.WriteString(`    remapped_rows: {correctable: 0, uncorrectable: 0, pending: false, failure: false}
    clock_events_active: []
    violations_seconds: {power: 1240.5, thermal: 0, sync_boost: 0, board_limit: 0, low_utilization: 8210.25, reliability: 0, sw_thermal_slowdown: 0, hw_thermal_slowdown: 0, hw_power_brake_slowdown: 0}
    recovery_action: none
    fabric: {state: completed, healthy: true}
    profiling: {graphics_engine_active: 0.7, sm_active: 0.55, sm_occupancy: 0.32, tensor_active: 0.31, dram_active: 0.36, fp64_active: 0, fp32_active: 0.09, fp16_active: 0.14, pcie_tx_bytes_per_second: 1800000000, pcie_rx_bytes_per_second: 5200000000, nvlink_tx_bytes_per_second: 1000000000, nvlink_rx_bytes_per_second: 1000000000}
`)
	return b.String()
}()

// writeSMI copies an nvidia-smi fixture with each GPU's process list replaced by the node's processes on it, and
// writes a fake nvidia-smi that cats it.
func (n *node) writeSMI(fixture string) error {
	src, err := os.ReadFile(fixture)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	rest := src
	for g := 0; ; g++ {
		start := bytes.Index(rest, []byte("<processes>"))
		if start < 0 {
			break
		}
		end := bytes.Index(rest[start:], []byte("</processes>"))
		if end < 0 {
			return fmt.Errorf("%s: unterminated <processes>", fixture)
		}
		out.Write(rest[:start])
		out.WriteString("<processes>\n")
		for i := range n.pids {
			if i%4 != g%4 {
				continue
			}
			fmt.Fprintf(&out, "\t\t\t<process_info>\n\t\t\t\t<gpu_instance_id>N/A</gpu_instance_id>\n"+
				"\t\t\t\t<compute_instance_id>N/A</compute_instance_id>\n\t\t\t\t<pid>%d</pid>\n\t\t\t\t<type>C</type>\n"+
				"\t\t\t\t<process_name>python3</process_name>\n\t\t\t\t<used_memory>2974 MiB</used_memory>\n\t\t\t</process_info>\n",
				n.pidOf(i))
		}
		out.WriteString("\t\t")
		rest = rest[start+end:]
	}
	out.Write(rest)
	xml := filepath.Join(n.dir, "nvidia-smi.xml")
	if err := os.WriteFile(xml, out.Bytes(), 0o644); err != nil {
		return err
	}
	n.smi = filepath.Join(n.dir, "nvidia-smi")
	return os.WriteFile(n.smi, []byte("#!/bin/sh\nexec cat "+xml+"\n"), 0o755)
}
