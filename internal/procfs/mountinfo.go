package procfs

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// WarnIfHidepid logs a warning when the proc filesystem at procfs is mounted with hidepid: then the processes of
// other users cannot be read, unless the exporter runs with CAP_SYS_PTRACE or in the mount's gid= group, and
// they look like processes that exited (no identity, procfs_errors_total{reason="exited"}). It reads
// <procfs>/self/mountinfo once; what it cannot read it leaves unsaid.
func WarnIfHidepid(procfs string, logger *slog.Logger) {
	b, err := os.ReadFile(filepath.Join(procfs, "self", "mountinfo"))
	if err != nil {
		return
	}
	if opt := hidepid(string(b), procfs); opt != "" {
		logger.Warn("procfs is mounted with "+opt+": GPU processes of other users look exited and get no identity "+
			"unless the exporter runs as root with CAP_SYS_PTRACE or in the mount's gid= group",
			"procfs", procfs)
	}
}

// hidepid returns the hidepid option ("hidepid=2", "hidepid=invisible") of the proc mount at mountPoint in a
// mountinfo file, or "" when it has none or is not listed. The last mount at that point is the visible one.
func hidepid(mountinfo, mountPoint string) string {
	mountPoint = filepath.Clean(mountPoint)
	if real, err := filepath.EvalSymlinks(mountPoint); err == nil {
		mountPoint = real
	}
	found := ""
	for _, line := range strings.Split(mountinfo, "\n") {
		// ID parent major:minor root mount-point mount-options [optional...] - fstype source super-options
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 6 || len(tail) < 1 || tail[0] != "proc" || unescapeMountinfo(fields[4]) != mountPoint {
			continue
		}
		found = ""
		opts := fields[5]
		if len(tail) >= 3 {
			opts += "," + tail[2]
		}
		for _, o := range strings.Split(opts, ",") {
			if v, ok := strings.CutPrefix(o, "hidepid="); ok && v != "0" && v != "off" {
				found = o
			}
		}
	}
	return found
}

// unescapeMountinfo undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
