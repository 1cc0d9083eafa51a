//go:build linux && cgo

package main

import (
	"errors"
	"log/slog"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvml"
)

// withoutNVML is why this binary cannot read NVML, or "" when it can.
const withoutNVML = ""

// openNVML opens the NVML source; processFallback, if not nil, lists the processes NVML cannot.
func openNVML(logger *slog.Logger, processFallback gpu.Source) (gpu.Source, error) {
	return nvml.New(nvml.Config{Library: gonvml.New(), Logger: logger, ProcessFallback: processFallback})
}

// nvmlUnavailable reports whether openNVML failed for want of NVML itself, which --gpu.source=auto answers with
// nvidia-smi; any other failure (no permission on /dev/nvidia*, a driver mismatch) would fail nvidia-smi too.
func nvmlUnavailable(err error) bool { return errors.Is(err, nvml.ErrLibraryNotFound) }
