package drm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Drivers are the DRM drivers this source reads, with their vendor as the vendor label names it. nvidia-drm is
// not one: NVML or nvidia-smi read NVIDIA's GPUs, with more than its fdinfo has, and a mixed node serves them from
// there once.
var Drivers = map[string]string{"amdgpu": gpu.VendorAMD, "i915": gpu.VendorIntel, "xe": gpu.VendorIntel}

// device is one GPU as sysfs shows it: what does not change while it is bound to its driver, found once.
type device struct {
	card    string // card1
	minor   int    // of /dev/dri/card<minor>
	render  int    // minor of /dev/dri/renderD<render>; -1 when it has none
	pci     string // 0000:05:00.0
	driver  string // amdgpu, i915, xe
	vendor  string // amd, intel
	dir     string // <sysfs>/class/drm/card1/device: the PCI device's directory
	cardDir string // <sysfs>/class/drm/card1
	hwmon   string // the device's hwmon directory; "" when it has none
	name    string
	uuid    string
	version string // the driver's version: the module's, else the kernel's release
	paths   map[attrKey]string
}

type attrKey struct{ dir, name string }

// path is filepath.Join(dir, name), joined once per device: a reading reads a few dozen attributes of each.
func (d *device) path(dir, name string) string {
	k := attrKey{dir, name}
	if p, ok := d.paths[k]; ok {
		return p
	}
	if d.paths == nil {
		d.paths = make(map[attrKey]string)
	}
	p := filepath.Join(dir, name)
	d.paths[k] = p
	return p
}

// maxCards bounds the entries of /sys/class/drm read: a card, its connectors and render node each have one, a few
// dozen on the largest nodes.
const maxCards = 4096

// discover lists the DRM devices of the drivers this source reads, sorted by PCI address. known are the devices
// found before, by card name, which are reused while the card still names the same PCI device.
func discover(f *files, sysfs, procfs string, known map[string]*device) ([]*device, error) {
	names, _, err := dirNames(filepath.Join(sysfs, "class", "drm"), maxCards)
	if err != nil {
		return nil, fmt.Errorf("listing DRM devices: %w", err)
	}
	return discoverCards(f, sysfs, procfs, names, known), nil
}

// discoverCards finds the devices of the cards and render nodes named in /sys/class/drm.
func discoverCards(f *files, sysfs, procfs string, names []string, known map[string]*device) []*device {
	class := filepath.Join(sysfs, "class", "drm")
	renders := make(map[string]int) // PCI address → render node minor
	var cards []string
	for _, n := range names {
		if minor, ok := numbered(n, "renderD"); ok {
			if pci, ok := pciOf(filepath.Join(class, n, "device")); ok {
				renders[pci] = minor
			}
		} else if _, ok := numbered(n, "card"); ok {
			cards = append(cards, n)
		}
	}
	var devs []*device
	for _, card := range cards {
		cardDir := filepath.Join(class, card)
		pci, ok := pciOf(filepath.Join(cardDir, "device"))
		if !ok {
			continue // not a PCI device: a virtual card, or an AMD compute partition (amdgpu_xcp)
		}
		if d := known[card]; d != nil && d.pci == pci {
			d.render = renderOf(renders, pci)
			devs = append(devs, d)
			continue
		}
		driver := driverOf(cardDir)
		vendor, ours := Drivers[driver]
		if !ours {
			continue
		}
		minor, _ := numbered(card, "card")
		d := &device{card: card, minor: minor, render: renderOf(renders, pci), pci: pci, driver: driver,
			vendor: vendor, dir: filepath.Join(cardDir, "device"), cardDir: cardDir}
		d.identify(f, sysfs, procfs)
		devs = append(devs, d)
	}
	slices.SortFunc(devs, func(a, b *device) int { return strings.Compare(a.pci, b.pci) })
	return devs
}

func renderOf(renders map[string]int, pci string) int {
	if r, ok := renders[pci]; ok {
		return r
	}
	return -1
}

// identify reads what names the device: its model, a stable UUID, its hwmon directory and driver version.
func (d *device) identify(f *files, sysfs, procfs string) {
	if hw, _, err := dirNames(filepath.Join(d.dir, "hwmon"), 16); err == nil {
		slices.Sort(hw)
		for _, h := range hw {
			if _, ok := numbered(h, "hwmon"); ok {
				d.hwmon = filepath.Join(d.dir, "hwmon", h)
				break
			}
		}
	}
	vendorID, _ := f.text(filepath.Join(d.dir, "vendor"))
	deviceID, _ := f.text(filepath.Join(d.dir, "device"))
	// amdgpu's product_name comes from the board's FRU EEPROM, which not every board has.
	if name, err := f.text(filepath.Join(d.dir, "product_name")); err == nil && validValue([]byte(name)) {
		d.name = name
	} else {
		d.name = fmt.Sprintf("%s GPU %s:%s", vendorNames[d.vendor], strings.TrimPrefix(vendorID, "0x"),
			strings.TrimPrefix(deviceID, "0x"))
	}
	// amdgpu's unique_id is a 64-bit ID the driver reads from the GPU (Vega and later); Intel's drivers publish
	// none, and then the PCI address, stable while the GPU stays in its slot, names it.
	if id, err := f.text(filepath.Join(d.dir, "unique_id")); err == nil && isHex(id) {
		d.uuid = "GPU-" + strings.ToLower(id)
	} else {
		d.uuid = "PCI-" + d.pci
	}
	if v, err := f.text(filepath.Join(sysfs, "module", d.driver, "version")); err == nil && validValue([]byte(v)) {
		d.version = v
	} else if v, err := f.text(filepath.Join(procfs, "sys", "kernel", "osrelease")); err == nil && validValue([]byte(v)) {
		d.version = v
	}
}

var vendorNames = map[string]string{gpu.VendorAMD: "AMD", gpu.VendorIntel: "Intel"}

// pciOf resolves a device link to its PCI address; false when it is not a PCI device.
func pciOf(link string) (string, bool) {
	target, err := filepath.EvalSymlinks(link)
	if err != nil {
		return "", false
	}
	return gpu.ParsePCIBusID(filepath.Base(target))
}

// driverOf returns the driver a DRM card's device is bound to: the name of the directory its driver link resolves
// to, <sysfs>/bus/<bus>/drivers/<name>; "" for none, a link that leads nowhere (a device being unbound, a copy of
// sysfs), or one that leads elsewhere than to a driver's directory. The link's last element alone says nothing.
func driverOf(cardDir string) string {
	target, err := filepath.EvalSymlinks(filepath.Join(cardDir, "device", "driver"))
	if err != nil || filepath.Base(filepath.Dir(target)) != "drivers" {
		return ""
	}
	if fi, err := os.Stat(target); err != nil || !fi.IsDir() {
		return ""
	}
	return filepath.Base(target)
}

// numbered reads names such as card1 and renderD128.
func numbered(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || rest == "" || len(rest) > 6 || strings.TrimLeft(rest, "0123456789") != "" {
		return 0, false
	}
	n, _ := strconv.Atoi(rest)
	return n, true
}

func isHex(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, ch := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", ch) {
			return false
		}
	}
	return true
}

// NVIDIAGPUs counts the NVIDIA GPUs on the PCI bus (vendor 0x10de, class VGA or 3D controller; not NVSwitches),
// whether or not their driver is loaded: on a node with GPUs of both kinds, the DRM source numbers its GPUs after
// them.
func NVIDIAGPUs(sysfs string) int {
	var f files
	dir := filepath.Join(sysfs, "bus", "pci", "devices")
	names, _, _ := dirNames(dir, 1<<16)
	n := 0
	for _, name := range names {
		vendor, _ := f.text(filepath.Join(dir, name, "vendor"))
		class, _ := f.text(filepath.Join(dir, name, "class"))
		if vendor == "0x10de" && (strings.HasPrefix(class, "0x0300") || strings.HasPrefix(class, "0x0302")) {
			n++
		}
	}
	return n
}
