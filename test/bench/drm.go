package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// A DRM benchmark node: drmfake's eight MI300X (sysfs, hwmon, KFD) and pids ROCm processes spread over them as the
// simulated node spreads its processes, each with a render node open among a few other files, an amdgpu DRM
// client's fdinfo and KFD's VRAM, in the same pods (cgroups) as the simulated node's; and others processes that use
// no GPU, with drmOtherFiles files each, which the drm source must look through as on a real node.

// drmOtherFiles is how many files each non-GPU process of a DRM node has open: sockets, pipes and logs.
const drmOtherFiles = 24

func newDRMNode(dir string, pids, others int) (*node, error) {
	mi := drmfake.NewMI300X()
	fake := mi.Node(false)
	fake.Processes = nil
	n := &node{dir: dir, gpus: len(mi.GPUs), pids: pids, pidOf: fakePID}
	for i := range pids {
		g := mi.GPUs[n.gpuOf(i)]
		const vram = 256 << 20
		client := drmfake.AMDGPUClient{PDev: g.PCI, ID: uint64(10000 + i), VRAM: vram + 2<<20, GTT: 8 << 20}
		fake.Processes = append(fake.Processes, drmfake.Process{PID: uint32(n.pidOf(i)), Other: 6,
			DRM: []drmfake.File{{Minor: g.Render, FDInfo: client.FDInfo()}}, KFD: map[uint64]uint64{g.KFDGPUID: vram}})
	}
	for i := range others {
		fake.Processes = append(fake.Processes, drmfake.Process{PID: uint32(otherPID(i)), Other: drmOtherFiles})
	}
	sysfs, procfs, err := fake.Write(dir)
	if err != nil {
		return nil, fmt.Errorf("writing the DRM node (run as root, for the device nodes): %w", err)
	}
	n.procfs, n.sysfs = procfs, sysfs
	if err := n.writeProcfs(); err != nil {
		return nil, err
	}
	for i := range others {
		if err := e2eutil.WriteProc(procfs, uint32(otherPID(i)), "sshd", "0::/system.slice/ssh.service\n"); err != nil {
			return nil, err
		}
	}
	return n, os.MkdirAll(filepath.Join(dir, "run"), 0o755)
}

// otherPID is the i-th non-GPU process's PID, below the GPU processes'.
func otherPID(i int) int { return 2000 + i }
