package gpu

import (
	"fmt"
	"strconv"
	"strings"
)

// ParsePCIBusID reads a PCI address, domain:bus:device.function, in any of the forms the sources and device
// plugins write (NVML's and nvidia-smi's 00000000:18:00.0, the kernel's 0000:18:00.0, upper or lower case), and
// returns it in the kernel's form, lower case with a 4-digit domain where the domain fits, so that one GPU's
// addresses compare equal whoever wrote them.
func ParsePCIBusID(s string) (string, bool) {
	domain, rest, ok := strings.Cut(s, ":")
	if !ok || len(domain) < 4 || len(domain) > 8 {
		return "", false
	}
	bus, rest, ok := strings.Cut(rest, ":")
	if !ok || len(bus) != 2 {
		return "", false
	}
	dev, fn, ok := strings.Cut(rest, ".")
	if !ok || len(dev) != 2 || len(fn) != 1 {
		return "", false
	}
	d, err1 := strconv.ParseUint(domain, 16, 32)
	b, err2 := strconv.ParseUint(bus, 16, 8)
	v, err3 := strconv.ParseUint(dev, 16, 8)
	f, err4 := strconv.ParseUint(fn, 8, 8)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || v > 0x1f || f > 7 {
		return "", false
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", d, b, v, f), true
}
