package procfs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// IsProcFS reports whether path is the root of a proc filesystem (statfs magic PROC_SUPER_MAGIC), so that a
// --path.procfs pointing at an ordinary directory is noticed at startup rather than read as the node's processes.
func IsProcFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Type == unix.PROC_SUPER_MAGIC, nil
}
