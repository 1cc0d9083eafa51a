VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -X github.com/prometheus/common/version.Version=$(VERSION) -X github.com/prometheus/common/version.Revision=$(REVISION)

.PHONY: build test demo

build:
	go build -ldflags "$(LDFLAGS)" -o gpu-pod-exporter ./cmd/gpu-pod-exporter

# The whole test suite (unit, fuzz, end to end); CI runs exactly this.
test:
	scripts/test.sh

demo: build
	./gpu-pod-exporter --demo
