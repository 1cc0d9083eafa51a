#!/usr/bin/env bash
# Builds the Kubernetes binaries the k8s end-to-end test runs (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet) from the Go module proxy, at the k8s.io/kubernetes version pinned in tools/k8s/go.mod, once:
# they are cached in $GPE_TOOLS_CACHE/k8s-<version>/ (default ~/.cache/gpu-pod-exporter) and reused by later runs.
# A cold build takes 11 CPU-minutes (16 minutes on a busy 2-core machine); the binaries share most packages, so
# after kube-apiserver the others take 3 minutes together.
#
# Prints the directory holding the binaries on its last line of stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../../tools/k8s"
export PATH="$PATH:/usr/local/go/bin"
# Our own module, with its own go.sum: the caller's -mod=mod must not rewrite it, and no workspace applies.
export GOFLAGS="" GOWORK=off CGO_ENABLED=0

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
cache="${GPE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-pod-exporter}"
dest="$cache/k8s-$version"

missing=()
for b in "${BINARIES[@]}"; do [ -x "$dest/$b" ] || missing+=("$b"); done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "[build-k8s] building ${missing[*]} $version into $dest (once)" >&2
	mkdir -p "$dest"
	minor=${version#v1.}
	minor=${minor%%.*}
	# The version the release build stamps: the API server reports it (helm checks the chart's kubeVersion against
	# it) and the kubelet registers the node with it.
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	for b in "${missing[@]}"; do
		start=$SECONDS
		go build -trimpath -ldflags "$ldflags" -o "$dest/$b.tmp" "k8s.io/kubernetes/cmd/$b"
		mv "$dest/$b.tmp" "$dest/$b"
		echo "[build-k8s] built $b in $((SECONDS - start)) s" >&2
	done
fi
echo "$dest"
