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
cd "$(dirname "$0")/../../tools/keda"
export PATH="$PATH:/usr/local/go/bin"
# Our own module, with its own go.sum: the caller's -mod=mod must not rewrite it, and no workspace applies.
export GOFLAGS="" GOWORK=off CGO_ENABLED=0

version=$(go list -m -f '{{.Version}}' github.com/kedacore/keda/v2)
cache="${GPE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-pod-exporter}"
dest="$cache/keda-$version"

# binary name => package, as KEDA's own Makefile names them.
declare -A PACKAGES=([keda]=cmd/operator [keda-adapter]=cmd/adapter)
missing=()
for b in keda keda-adapter; do [ -x "$dest/$b" ] || missing+=("$b"); done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "[build-keda] building ${missing[*]} $version into $dest (once)" >&2
	mkdir -p "$dest"
	ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=${version#v} -X github.com/kedacore/keda/v2/version.GitCommit=release"
	for b in "${missing[@]}"; do
		start=$SECONDS
		# A private name first, then a rename: two builds at once, or one killed half way, never leave a partial
		# binary at the cached path.
		go build -trimpath -ldflags "$ldflags" -o "$dest/$b.tmp.$$" "github.com/kedacore/keda/v2/${PACKAGES[$b]}"
		mv "$dest/$b.tmp.$$" "$dest/$b"
		echo "[build-keda] built $b in $((SECONDS - start)) s" >&2
	done
fi
if [ ! -d "$dest/crds" ]; then
	module=$(go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)
	mkdir -p "$dest/crds.tmp.$$"
	cp "$module"/config/crd/bases/*.yaml "$dest/crds.tmp.$$/"
	chmod 644 "$dest/crds.tmp.$$"/*.yaml
	mv -T "$dest/crds.tmp.$$" "$dest/crds" 2>/dev/null || rm -rf "$dest/crds.tmp.$$"
fi
echo "$dest"
