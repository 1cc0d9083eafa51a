#!/usr/bin/env bash
# Builds KEDA's operator (keda) and metrics API server (keda-adapter), which the k8s end-to-end test runs, from the
# Go module proxy at the github.com/kedacore/keda/v2 version pinned in tools/keda/go.mod, once: they are cached in
# $GPE_TOOLS_CACHE/keda-<version>/ (default ~/.cache/gpu-pod-exporter) and reused by later runs. Every scaler's
# cloud SDK is compiled in, so a cold build is long (see docs/autoscaling.md for the time measured); the two
# binaries share most packages.
#
# Prints the directory holding the binaries, and in crds/ the CRDs the operator serves (the module's
# config/crd/bases), on its last line of stdout; progress goes to stderr.
set -euo pipefail
# shellcheck source=scripts/e2e/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../../tools/keda"
export PATH="$PATH:/usr/local/go/bin"
# Our own module, with its own go.sum: the caller's -mod=mod must not rewrite it, and no workspace applies.
export GOFLAGS="" GOWORK=off CGO_ENABLED=0

version=$(pinned_version github.com/kedacore/keda/v2)
dest=$(tool_dir keda "$version")
# Binary names and packages as KEDA's own Makefile has them.
build_cached "$dest" -ldflags "-s -w -X github.com/kedacore/keda/v2/version.Version=${version#v} -X github.com/kedacore/keda/v2/version.GitCommit=release" -- \
	keda=github.com/kedacore/keda/v2/cmd/operator keda-adapter=github.com/kedacore/keda/v2/cmd/adapter
if [ ! -d "$dest/crds" ]; then
	module=$(go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)
	mkdir -p "$dest/crds.tmp.$$"
	cp "$module"/config/crd/bases/*.yaml "$dest/crds.tmp.$$/"
	chmod 644 "$dest/crds.tmp.$$"/*.yaml
	mv -T "$dest/crds.tmp.$$" "$dest/crds" 2>/dev/null || rm -rf "$dest/crds.tmp.$$"
fi
echo "$dest"
