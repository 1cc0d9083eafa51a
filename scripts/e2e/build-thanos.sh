#!/usr/bin/env bash
# Builds Thanos (one binary: sidecar, query and the rest), which the cluster view's end-to-end test runs, from the
# Go module proxy at the github.com/thanos-io/thanos version pinned in tools/thanos/go.mod, once: it is cached in
# $GPE_TOOLS_CACHE/thanos-<version>/ (default ~/.cache/gpu-pod-exporter) and reused by later runs. Cold, it takes
# 11 CPU-minutes to compile (34 minutes on a 2-core machine busy with other builds, 2026-12-07) after 4 minutes of
# module downloads; scripts/test.sh runs it before the end-to-end tests.
#
# Prints the binary's path on its last line of stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../../tools/thanos"
export PATH="$PATH:/usr/local/go/bin"
# Our own module, with its own go.sum: the caller's -mod=mod must not rewrite it, and no workspace applies.
export GOFLAGS="" GOWORK=off CGO_ENABLED=0

version=$(go list -m -f '{{.Version}}' github.com/thanos-io/thanos)
cache="${GPE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-pod-exporter}"
dest="$cache/thanos-$version"

if [ ! -x "$dest/thanos" ]; then
	echo "[build-thanos] building thanos $version into $dest (once)" >&2
	mkdir -p "$dest"
	start=$SECONDS
	# As Thanos's release build does (.promu.yml): its build tags and the version it reports.
	ldflags="-s -w -X github.com/prometheus/common/version.Version=${version#v} -X github.com/prometheus/common/version.Branch=release"
	# A private name first, then a rename: two builds at once, or one killed half way, never leave a partial
	# binary at the cached path.
	go build -trimpath -tags netgo,slicelabels -ldflags "$ldflags" -o "$dest/thanos.tmp.$$" github.com/thanos-io/thanos/cmd/thanos
	mv "$dest/thanos.tmp.$$" "$dest/thanos"
	echo "[build-thanos] built thanos in $((SECONDS - start)) s" >&2
fi
echo "$dest/thanos"
