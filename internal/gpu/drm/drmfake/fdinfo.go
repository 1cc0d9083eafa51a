package drmfake

import (
	"fmt"
	"strings"
)

// The fdinfo of each driver as the kernel prints it: drm_show_fdinfo (drivers/gpu/drm/drm_file.c) prints
// drm-driver, drm-client-id and drm-pdev, then the driver's own keys; drm_print_memory_stats prints a region's
// total and shared, then active, resident and purgeable where the driver supports them, each through
// drm_fdinfo_print_size (bytes, or KiB or MiB where the size is a whole number of them).

// size writes a memory key as drm_fdinfo_print_size does.
func size(b *strings.Builder, key string, n uint64) {
	unit := ""
	for _, u := range []string{" KiB", " MiB"} {
		if n == 0 || n%1024 != 0 {
			break
		}
		n, unit = n/1024, u
	}
	fmt.Fprintf(b, "%s:\t%d%s\n", key, n, unit)
}

func common(b *strings.Builder, driver, pdev string, id uint64) {
	fdinfoHeader(b)
	fmt.Fprintf(b, "drm-driver:\t%s\ndrm-client-id:\t%d\ndrm-pdev:\t%s\n", driver, id, pdev)
}

// AMDGPUClient is an amdgpu client's memory (bytes resident per region) and engine busy times (ns, by the names
// of amdgpu_fdinfo.c's amdgpu_ip_name; amdgpu prints only engines the client used).
type AMDGPUClient struct {
	PDev       string
	ID         uint64
	VRAM, GTT  uint64
	EnginesNS  map[string]uint64
	EngineList []string // the order of EnginesNS's engines, as amdgpu prints them (IP order)
}

// FDInfo prints the client as amdgpu_show_fdinfo (amdgpu_fdinfo.c) does: pasid, every placement's stats (resident
// and purgeable supported), the legacy drm-memory- keys (with amdgpu's stray space before the tab of gtt and cpu),
// amd-* keys, then each engine the client used.
func (c AMDGPUClient) FDInfo() string {
	var b strings.Builder
	common(&b, "amdgpu", c.PDev, c.ID)
	b.WriteString("pasid:\t32770\n")
	for _, r := range []struct {
		name string
		n    uint64
	}{{"vram", c.VRAM}, {"gtt", c.GTT}, {"cpu", 0}, {"gds", 0}, {"gws", 0}, {"oa", 0}, {"doorbell", 0}, {"mmioremap", 0}} {
		size(&b, "drm-total-"+r.name, r.n)
		size(&b, "drm-shared-"+r.name, 0)
		size(&b, "drm-resident-"+r.name, r.n)
		size(&b, "drm-purgeable-"+r.name, 0)
	}
	fmt.Fprintf(&b, "drm-memory-vram:\t%d KiB\ndrm-memory-gtt: \t%d KiB\ndrm-memory-cpu: \t0 KiB\n", c.VRAM/1024, c.GTT/1024)
	fmt.Fprintf(&b, "amd-evicted-vram:\t0 KiB\namd-requested-vram:\t%d KiB\namd-requested-gtt:\t%d KiB\n", c.VRAM/1024, c.GTT/1024)
	for _, e := range c.EngineList {
		if ns := c.EnginesNS[e]; ns > 0 {
			fmt.Fprintf(&b, "drm-engine-%s:\t%d ns\n", e, ns)
		}
	}
	return b.String()
}

// XeClient is an xe client's memory and per-class cycles (xe_drm_client.c).
type XeClient struct {
	PDev      string
	ID        uint64
	VRAM, GTT uint64 // resident in vram0 and gtt
	// Cycles are drm-cycles-<class>, by class; Total is drm-total-cycles-, one GPU timestamp for every class.
	Cycles   map[string]uint64
	Total    uint64
	Capacity map[string]int // engines per class; 1 when absent
}

// xeClasses are xe's engine classes in the order show_run_ticks prints them (xe_hw_engine_class_to_str).
var xeClasses = []string{"rcs", "bcs", "vcs", "vecs", "ccs"}

// FDInfo prints the client as xe_drm_client_fdinfo does: show_meminfo's regions (system with purgeable; gtt,
// vram0 and stolen with active and resident), then show_run_ticks's cycles, total cycles and capacities.
func (c XeClient) FDInfo() string {
	var b strings.Builder
	common(&b, "xe", c.PDev, c.ID)
	size(&b, "drm-total-system", 0)
	size(&b, "drm-shared-system", 0)
	size(&b, "drm-active-system", 0)
	size(&b, "drm-resident-system", 0)
	size(&b, "drm-purgeable-system", 0)
	for _, r := range []struct {
		name string
		n    uint64
	}{{"gtt", c.GTT}, {"vram0", c.VRAM}, {"stolen", 0}} {
		size(&b, "drm-total-"+r.name, r.n)
		size(&b, "drm-shared-"+r.name, 0)
		size(&b, "drm-active-"+r.name, 0)
		size(&b, "drm-resident-"+r.name, r.n)
	}
	for _, class := range xeClasses {
		fmt.Fprintf(&b, "drm-cycles-%s:\t%d\ndrm-total-cycles-%s:\t%d\n", class, c.Cycles[class], class, c.Total)
		if n := c.Capacity[class]; n > 1 {
			fmt.Fprintf(&b, "drm-engine-capacity-%s:\t%d\n", class, n)
		}
	}
	return b.String()
}

// I915Client is an i915 client's memory and per-class busy time (i915_drm_client.c).
type I915Client struct {
	PDev      string
	ID        uint64
	Local     uint64            // resident in local0 (discrete GPUs)
	EnginesNS map[string]uint64 // by uabi class name: render, copy, video, video-enhance, compute
	Capacity  map[string]int
}

// FDInfo prints the client as i915_drm_client_fdinfo does: each memory region's stats (resident and purgeable
// supported), then every engine class the GPU has, with its capacity where above one.
func (c I915Client) FDInfo() string {
	var b strings.Builder
	common(&b, "i915", c.PDev, c.ID)
	for _, r := range []struct {
		name string
		n    uint64
	}{{"system0", 0}, {"local0", c.Local}, {"stolen-local0", 0}} {
		size(&b, "drm-total-"+r.name, r.n)
		size(&b, "drm-shared-"+r.name, 0)
		size(&b, "drm-resident-"+r.name, r.n)
		size(&b, "drm-purgeable-"+r.name, 0)
	}
	for _, class := range []string{"render", "copy", "video", "video-enhance", "compute"} {
		fmt.Fprintf(&b, "drm-engine-%s:\t%d ns\n", class, c.EnginesNS[class])
		if n := c.Capacity[class]; n > 1 {
			fmt.Fprintf(&b, "drm-engine-capacity-%s:\t%d\n", class, n)
		}
	}
	return b.String()
}
