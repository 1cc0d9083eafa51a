package e2eutil

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// StubNVML builds the NVML source's stub libnvidia-ml.so.1 (internal/gpu/nvml/testdata/stubnvml: a current
// driver, GPUs GPU-stub-0 and GPU-stub-1) against go-nvml's nvml.h into dir, and returns its path.
func StubNVML(t testing.TB, dir string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("finding go-nvml's module directory: %v", err)
	}
	lib := filepath.Join(dir, "libnvidia-ml.so.1")
	cc := exec.Command("gcc", "-std=c11", "-shared", "-fPIC", "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1",
		"-I", filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml"), "-o", lib,
		filepath.Join(RepoRoot(), "internal/gpu/nvml/testdata/stubnvml/libnvidia-ml.c"))
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("building the stub NVML library: %v\n%s", err, out)
	}
	return lib
}
