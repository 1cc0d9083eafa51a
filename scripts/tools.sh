#!/usr/bin/env bash
# The release and deployment tools the build and the tests use, built once from the Go module proxy and cached
# under ~/.cache/gpu-pod-exporter (GPE_TOOLS_CACHE overrides it); later calls only print the cached path.
#
#   scripts/tools.sh helm goreleaser     builds what is missing, prints one absolute path per tool, in order
#
# Pinned here and nowhere else. A GPE_<TOOL> variable (GPE_HELM, GPE_GORELEASER, GPE_ACTIONLINT, GPE_CRANE) naming
# a binary is used instead of building one.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"

HELM_VERSION=v3.22.0
# helm's release builds stamp the Kubernetes version of its client-go (1.37 for v3.22.0): the default for rendering
# and for lint's deprecated-API checks. A go-installed helm would say 1.20.
HELM_KUBE_VERSION=1.37
GORELEASER_VERSION=v2.15.1
ACTIONLINT_VERSION=v1.7.12
CRANE_VERSION=v0.22.1

cache="${GPE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-pod-exporter}"

# build DIR PACKAGE@VERSION [LDFLAGS]: go install into a private directory, then move the binary into DIR, so that
# two builds at once, or one killed half way, never leave a partial binary at the cached path. The binary is named
# after DIR's tool (go install would name goreleaser/v2's "goreleaser" too, but not by the path's last element).
build() {
	local dir="$1" pkg="$2" ldflags="${3:--s -w}" name bin tmp start
	name="${dir##*/}"
	bin="$dir/${name%%-*}"
	[ -x "$bin" ] && return 0
	mkdir -p "$dir"
	tmp=$(mktemp -d "$dir/build-XXXXXX")
	start=$SECONDS
	echo "scripts/tools.sh: building $pkg into $dir (once)" >&2
	# Outside our module: no -mod flag from the caller's GOFLAGS, the tool's own go.sum checked against the sum
	# database.
	if ! (cd "$tmp" && GOBIN="$tmp" GOFLAGS='' GOWORK=off CGO_ENABLED=0 go install -trimpath -ldflags="$ldflags" "$pkg") >&2; then
		rm -rf "$tmp"
		echo "scripts/tools.sh: building $pkg failed (it needs the Go module proxy)" >&2
		return 1
	fi
	mv "$tmp"/* "$bin"
	rm -rf "$tmp"
	echo "scripts/tools.sh: built $(basename "$bin") in $((SECONDS - start))s" >&2
}

for tool in "$@"; do
	case "$tool" in
	helm)
		[ -n "${GPE_HELM:-}" ] && { echo "$GPE_HELM"; continue; }
		dir="$cache/helm-$HELM_VERSION-k8s$HELM_KUBE_VERSION"
		ld="-s -w"
		for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
			ld+=" -X $p.k8sVersionMajor=${HELM_KUBE_VERSION%.*} -X $p.k8sVersionMinor=${HELM_KUBE_VERSION#*.}"
		done
		build "$dir" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "$ld"
		;;
	goreleaser)
		[ -n "${GPE_GORELEASER:-}" ] && { echo "$GPE_GORELEASER"; continue; }
		dir="$cache/goreleaser-$GORELEASER_VERSION"
		build "$dir" "github.com/goreleaser/goreleaser/v2@$GORELEASER_VERSION" "-s -w -X main.version=${GORELEASER_VERSION#v}"
		;;
	actionlint)
		[ -n "${GPE_ACTIONLINT:-}" ] && { echo "$GPE_ACTIONLINT"; continue; }
		dir="$cache/actionlint-$ACTIONLINT_VERSION"
		build "$dir" "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" \
			"-s -w -X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION"
		;;
	crane)
		[ -n "${GPE_CRANE:-}" ] && { echo "$GPE_CRANE"; continue; }
		dir="$cache/crane-$CRANE_VERSION"
		build "$dir" "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
		;;
	*)
		echo "scripts/tools.sh: unknown tool $tool (helm, goreleaser, actionlint, crane)" >&2
		exit 2
		;;
	esac
	echo "$dir/$(basename "$dir" | cut -d- -f1)"
done
