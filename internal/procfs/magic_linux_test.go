package procfs

import (
	"path/filepath"
	"testing"
)

func TestIsProcFS(t *testing.T) {
	if ok, err := IsProcFS("/proc"); err != nil || !ok {
		t.Errorf("IsProcFS(/proc) = %v, %v; want true", ok, err)
	}
	if ok, err := IsProcFS(t.TempDir()); err != nil || ok {
		t.Errorf("IsProcFS(tempdir) = %v, %v; want false", ok, err)
	}
	if _, err := IsProcFS(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("IsProcFS(missing) gave no error")
	}
}
