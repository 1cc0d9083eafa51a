package view

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// The cells that ps and top write alike.

// Memory is an amount of GPU memory in at most 8 columns: "512 MiB" below a GiB, "22.0 GiB" below 100 GiB,
// "581 GiB" below a TiB, "1.2 TiB" and "128 TiB" above; "-" when unknown.
func Memory(v gpu.Value) string {
	if !v.Valid {
		return "-"
	}
	const mib, gib, tib = 1 << 20, 1 << 30, 1 << 40
	b := v.V
	switch {
	case b < gib:
		return fmt.Sprintf("%.0f MiB", min(b/mib, 1023))
	case b < 100*gib:
		return fmt.Sprintf("%.1f GiB", b/gib)
	case b < 999.5*gib:
		return fmt.Sprintf("%.0f GiB", b/gib)
	case b < 99.95*tib:
		return fmt.Sprintf("%.1f TiB", max(b/tib, 1))
	}
	return fmt.Sprintf("%.0f TiB", min(b/tib, 9999))
}

// MemoryPair is used and total memory in whole GiB, "39/80G", or TiB from 10,000 GiB, "12/20T"; "-" when either
// is unknown.
func MemoryPair(used, total gpu.Value) string {
	if !used.Valid || !total.Valid {
		return "-"
	}
	if total.V >= 10000*(1<<30) {
		return fmt.Sprintf("%.0f/%.0fT", used.V/(1<<40), total.V/(1<<40))
	}
	return fmt.Sprintf("%.0f/%.0fG", used.V/(1<<30), total.V/(1<<30))
}

// Percent is a ratio as a whole percentage, "41%"; "-" when unknown.
func Percent(v gpu.Value) string {
	if !v.Valid {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", math.Round(v.V*100))
}

// Age writes a duration in its two largest units: "45s", "12m", "3h20m", "18h", "2d4h", "13d".
func Age(d time.Duration) string {
	d = max(d, 0)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 24*time.Hour && int(d.Minutes())%60 == 0:
		return fmt.Sprintf("%dh", int(d.Hours()))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	case int(d.Hours())%24 == 0:
		return fmt.Sprintf("%dd", int(d.Hours())/24)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// AgeAt is how long a process started at started has run at a reading; "-" when either is unknown.
func AgeAt(started, at time.Time) string {
	if started.IsZero() || at.IsZero() {
		return "-"
	}
	return Age(at.Sub(started))
}

// Plural counts things: "1 GPU", "8 GPUs", "14 processes".
func Plural(n int, what string) string {
	switch {
	case n == 1 || what == "series":
		return fmt.Sprintf("%d %s", n, what)
	case strings.HasSuffix(what, "s"):
		return fmt.Sprintf("%d %ses", n, what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}
