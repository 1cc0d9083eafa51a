package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/alecthomas/kingpin/v2"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvidiasmi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvml"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/simulated"
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
	simulatedConfig string
	demo            bool
	smiPath         string
	smiTimeout      time.Duration
}

func (f *sourceFlags) register(app *kingpin.Application) {
	app.Flag("gpu.source", "Where GPU data comes from: auto (NVML if libnvidia-ml.so.1 loads, else nvidia-smi), nvml, nvidia-smi or simulated.").
		Default("auto").EnumVar(&f.source, "auto", "nvml", "nvidia-smi", "simulated")
	app.Flag("gpu.simulated-config", "Simulated node file (YAML); implies --gpu.source=simulated.").StringVar(&f.simulatedConfig)
	app.Flag("demo", "Run on a built-in simulated node with workloads, no GPU needed.").BoolVar(&f.demo)
	app.Flag("nvidia-smi.path", "nvidia-smi binary, for --gpu.source=nvidia-smi.").Default("nvidia-smi").StringVar(&f.smiPath)
	app.Flag("nvidia-smi.timeout", "Deadline of one nvidia-smi run.").Default(nvidiasmi.DefaultTimeout.String()).DurationVar(&f.smiTimeout)
}

func (f *sourceFlags) open(ctx context.Context, logger *slog.Logger) (gpu.Source, error) {
	switch {
	case f.demo:
		return simulated.Demo(), nil
	case f.simulatedConfig != "":
		return simulated.Open(f.simulatedConfig)
	}
	switch f.source {
	case "simulated":
		return nil, errors.New("--gpu.source=simulated needs --gpu.simulated-config=FILE (or use --demo)")
	case "nvml":
		return f.openNVML(logger)
	case "nvidia-smi":
		return f.openNvidiaSMI(logger)
	}
	// auto: NVML when the library loads; nvidia-smi only when it does not, since any other NVML failure (no
	// permission on /dev/nvidia*, a driver mismatch) would fail nvidia-smi too and must be seen as it is.
	src, err := f.openNVML(logger)
	if !errors.Is(err, nvml.ErrLibraryNotFound) {
		return src, err
	}
	smi, smiErr := f.openNvidiaSMI(logger)
	if smiErr != nil {
		return nil, fmt.Errorf("no GPU source: %v; and %v", err, smiErr)
	}
	logger.Info("NVML not available, reading GPUs with nvidia-smi", "reason", err)
	return smi, nil
}

func (f *sourceFlags) openNVML(logger *slog.Logger) (gpu.Source, error) {
	return nvml.New(nvml.Config{Library: gonvml.New(), Logger: logger})
}

func (f *sourceFlags) openNvidiaSMI(logger *slog.Logger) (gpu.Source, error) {
	return nvidiasmi.New(nvidiasmi.Config{Path: f.smiPath, Timeout: f.smiTimeout, Logger: logger})
}
