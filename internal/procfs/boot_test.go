package procfs

import (
	"strings"
	"testing"
	"time"
)

func TestBootTime(t *testing.T) {
	stat := "cpu  4705 356 584 3699176 23060 0 277 0 0 0\ncpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0\n" +
		"intr 114930548 113199788 3 0 5 263 0 4 [... 256 more]\nctxt 1990473\nbtime 1062191376\nprocesses 2915\n"
	got, err := parseBootTime(strings.NewReader(stat))
	if err != nil || !got.Equal(time.Unix(1062191376, 0)) {
		t.Errorf("parseBootTime = %v, %v", got, err)
	}
	for _, bad := range []string{"cpu 1 2 3\n", "btime soon\n", "btime -5\n", ""} {
		if _, err := parseBootTime(strings.NewReader(bad)); err == nil {
			t.Errorf("parseBootTime(%q) gave no error", bad)
		}
	}
	if boot, err := BootTime("/proc"); err != nil || time.Since(boot) <= 0 || time.Since(boot) > 100*365*24*time.Hour {
		t.Errorf("BootTime(/proc) = %v, %v", boot, err)
	}
	boot := time.Unix(1000, 0)
	if got := Started(boot, 12345); !got.Equal(boot.Add(123450 * time.Millisecond)) {
		t.Errorf("Started(boot, 12345) = %v, want boot + 123.45 s", got)
	}
}
