package main

import (
	"os"
	"path/filepath"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/users"
)

// processUserFlags look up each process's owner: the user label of process and workload series, and the USER of
// ps and top.
type processUserFlags struct {
	enabled, set bool
	rootfs       string
	demo         *bool // --demo, on which users are looked up unless asked not to
}

func (f *processUserFlags) register(cmd flagHost) {
	cmd.Flag("collector.process-user", "Look up each process's owner, its user name (or uid): user on process and "+
		"workload series, USER in ps and top. User names can be personal data; off by default, on with --demo (whose "+
		"users are made up).").
		IsSetByUser(&f.set).BoolVar(&f.enabled)
	cmd.Flag("path.rootfs", "The node's root filesystem, whose etc/passwd names process owners for "+
		"--collector.process-user; /host when running in a container.").Default("/").StringVar(&f.rootfs)
}

// on reports whether users are looked up: when asked, and on the demo node unless asked not to.
func (f *processUserFlags) on() bool { return f.enabled || *f.demo && !f.set }

func (f *processUserFlags) passwd() string { return filepath.Join(f.rootfs, "etc", "passwd") }

// check fails when --path.rootfs is not a directory and users are looked up.
func (f *processUserFlags) check() error {
	if !f.on() {
		return nil
	}
	fi, err := os.Stat(f.rootfs)
	if err != nil {
		return flagError("path.rootfs", "%v", err)
	}
	if !fi.IsDir() {
		return flagError("path.rootfs", "%s is not a directory", f.rootfs)
	}
	return nil
}

// warnings: a user database that cannot be read leaves every user a uid. The demo's users are preset.
func (f *processUserFlags) warnings() []string {
	if !f.on() || *f.demo {
		return nil
	}
	if _, err := os.Stat(f.passwd()); err != nil {
		return []string{"--path.rootfs: cannot read the node's user database (" + err.Error() + "); process owners are shown as numeric uids"}
	}
	return nil
}

// resolver returns what names process owners.
func (f *processUserFlags) resolver(procfs string) attribution.UserResolver {
	return users.New(procfs, f.passwd())
}
