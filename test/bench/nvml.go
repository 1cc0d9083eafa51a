package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvml/stubnvml"
)

// An NVML benchmark node: the binary's NVML source on the tests' stub libnvidia-ml (two H100s on R580, here
// eight), loaded through go-nvml's real dlopen path, whose process lists deal the node's processes round robin over
// the GPUs, as the other nodes spread theirs, in the same pods (cgroups). The stub answers each call from memory:
// what it measures is the NVML source's side of the calls (cgo, go-nvml, the source), not the driver's.

// stubPID is the i-th process's PID in the stub's lists.
func stubPID(i int) int { return stubnvml.FirstPID + i }

func newNVMLNode(dir string, gpus, pids int) (*node, error) {
	n := &node{dir: dir, procfs: filepath.Join(dir, "proc"), gpus: gpus, pids: pids, pidOf: stubPID}
	if err := n.writeProcfs(); err != nil {
		return nil, err
	}
	libDir := filepath.Join(dir, "lib")
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		return nil, err
	}
	if _, err := stubnvml.H100R580.BuildIn(libDir); err != nil {
		return nil, err
	}
	n.env = []string{"LD_LIBRARY_PATH=" + libDir, "STUB_NVML_GPUS=" + strconv.Itoa(gpus),
		"STUB_NVML_PROCESSES=" + strconv.Itoa(pids), "STUB_NVML_SPREAD=1"}
	if gpus < 2 || gpus > 8 {
		return nil, fmt.Errorf("the stub library has 2 to 8 GPUs, not %d", gpus)
	}
	return n, nil
}
