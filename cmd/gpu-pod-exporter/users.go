package main

import (
	"log/slog"
	"os"
	"path/filepath"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/users"
)

// processUserFlags put the process owner's user name on process and workload series.
type processUserFlags struct {
	enabled, set bool
	rootfs       string
}

func registerProcessUser(serve flagGroup) *processUserFlags {
	f := &processUserFlags{}
	serve.Flag("collector.process-user", "Add user, the process owner's name (or uid), to process and workload series. "+
		"User names can be personal data; off by default, on with --demo (whose users are made up).").
		IsSetByUser(&f.set).BoolVar(&f.enabled)
	serve.Flag("path.rootfs", "The node's root filesystem, whose etc/passwd names process owners for "+
		"--collector.process-user; /host when running in a container.").Default("/").StringVar(&f.rootfs)
	return f
}

// on reports whether users are looked up: when asked, and on the demo node unless asked not to.
func (f *processUserFlags) on(demo bool) bool { return f.enabled || demo && !f.set }

// resolver returns what names process owners, warning once when the node's user database cannot be read (every
// user is then a uid).
func (f *processUserFlags) resolver(procfs string, logger *slog.Logger) attribution.UserResolver {
	passwd := filepath.Join(f.rootfs, "etc", "passwd")
	if _, err := os.Stat(passwd); err != nil {
		logger.Warn("cannot read the node's user database; process owners are shown as numeric uids", "err", err)
	}
	return users.New(procfs, passwd)
}
