#!/usr/bin/env bash
# Builds Thanos (one binary: sidecar, query and the rest), which the cluster view's end-to-end test runs, from the
# Go module proxy at the github.com/thanos-io/thanos version pinned in tools/thanos/go.mod, once: it is cached in
# $GPE_TOOLS_CACHE/thanos-<version>/ (default ~/.cache/gpu-pod-exporter) and reused by later runs. Cold, it takes
# 11 CPU-minutes to compile (34 minutes on a 2-core machine busy with other builds, 2026-12-07) after 4 minutes of
# module downloads; scripts/test.sh runs it before the end-to-end tests.
#
# Prints the binary's path on its last line of stdout; progress goes to stderr.
set -euo pipefail
# shellcheck source=scripts/e2e/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../../tools/thanos"
export PATH="$PATH:/usr/local/go/bin"
# Our own module, with its own go.sum: the caller's -mod=mod must not rewrite it, and no workspace applies.
export GOFLAGS="" GOWORK=off CGO_ENABLED=0

version=$(pinned_version github.com/thanos-io/thanos)
dest=$(tool_dir thanos "$version")
# As Thanos's release build does (.promu.yml): its build tags and the version it reports.
build_cached "$dest" -tags netgo,slicelabels \
	-ldflags "-s -w -X github.com/prometheus/common/version.Version=${version#v} -X github.com/prometheus/common/version.Branch=release" -- \
	thanos=github.com/thanos-io/thanos/cmd/thanos
echo "$dest/thanos"
