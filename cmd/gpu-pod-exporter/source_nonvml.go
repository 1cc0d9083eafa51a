//go:build !(linux && cgo)

package main

import (
	"errors"
	"log/slog"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// withoutNVML is why this binary cannot read NVML: go-nvml needs cgo, and NVML is Linux's. The rest (the demo, ps
// and top, nvidia-smi) builds wherever Go does.
const withoutNVML = "built without NVML (needs linux and cgo)"

var errWithoutNVML = errors.New(withoutNVML)

func openNVML(*slog.Logger, gpu.Source) (gpu.Source, error) { return nil, errWithoutNVML }

func nvmlUnavailable(err error) bool { return errors.Is(err, errWithoutNVML) }
