package main

import (
	"github.com/KimMachineGun/automemlimit/memlimit"
)

// The Go runtime does not know a container's memory limit: without GOMEMLIMIT, a heap that grows toward the limit
// is collected only when it doubles, and the kernel's OOM killer comes first. GOMEMLIMIT is set to 90% of the
// cgroup's memory limit (v1 or v2), before anything allocates; with no limit it stays off. The environment decides
// otherwise: GOMEMLIMIT set by hand wins, AUTOMEMLIMIT=0.8 changes the ratio, AUTOMEMLIMIT=off turns this off.
// Nothing is logged: this runs before the flags choose a log format.
func init() {
	_, _ = memlimit.Set(memlimit.WithRatio(0.9))
}
