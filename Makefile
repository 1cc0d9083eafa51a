VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -X github.com/prometheus/common/version.Version=$(VERSION) -X github.com/prometheus/common/version.Revision=$(REVISION)

.PHONY: build test e2e-k8s soak demo

build:
	go build -ldflags "$(LDFLAGS)" -o gpu-pod-exporter ./cmd/gpu-pod-exporter

# The whole test suite (unit, fuzz, end to end); CI runs exactly this.
test:
	scripts/test.sh

# The end-to-end test on a real single-node Kubernetes (also part of `make test`); needs root.
e2e-k8s:
	scripts/e2e/k8s.sh

# Minute-long soak tests (test/soak, build tag soak), not part of `make test`. SOAK_DURATION shortens them.
soak:
	go test -tags soak -count=1 -v -timeout 20m ./test/soak/

demo: build
	./gpu-pod-exporter --demo
