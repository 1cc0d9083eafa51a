package drm

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

func readCorpus(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "fdinfo", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Each file of the corpus (testdata/SOURCES.md) parses to what its driver printed.
func TestParseFDInfoCorpus(t *testing.T) {
	for _, c := range []struct {
		file     string
		driver   string
		pdev     string
		id       uint64
		engines  []Engine
		resident map[string]uint64
	}{
		{
			file: "xe-kernel-doc.txt", driver: "xe", pdev: "0000:03:00.0", id: 3,
			engines: []Engine{
				{Name: "rcs", Cycles: 28257900, HasCycles: true, TotalCycles: 7655183225, HasTotalCycles: true},
				{Name: "bcs", HasCycles: true, TotalCycles: 7655183225, HasTotalCycles: true},
				{Name: "vcs", HasCycles: true, TotalCycles: 7655183225, HasTotalCycles: true, Capacity: 2},
				{Name: "vecs", HasCycles: true, TotalCycles: 7655183225, HasTotalCycles: true, Capacity: 2},
				{Name: "ccs", HasCycles: true, TotalCycles: 7655183225, HasTotalCycles: true, Capacity: 4},
			},
			resident: map[string]uint64{"system": 0, "gtt": 192 << 10, "vram0": 23992 << 10, "stolen": 0},
		},
		{
			file: "i915-proc-man-page.txt", driver: "i915", pdev: "0000:00:02.0", id: 39,
			engines: []Engine{
				{Name: "render", BusyNS: 346249, HasBusyNS: true}, {Name: "copy", HasBusyNS: true},
				{Name: "video", HasBusyNS: true, Capacity: 2}, {Name: "video-enhance", HasBusyNS: true},
			},
			resident: map[string]uint64{"system0": 6044 << 10, "stolen-system0": 0},
		},
		{
			file: "i915-dri-devel-2022.txt", driver: "i915", pdev: "0000:00:02.0", id: 22,
			engines: []Engine{
				{Name: "render", BusyNS: 196329331, HasBusyNS: true}, {Name: "copy", HasBusyNS: true},
				{Name: "video", HasBusyNS: true, Capacity: 2}, {Name: "video-enhance", HasBusyNS: true},
			},
			resident: map[string]uint64{},
		},
		{
			// drm-maxfreq- and drm-curfreq- are read by no one here; a non-PCI device has no drm-pdev.
			file: "panfrost-kernel-doc.txt", driver: "panfrost", id: 14,
			engines: []Engine{
				{Name: "fragment", BusyNS: 1846584880, HasBusyNS: true, Cycles: 1424359409, HasCycles: true},
				{Name: "vertex-tiler", BusyNS: 71932239, HasBusyNS: true, Cycles: 52617357, HasCycles: true},
			},
			resident: map[string]uint64{"memory": 36496 << 10},
		},
		{
			// Before drm_show_fdinfo: the driver printed the identity after pasid; the legacy keys only, with
			// the stray space before the tab of gtt and cpu, which the document's whitespace rule absorbs.
			file: "amdgpu-6.4.txt", driver: "amdgpu", pdev: "0000:0c:00.0", id: 4712,
			engines: []Engine{
				{Name: "gfx", BusyNS: 5603271648, HasBusyNS: true}, {Name: "compute", BusyNS: 44000, HasBusyNS: true},
				{Name: "dec", BusyNS: 1200000, HasBusyNS: true},
			},
			resident: map[string]uint64{"vram": 1 << 30, "gtt": 16 << 20, "cpu": 0},
		},
		{
			// drm-resident- and its alias drm-memory- both: one value per region.
			file: "amdgpu-6.12.txt", driver: "amdgpu", pdev: "0000:0c:00.0", id: 4712,
			engines: []Engine{
				{Name: "gfx", BusyNS: 5603271648, HasBusyNS: true}, {Name: "compute", BusyNS: 44000, HasBusyNS: true},
			},
			resident: map[string]uint64{"vram": 1049600 << 10, "gtt": 16 << 20, "cpu": 0},
		},
	} {
		t.Run(c.file, func(t *testing.T) {
			got, err := ParseFDInfo(readCorpus(t, c.file))
			if err != nil {
				t.Fatal(err)
			}
			if got.Driver != c.driver || got.PDev != c.pdev || !got.HasID || got.ID != c.id {
				t.Errorf("identity: driver %q pdev %q id %d (%v)", got.Driver, got.PDev, got.ID, got.HasID)
			}
			if !reflect.DeepEqual(got.Engines, c.engines) {
				t.Errorf("engines\n got %+v\nwant %+v", got.Engines, c.engines)
			}
			resident := make(map[string]uint64)
			for _, r := range got.Regions {
				if r.HasResident {
					resident[r.Name] = r.Resident
				}
			}
			if !reflect.DeepEqual(resident, c.resident) {
				t.Errorf("resident memory %v, want %v", resident, c.resident)
			}
		})
	}
}

// The format's rules, one line each: units by key type, whitespace, unknown keys, malformed values.
func TestParseFDInfoRules(t *testing.T) {
	parse := func(lines ...string) Client {
		t.Helper()
		c, err := ParseFDInfo([]byte("drm-driver:\tx\n" + strings.Join(lines, "\n") + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	mem := func(c Client, region string) (uint64, bool) {
		r, ok := c.Region(region)
		return r.Resident, ok && r.HasResident
	}
	for _, tc := range []struct {
		line string
		want uint64
		ok   bool
	}{
		{"drm-resident-vram:\t5", 5, true},
		{"drm-resident-vram: 5 KiB", 5 << 10, true},
		{"drm-resident-vram:5 MiB", 5 << 20, true},
		{"drm-resident-vram:\t 5\tMiB ", 5 << 20, true},
		{"drm-resident-vram:\t5 GiB", 0, false}, // not a unit of the document
		{"drm-resident-vram:\t5 kB", 0, false},
		{"drm-resident-vram:\t-5", 0, false},
		{"drm-resident-vram:\t5.5 MiB", 0, false},
		{"drm-resident-vram:\t18446744073709551615", 18446744073709551615, true},
		{"drm-resident-vram:\t18446744073709551615 KiB", 0, false}, // overflows once scaled
		{"drm-resident-vram:\t18446744073709551616", 0, false},
		{"drm-resident-vram:", 0, false},
		{"drm-resident vram:\t5", 0, false}, // whitespace in a key
		{"resident-vram:\t5", 0, false},     // not prefixed drm-
		{"drm-resident-:\t5", 0, false},     // no region name
	} {
		got, ok := mem(parse(tc.line), "vram")
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
	c := parse("drm-engine-gfx:\t100 ns", "drm-engine-dma:\t100", "drm-engine-dec:\t100 us", "drm-engine-capacity-gfx:\t0")
	if e, _ := c.Engine("gfx"); !e.HasBusyNS || e.BusyNS != 100 || e.Capacity != 0 {
		t.Errorf("gfx %+v: want 100 ns, capacity unset (0 is not allowed)", e)
	}
	if e, ok := c.Engine("dma"); ok && e.HasBusyNS {
		t.Errorf("an engine time without its ns unit was read: %+v", e)
	}
	if e, ok := c.Engine("dec"); ok && e.HasBusyNS {
		t.Errorf("an engine time in another unit was read: %+v", e)
	}
	c = parse("drm-client-id:\t7", "drm-client-id:\t8", "drm-resident-vram:\t1", "drm-resident-vram:\t2")
	if r, _ := mem(c, "vram"); c.ID != 7 || r != 1 {
		t.Errorf("repeated keys: id %d, vram %d; want the first of each", c.ID, r)
	}
	if c := parse("drm-pdev:\tnot-a-pci-address"); c.PDev != "" {
		t.Errorf("pdev %q from a malformed address", c.PDev)
	}
	if c := parse("drm-pdev:\t0000:0C:00.0"); c.PDev != "0000:0c:00.0" {
		t.Errorf("pdev %q, want the kernel's lower case", c.PDev)
	}
	if _, err := ParseFDInfo([]byte("pos:\t0\nflags:\t02\nmnt_id:\t5\n")); err == nil {
		t.Error("a file without drm-driver parsed")
	}
}

// The parser keeps no more than its bounds of engines and regions, however many a file names.
func TestParseFDInfoBounds(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("drm-driver:\tx\n")
	for i := range 1000 {
		b.WriteString("drm-engine-e" + itoa(i) + ":\t1 ns\ndrm-resident-r" + itoa(i) + ":\t1\n")
	}
	c, err := ParseFDInfo(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Engines) != maxEngines || len(c.Regions) != maxRegions {
		t.Errorf("%d engines, %d regions; want at most %d and %d", len(c.Engines), len(c.Regions), maxEngines, maxRegions)
	}
}

func FuzzParseFDInfo(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "fdinfo", "*.txt"))
	if err != nil || len(files) == 0 {
		f.Fatal("no corpus", err)
	}
	for _, name := range files {
		f.Add(readCorpus(f, filepath.Base(name)))
	}
	f.Add([]byte("drm-driver:\tamdgpu\ndrm-engine-capacity-:\t3\ndrm-total-cycles-:\t1\ndrm-cycles-\t:2\n:::\n"))
	prior := [][]byte{readCorpus(f, "xe-kernel-doc.txt"), readCorpus(f, "amdgpu-6.12.txt")}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseFDInfo(b)
		// Parsed again into a client that held another file's, as a reading does, it reads the same.
		for _, p := range prior {
			var again Client
			if err := again.parse(p); err != nil {
				t.Fatal(err)
			}
			againErr := again.parse(b)
			if (err == nil) != (againErr == nil) || err == nil && !sameClient(again, c) {
				t.Fatalf("parsed after another file:\n%+v (%v)\nparsed anew:\n%+v (%v)", again, againErr, c, err)
			}
		}
		if err != nil {
			return
		}
		if !validValue([]byte(c.Driver)) || len(c.Engines) > maxEngines || len(c.Regions) > maxRegions {
			t.Fatalf("out of bounds: %+v", c)
		}
		names := make(map[string]bool)
		for _, e := range c.Engines {
			if !validName([]byte(e.Name)) || names["e"+e.Name] {
				t.Fatalf("engine name %q invalid or repeated", e.Name)
			}
			names["e"+e.Name] = true
		}
		for _, r := range c.Regions {
			if !validName([]byte(r.Name)) || names["r"+r.Name] {
				t.Fatalf("region name %q invalid or repeated", r.Name)
			}
			names["r"+r.Name] = true
		}
		// Lines that are not drm- keys change nothing.
		noise := append([]byte("pos:\t0\nflags:\t02\npasid:\t1\namd-evicted-vram:\t0 KiB\ndrm foo:\t1\n"), b...)
		if again, err := ParseFDInfo(noise); err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("other keys changed the result:\n%+v\n%+v (%v)", c, again, err)
		}
	})
}

// sameClient is reflect.DeepEqual with no engines or regions the same as an empty list of them.
func sameClient(a, b Client) bool {
	if len(a.Engines) == 0 && len(b.Engines) == 0 {
		a.Engines, b.Engines = nil, nil
	}
	if len(a.Regions) == 0 && len(b.Regions) == 0 {
		a.Regions, b.Regions = nil, nil
	}
	return reflect.DeepEqual(a, b)
}

// canonicalPCI's fast path agrees with gpu.ParsePCIBusID wherever it is taken.
func FuzzCanonicalPCI(f *testing.F) {
	for _, s := range []string{"0000:05:00.0", "0000:c1:1f.7", "0000:C1:00.0", "0000:05:20.0", "0000:05:00.8",
		"10000:05:00.0", "0000:05:00.0 ", "0000:g5:00.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !canonicalPCI([]byte(s)) {
			return
		}
		if got, ok := gpu.ParsePCIBusID(s); !ok || got != s {
			t.Errorf("canonicalPCI(%q), but ParsePCIBusID gives %q, %v", s, got, ok)
		}
	})
}
