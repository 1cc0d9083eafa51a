# Versions come from vX.Y.Z tags; every build path (make, goreleaser, the Dockerfile) stamps the same variables of
# github.com/prometheus/common/version, which --version and gpu_pod_exporter_build_info show.
# Without a tag (a shallow clone, a fork), "dev". A "#" in the shell command would need an escape that make 4.3
# passes on to the shell as it is, so the v is stripped by make.
VERSION    ?= $(patsubst v%,%,$(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo vdev))
REVISION   ?= $(shell git rev-parse HEAD 2>/dev/null)
BRANCH     ?= $(shell git rev-parse --abbrev-ref HEAD 2>/dev/null)
BUILD_USER ?= $(shell id -un 2>/dev/null)@$(shell hostname 2>/dev/null)
BUILD_DATE ?= $(shell date -u +%Y%m%d-%H:%M:%S)
VERSION_PKG := github.com/prometheus/common/version
LDFLAGS    := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION) \
              -X $(VERSION_PKG).Branch=$(BRANCH) -X '$(VERSION_PKG).BuildUser=$(BUILD_USER)' \
              -X $(VERSION_PKG).BuildDate=$(BUILD_DATE)

# go-nvml's cgo code calls functions that NVIDIA's nvml.h marks deprecated, and gcc warns about each one whenever
# that package is compiled afresh: nearly 150 lines that read as a failed build. They are the header's, not ours, so
# every build path with cgo (this one, .goreleaser.yaml, the Dockerfile) turns that one warning off; -O2 -g is cgo's
# default, which setting the variable would otherwise drop.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: build test e2e-k8s soak demo release-snapshot bench bench-cluster version

build:
	go build -ldflags "$(LDFLAGS)" -o gpu-pod-exporter ./cmd/gpu-pod-exporter

# The version a build stamps: the vX.Y.Z tag it is at or after, "dev" in a clone without tags. The Dockerfile's
# build line takes it from here (--build-arg VERSION=$(make -s version)).
version:
	@echo $(VERSION)

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

# The release, built locally and published nowhere: dist/ gets the linux/amd64 and linux/arm64 archives, deb and rpm
# packages, checksums and the packaged Helm chart with its repository index (scripts/release.sh).
release-snapshot:
	scripts/release.sh snapshot

# The performance benchmark (docs/performance.md): the real binary on generated nodes of 1 to 2,048 processes,
# scraped like Prometheus. Not part of `make test`; BENCH_FLAGS passes flags to test/bench (-sizes, -cases, ...).
bench: build
	go run ./test/bench -binary ./gpu-pod-exporter $(BENCH_FLAGS)

# `ps --prometheus` and `top --prometheus` on generated fleets of 10 to 1,000 nodes backfilled into a real Prometheus
# TSDB (docs/performance.md, "The cluster view"). Not part of `make test`: 1,000 nodes take minutes.
# CLUSTER_BENCH_FLAGS passes flags to test/clusterbench (-nodes, -runs, -interval, -keep).
bench-cluster: build
	go run ./test/clusterbench -binary ./gpu-pod-exporter $(CLUSTER_BENCH_FLAGS)
