package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/configfile"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/mixed"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvidiasmi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"
)

// The simulated node offers preset owners and allocations, which run finds by interface; a change of their
// signatures must not silently turn them off.
var (
	_ attribution.Preset = (*simulated.Source)(nil)
	_ allocationOffer    = (*simulated.Source)(nil)
)

// sourceFlags choose where GPU data comes from.
type sourceFlags struct {
	source          string
	sourceSet       bool
	simulatedConfig string
	demo            bool
	demoName        string // --demo=NAME: simulated.DemoNamed's
	smiPath         string
	smiPathSet      bool
	smiTimeout      time.Duration
	sysfs           string
	sysfsSet        bool
}

func (f *sourceFlags) register(app flagHost) {
	enumFlag(app, "gpu.source", "Where GPU data comes from: auto (NVML if libnvidia-ml.so.1 loads, else nvidia-smi; with NVML, "+
		"nvidia-smi where installed lists the processes NVML cannot; AMD and Intel GPUs through the kernel's DRM interfaces, "+
		"alone or next to NVIDIA's), nvml, nvidia-smi, drm (AMD and Intel GPUs only) or simulated.",
		"auto", &f.source, "auto", "nvml", "nvidia-smi", "drm", "simulated").IsSetByUser(&f.sourceSet)
	app.Flag("gpu.simulated-config", "Simulated node file (YAML); implies --gpu.source=simulated.").PlaceHolder("FILE").
		StringVar(&f.simulatedConfig)
	app.Flag("demo", "Run on a built-in simulated node with workloads, no GPU needed: --demo alone is NVIDIA GPUs, "+
		"--demo=amd eight AMD Instinct MI300X, --demo=mixed NVIDIA, AMD and Intel GPUs on one node; any other "+
		"--demo=NAME is a node of its own (its own GPUs, pods and faults), for a cluster of demo exporters.").
		PlaceHolder("NAME").SetValue(demoValue{&f.demo, &f.demoName})
	app.Flag("path.sysfs", "The host's sysfs, for the drm source's GPUs (/sys/class/drm, hwmon, KFD).").
		Default("/sys").IsSetByUser(&f.sysfsSet).StringVar(&f.sysfs)
	app.Flag("nvidia-smi.path", "nvidia-smi binary, for --gpu.source=nvidia-smi.").Default("nvidia-smi").
		IsSetByUser(&f.smiPathSet).StringVar(&f.smiPath)
	durationFlag(app, "nvidia-smi.timeout", "Deadline of one nvidia-smi run.", nvidiasmi.DefaultTimeout, &f.smiTimeout)
}

func (f *sourceFlags) warnings() []string { return nil }

// check validates the source flags: --demo is a source of its own, which no other may be asked for with; NVML must
// be built in to be asked for; a simulated node file must exist, and an nvidia-smi given as a path must be an
// executable file, so that "not executable" is not reported as "not found" at the first reading.
func (f *sourceFlags) check() error {
	switch {
	case f.demo && f.sourceSet && f.source != "simulated":
		return flagError("gpu.source", "%s conflicts with --demo, which reads the built-in simulated node: drop one of them", f.source)
	case f.simulatedConfig != "" && f.sourceSet && f.source != "simulated":
		return flagError("gpu.source", "%s conflicts with --gpu.simulated-config, which reads a simulated node: drop one of them", f.source)
	case f.demo && f.simulatedConfig != "":
		return flagError("gpu.simulated-config", "conflicts with --demo, which reads the built-in simulated node: drop one of them")
	case f.source == "simulated" && f.simulatedConfig == "" && !f.demo:
		return flagError("gpu.source", "simulated needs --gpu.simulated-config=FILE (or use --demo)")
	case f.source == "nvml" && withoutNVML != "":
		return flagError("gpu.source", "nvml: this binary was %s; use nvidia-smi, or build it on Linux with cgo", withoutNVML)
	}
	if f.sysfsSet || f.source == "drm" {
		if fi, err := os.Stat(f.sysfs); err != nil {
			return flagError("path.sysfs", "%v", err)
		} else if !fi.IsDir() {
			return flagError("path.sysfs", "%s is not a directory", f.sysfs)
		}
	}
	if f.simulatedConfig != "" {
		if err := configfile.Check(f.simulatedConfig, simulated.MaxFileBytes); err != nil {
			return flagError("gpu.simulated-config", "%v", err)
		}
	}
	if !f.smiPathSet || !strings.Contains(f.smiPath, "/") {
		return nil
	}
	fi, err := os.Stat(f.smiPath)
	switch {
	case err != nil:
		return flagError("nvidia-smi.path", "%v", err)
	case fi.IsDir():
		return flagError("nvidia-smi.path", "%s is a directory", f.smiPath)
	case fi.Mode().Perm()&0o111 == 0:
		return flagError("nvidia-smi.path", "%s is not executable (mode %s)", f.smiPath, fi.Mode().Perm())
	}
	return nil
}

// open opens the source the flags ask for; procRoot is the host's proc filesystem, where the drm source reads the
// processes' open DRM files.
func (f *sourceFlags) open(ctx context.Context, logger *slog.Logger, procRoot string, kept *procfs.KeptFiles) (gpu.Source, error) {
	switch {
	case f.demo:
		return simulated.DemoNamed(f.demoName)
	case f.simulatedConfig != "":
		return simulated.Open(f.simulatedConfig)
	}
	switch f.source {
	case "nvml":
		return openNVML(logger, nil)
	case "nvidia-smi":
		return f.openNvidiaSMI(logger)
	case "drm":
		return f.openDRM(logger, procRoot, kept, 0)
	}
	// auto: the NVIDIA GPUs' source, and the AMD and Intel GPUs' through DRM where sysfs has any; both on a node
	// with both.
	nvidia, noNvidia, nvErr := f.openNvidia(logger)
	return f.auto(logger, procRoot, kept, nvidia, noNvidia, nvErr)
}

// auto joins the NVIDIA GPUs' source, as openNvidia opened it (or did not), to the DRM source where sysfs has AMD
// or Intel GPUs.
func (f *sourceFlags) auto(logger *slog.Logger, procRoot string, kept *procfs.KeptFiles, nvidia gpu.Source, noNvidia bool,
	nvErr error) (gpu.Source, error) {
	drivers := drm.Present(f.sysfs)
	switch {
	case len(drivers) == 0:
		return nvidia, nvErr
	case nvErr != nil && !noNvidia:
		// An NVIDIA driver that fails (a mismatch, no permission) is the node's problem to see, in every reading's
		// errors as on a mixed node whose NVIDIA source fails later; it does not keep the other GPUs unread.
		logger.Warn("the NVIDIA GPUs cannot be read; reading the other GPUs through the kernel's DRM interfaces",
			"err", nvErr, "drivers", strings.Join(drivers, ","))
		nvidia = failedSource{name: "nvml", err: nvErr}
	}
	first := 0
	if nvidia != nil {
		first = drm.NVIDIAGPUs(f.sysfs)
	}
	d, err := f.openDRM(logger, procRoot, kept, first)
	if err != nil {
		if nvidia != nil {
			_ = nvidia.Close()
		}
		return nil, err
	}
	if nvidia == nil {
		logger.Info("no NVIDIA driver: reading the GPUs through the kernel's DRM interfaces", "drivers", strings.Join(drivers, ","))
		return d, nil
	}
	return mixed.New(nvidia, d), nil
}

// openNvidia opens the NVIDIA GPUs' source for --gpu.source=auto: NVML when the library loads; nvidia-smi only
// when it does not, since any other NVML failure (no permission on /dev/nvidia*, a driver mismatch) would fail
// nvidia-smi too and must be seen as it is. Where nvidia-smi is installed, it also lists the processes of GPUs
// whose lists NVML cannot read. none says that neither is there: a node without an NVIDIA driver.
func (f *sourceFlags) openNvidia(logger *slog.Logger) (src gpu.Source, none bool, err error) {
	var smi gpu.Source
	smiSource, smiErr := f.openNvidiaSMI(logger)
	if smiErr == nil {
		smi = smiSource
	}
	src, err = openNVML(logger, smi)
	if !nvmlUnavailable(err) {
		if err != nil && smi != nil {
			_ = smi.Close()
		}
		return src, false, err
	}
	if smiErr != nil {
		return nil, true, fmt.Errorf("no GPU source: %v; and %v", err, smiErr)
	}
	if withoutNVML != "" {
		// Not the node's doing but the build's: said louder, since every reading lacks what only NVML has.
		logger.Warn("NVML not available, reading GPUs with nvidia-smi", "reason", err)
	} else {
		logger.Info("NVML not available, reading GPUs with nvidia-smi", "reason", err)
	}
	return smi, false, nil
}

// failedSource is a source that could not be opened, for a mixed node's NVIDIA side: every reading fails with
// why, and the other side is served.
type failedSource struct {
	name string
	err  error
}

func (s failedSource) Name() string { return s.name }

func (s failedSource) Snapshot(context.Context) (*gpu.Snapshot, error) { return nil, s.err }

func (s failedSource) Close() error { return nil }

// sourceCollectors are the self-metrics of the sources read (NVML's XID watcher), a mixed node's included.
func sourceCollectors(src gpu.Source) []prometheus.Collector {
	var out []prometheus.Collector
	srcs := []gpu.Source{src}
	if m, ok := src.(*mixed.Source); ok {
		srcs = m.Sources()
	}
	for _, s := range srcs {
		if c, ok := s.(prometheus.Collector); ok {
			out = append(out, c)
		}
	}
	return out
}

// openDRM opens the DRM source, its GPUs numbered from first, its kept files within kept's budget.
func (f *sourceFlags) openDRM(logger *slog.Logger, procRoot string, kept *procfs.KeptFiles, first int) (gpu.Source, error) {
	return drm.New(drm.Config{SysFS: f.sysfs, ProcFS: procRoot, FirstIndex: first, KeptFiles: kept, Logger: logger})
}

func (f *sourceFlags) openNvidiaSMI(logger *slog.Logger) (gpu.Source, error) {
	return nvidiasmi.New(nvidiasmi.Config{Path: f.smiPath, Timeout: f.smiTimeout, Logger: logger})
}
