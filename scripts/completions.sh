#!/usr/bin/env bash
# Writes what the release carries besides the binary and the docs: the man page and the bash, zsh and fish
# completion scripts, each written by the program itself (--help-man, completion SHELL), into build/. goreleaser runs
# it before its builds (.goreleaser.yaml); the packages install them where man and each shell look.
#
#   scripts/completions.sh [VERSION]     VERSION is the one the man page's footer names (default: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

version="${1:-dev}"
out=build
rm -rf "$out/completions" "$out/man"
mkdir -p "$out/completions" "$out/man"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Without cgo: what these print does not depend on NVML, and so the step needs no C compiler and prints no warning.
CGO_ENABLED=0 go build -ldflags "-X github.com/prometheus/common/version.Version=$version" \
	-o "$tmp/gpu-pod-exporter" ./cmd/gpu-pod-exporter
"$tmp/gpu-pod-exporter" completion bash >"$out/completions/gpu-pod-exporter.bash"
"$tmp/gpu-pod-exporter" completion zsh >"$out/completions/_gpu-pod-exporter"
"$tmp/gpu-pod-exporter" completion fish >"$out/completions/gpu-pod-exporter.fish"
# gzip -n: no name or time stamp, so that the same release builds the same file.
"$tmp/gpu-pod-exporter" --help-man | gzip -9n >"$out/man/gpu-pod-exporter.1.gz"
