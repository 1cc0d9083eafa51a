#!/usr/bin/env bash
# Builds the Kubernetes binaries the k8s end-to-end test runs (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet) from the Go module proxy, at the k8s.io/kubernetes version pinned in tools/k8s/go.mod, once:
# they are cached in $GPE_TOOLS_CACHE/k8s-<version>/ (default ~/.cache/gpu-pod-exporter) and reused by later runs.
# A cold build takes 11 CPU-minutes (16 minutes on a busy 2-core machine); the binaries share most packages, so
# after kube-apiserver the others take 3 minutes together.
#
# Prints the directory holding the binaries on its last line of stdout; progress goes to stderr.
set -euo pipefail
# shellcheck source=scripts/e2e/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../../tools/k8s"
export PATH="$PATH:/usr/local/go/bin"
# Our own module, with its own go.sum: the caller's -mod=mod must not rewrite it, and no workspace applies.
export GOFLAGS="" GOWORK=off CGO_ENABLED=0

version=$(pinned_version k8s.io/kubernetes)
dest=$(tool_dir k8s "$version")
minor=${version#v1.}
minor=${minor%%.*}
# The version the release build stamps: the API server reports it (helm checks the chart's kubeVersion against it)
# and the kubelet registers the node with it.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
build_cached "$dest" -ldflags "$ldflags" -- kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
	kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
	kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kubelet=k8s.io/kubernetes/cmd/kubelet
echo "$dest"
