//go:build !linux

package procfs

// IsProcFS reports false: only Linux has the proc filesystem the exporter reads. A tree given as --path.procfs
// elsewhere (a copy, for a test) is read with the warning that it is not one.
func IsProcFS(string) (bool, error) { return false, nil }
