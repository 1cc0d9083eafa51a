package gpu

import "strings"

// What usually mends the driver failures that every source meets, so that each says it alike, at the end of its
// error: the user reads the error where the exporter logs it or ps and top print it.
const (
	// FixVersionMismatch mends a user-space driver (libnvidia-ml.so.1, nvidia-smi) newer than the loaded kernel
	// module: a driver upgraded without a reboot, or a container whose driver libraries are not the node's.
	FixVersionMismatch = "the driver was upgraded while its old kernel module is still loaded: " +
		"reboot the node, or reload the nvidia kernel module with no GPU process running; " +
		"in a container, mount the node's own driver libraries, as the NVIDIA container toolkit does"
	// FixDriverNotLoaded mends a node whose NVIDIA kernel module is not loaded.
	FixDriverNotLoaded = "load the NVIDIA kernel module (modprobe nvidia) or install the driver; where a driver " +
		"installer runs as a pod (GKE, the GPU operator), wait for it"
)

// DriverFix is the fix for a driver's own message (nvidia-smi's), or "" when it is none of the known failures.
func DriverFix(message string) string {
	switch {
	case strings.Contains(message, "Driver/library version mismatch"):
		return FixVersionMismatch
	case strings.Contains(message, "couldn't communicate with the NVIDIA driver"):
		return FixDriverNotLoaded
	}
	return ""
}
