package drm

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
)

// Present finds the drivers of the GPUs --gpu.source=auto reads through DRM, under a --path.sysfs given as it is
// (relative to the working directory, too), by each card's PCI device and the driver it is bound to.
func TestPresent(t *testing.T) {
	dir, sysfs, _ := writeNode(t, drmfake.NewMI300X().Node(false))
	_, xeSysfs, _ := writeNode(t, drmfake.NewXe().Node(false, 1))
	want := func(got []string, want ...string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("Present: %q, want %q", got, want)
		}
	}
	want(Present(sysfs), "amdgpu")
	want(Present(xeSysfs), "xe")
	want(Present(t.TempDir()))
	t.Chdir(dir)
	want(Present("sys"), "amdgpu")
	want(Present("./dev/../sys/"), "amdgpu")
	t.Chdir(filepath.Join(dir, "sys", "class"))
	want(Present(".."), "amdgpu")
}

// A card is one of an amdgpu, i915 or xe GPU when its device is bound to that driver, as its driver link resolves
// to the driver's directory: a link that leads nowhere (a driver unbound, a copied tree), or to a directory of the
// driver's name that is no driver's, does not make one; nor does a driver loaded with no device bound to it.
func TestPresentByDriverLink(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, sysfs, link string)
	}{
		{"dangling", func(t *testing.T, sysfs, link string) {
			relink(t, link, "../../../../bus/pci/drivers/amdgpu-gone/amdgpu")
		}},
		{"a module, not a driver", func(t *testing.T, sysfs, link string) {
			mod := filepath.Join(sysfs, "module", "amdgpu")
			if err := os.MkdirAll(mod, 0o755); err != nil {
				t.Fatal(err)
			}
			relink(t, link, mod)
		}},
		{"unbound", func(t *testing.T, sysfs, link string) {
			if err := os.Remove(link); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := drmfake.NewMI300X().Node(false)
			n.GPUs = n.GPUs[:1]
			_, sysfs, _ := writeNode(t, n)
			tc.change(t, sysfs, filepath.Join(sysfs, "class", "drm", "card1", "device", "driver"))
			if got := Present(sysfs); len(got) != 0 {
				t.Errorf("Present: %q, want none", got)
			}
			if _, err := New(Config{SysFS: sysfs, ProcFS: t.TempDir()}); err == nil {
				t.Error("New found a GPU")
			}
		})
	}
}

func relink(t *testing.T, link, target string) {
	t.Helper()
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
