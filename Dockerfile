# gpu-pod-exporter container image, built from source. The released multi-arch image,
# ghcr.io/gpu-pod-exporter/gpu-pod-exporter, has the same runtime configuration and is assembled from the release
# binaries (scripts/release.sh image).
#
#   docker build -t gpu-pod-exporter \
#     --build-arg VERSION=$(make -s version) --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg BUILD_DATE=$(date -u +%Y%m%d-%H:%M:%S) .
#   docker run --rm -p 9402:9402 gpu-pod-exporter --demo
#
# Stage 1 builds with cgo: go-nvml loads libnvidia-ml.so.1 with dlopen at run time, which needs a cgo binary
# against glibc (CGO_CFLAGS silences the deprecation warnings of NVIDIA's header, as the Makefile says). Stage 2 is a glibc image without a shell or package manager (distroless base): the exporter
# never runs a shell, and the NVIDIA container toolkit mounts libnvidia-ml.so.1 and nvidia-smi into the container
# from the host's driver (NVIDIA_DRIVER_CAPABILITIES=utility), so the image carries no driver files.
#
# Build arguments:
#   GO_IMAGE       the builder (Debian 12 based, like the runtime, so the glibc versions match)
#   RUNTIME_IMAGE  the runtime base: any glibc >= 2.34 image; distroless base has CA certificates and tzdata
#   VERSION, REVISION, BRANCH, BUILD_DATE   what --version shows (BUILD_DATE as YYYYMMDD-HH:MM:SS) and the OCI labels
#   BINARY_FROM    the stage or image the binary is copied from: "build" (default) builds it here; the tests set it
#                  to an image holding a binary built outside (no registry to pull a Go image from there)

ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/base-debian12:nonroot
ARG BINARY_FROM=build

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG REVISION=unknown
ARG BRANCH=unknown
ARG BUILD_DATE=unknown
RUN v=github.com/prometheus/common/version && CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -trimpath \
      -ldflags "-s -w -X $v.Version=${VERSION} -X $v.Revision=${REVISION} -X $v.Branch=${BRANCH} -X $v.BuildUser=docker -X $v.BuildDate=${BUILD_DATE}" \
      -o /out/gpu-pod-exporter ./cmd/gpu-pod-exporter

FROM ${BINARY_FROM} AS binary

FROM ${RUNTIME_IMAGE} AS runtime
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpu-pod-exporter" \
      org.opencontainers.image.description="Which pod, container, Slurm job or service uses each GPU" \
      org.opencontainers.image.source="https://github.com/gpu-pod-exporter/gpu-pod-exporter" \
      org.opencontainers.image.url="https://github.com/gpu-pod-exporter/gpu-pod-exporter" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binary /out/gpu-pod-exporter /usr/bin/gpu-pod-exporter
# Non-root by default: enough for --demo, for NVML (/dev/nvidia* are 0666) and for reading every process's
# /proc/<pid>/cgroup. The Kubernetes DaemonSet runs it as uid 0 with every capability dropped, only because the
# CRI and kubelet PodResources sockets are root's (docs/install.md, "Privileges").
USER 65532:65532
EXPOSE 9402
ENTRYPOINT ["/usr/bin/gpu-pod-exporter"]
