package e2eutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// WriteProc writes one process of a fake procfs under root: the files the exporter reads, comm, stat (with the
// name and a start time, which tells a process from a later one with the same PID) and cgroup.
func WriteProc(root string, pid uint32, comm, cgroup string) error {
	dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stat := fmt.Sprintf("%d (%s) S 1 %d %d 0 -1 4194560 100 0 0 0 5 1 0 0 20 0 1 0 %d 1000000 100 "+
		"18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n", pid, comm, pid, pid, 4242+uint64(pid))
	for name, content := range map[string]string{"comm": comm + "\n", "stat": stat, "cgroup": cgroup} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}
