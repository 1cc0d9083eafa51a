#!/usr/bin/env bash
# Builds the release. The same steps run locally (make release-snapshot, the tests) and on a vX.Y.Z tag
# (.github/workflows/release.yml); only publishing differs.
#
#   scripts/release.sh snapshot          goreleaser --snapshot (binaries, archives, deb/rpm, checksums in dist/),
#                                        then the chart; publishes nothing
#   scripts/release.sh chart [URL]       dist/charts: the chart packaged with the release's version, and a Helm
#                                        repository index whose chart URLs start with URL (relative without);
#                                        MERGE_INDEX names an earlier index.yaml whose versions it keeps
#   scripts/release.sh image REPO BASE   the multi-arch image from dist/'s linux/amd64 and linux/arm64 binaries:
#                                        one image per architecture on BASE (a glibc image; its index or an image
#                                        of each architecture), pushed as REPO:<version>-<arch>, and the OCI image
#                                        index REPO:<version> over both; also written to dist/image as an OCI
#                                        image layout. Pushes, so REPO must be a registry you may write to.
#                                        Prints the index's digest.
#   scripts/release.sh notes VERSION     the release notes: VERSION's section of CHANGELOG.md
#
# The release's version is the one goreleaser wrote into dist/metadata.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

# The one image name: the chart's image.repository, the manifests, the docs and the release workflow use it.
IMAGE_REPO=ghcr.io/gpu-pod-exporter/gpu-pod-exporter
SOURCE_URL=https://github.com/gpu-pod-exporter/gpu-pod-exporter
CHART_DIR=deploy/helm/gpu-pod-exporter

step() { printf '=== release: %s\n' "$*" >&2; }
die() {
	echo "scripts/release.sh: $*" >&2
	exit 1
}

version() {
	[ -s dist/metadata.json ] || die "no dist/metadata.json: run goreleaser (scripts/release.sh snapshot) first"
	sed -n 's/.*"version":"\([^"]*\)".*/\1/p' dist/metadata.json
}

snapshot() {
	local goreleaser start
	goreleaser=$(scripts/tools.sh goreleaser)
	command -v aarch64-linux-gnu-gcc >/dev/null ||
		die "aarch64-linux-gnu-gcc is missing: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
	# goreleaser reads the commit only where git names a remote; a clone has one, a fresh `git init` or a worktree
	# of one without a remote would give revision "none". The URL is only read, never contacted.
	if [ -z "$(git remote)" ]; then
		export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=remote.origin.url GIT_CONFIG_VALUE_0="$SOURCE_URL.git"
	fi
	step "goreleaser release --snapshot"
	start=$SECONDS
	"$goreleaser" release --snapshot --clean
	step "goreleaser took $((SECONDS - start))s"
	chart ""
}

chart() {
	local url="$1" v helm
	v=$(version)
	helm=$(scripts/tools.sh helm)
	step "helm package $CHART_DIR ($v)"
	rm -rf dist/charts
	mkdir -p dist/charts
	# Chart and app version are the release's: appVersion is the default image tag.
	"$helm" package "$CHART_DIR" --version "$v" --app-version "$v" --destination dist/charts >&2
	local args=()
	[ -z "$url" ] || args+=(--url "$url")
	[ -z "${MERGE_INDEX:-}" ] || args+=(--merge "$MERGE_INDEX")
	"$helm" repo index dist/charts "${args[@]}" >&2
}

# binary ARCH: the path of goreleaser's linux binary for ARCH (dist/gpu-pod-exporter_linux_amd64_v1/..., _arm64_v8.0).
binary() {
	local b
	for b in dist/gpu-pod-exporter_linux_"$1"*/gpu-pod-exporter; do
		[ -x "$b" ] && {
			echo "$b"
			return
		}
	done
	die "no linux/$1 binary in dist/: run goreleaser first"
}

image() {
	local repo="$1" base="$2" v crane revision created work arch refs=() b
	v=$(version)
	crane=$(scripts/tools.sh crane)
	# The commit goreleaser built, not whatever is checked out now.
	revision=$(sed -n 's/.*"commit":"\([^"]*\)".*/\1/p' dist/metadata.json)
	created=$(git show -s --format=%cI "$revision")
	work=$(mktemp -d)
	trap 'rm -rf "$work"' RETURN
	for arch in amd64 arm64; do
		b=$(binary "$arch")
		step "image $repo:$v-$arch from $b on $base"
		mkdir -p "$work/$arch/usr/bin"
		install -m 0755 "$b" "$work/$arch/usr/bin/gpu-pod-exporter"
		# One layer: the binary, owned by root, with the commit's time, so that a rebuild gives the same digest.
		tar --sort=name --mtime="$created" --numeric-owner --owner=0 --group=0 -C "$work/$arch" -cf "$work/$arch.tar" usr
		"$crane" append --platform "linux/$arch" --base "$base" --new_layer "$work/$arch.tar" \
			--new_tag "$repo:$v-$arch" >/dev/null
		# The Dockerfile's runtime stage, as configuration: the entrypoint, non-root user 65532, the port, OCI labels.
		"$crane" mutate "$repo:$v-$arch" --tag "$repo:$v-$arch" \
			--entrypoint /usr/bin/gpu-pod-exporter --user 65532:65532 --exposed-ports 9402/tcp \
			--label "org.opencontainers.image.title=gpu-pod-exporter" \
			--label "org.opencontainers.image.description=Which pod, container, Slurm job or service uses each GPU" \
			--label "org.opencontainers.image.source=$SOURCE_URL" \
			--label "org.opencontainers.image.url=$SOURCE_URL" \
			--label "org.opencontainers.image.version=$v" \
			--label "org.opencontainers.image.revision=$revision" \
			--label "org.opencontainers.image.created=$created" \
			--label "org.opencontainers.image.licenses=Apache-2.0" >/dev/null
		refs+=(--manifest "$repo:$v-$arch")
	done
	step "image index $repo:$v"
	"$crane" index append "${refs[@]}" --tag "$repo:$v" >/dev/null
	rm -rf dist/image
	"$crane" pull --format oci "$repo:$v" dist/image
	"$crane" digest "$repo:$v"
}

# notes VERSION: the lines under "## [VERSION]" (or "## VERSION") up to the next "## " heading.
notes() {
	local out
	out=$(awk -v v="$1" '
		/^## / { if (found) exit; h = $2; gsub(/[][]/, "", h); found = (h == v); next }
		found' CHANGELOG.md)
	[ -n "$(printf '%s' "$out" | tr -d '[:space:]')" ] || die "CHANGELOG.md has no section ## [$1]"
	printf '%s\n' "$out"
}

case "${1:-}" in
snapshot) snapshot ;;
notes)
	[ $# = 2 ] || die "usage: scripts/release.sh notes VERSION"
	notes "$2"
	;;
chart) chart "${2:-}" ;;
image)
	[ $# = 3 ] || die "usage: scripts/release.sh image REPO BASE (e.g. $IMAGE_REPO gcr.io/distroless/base-debian12:nonroot)"
	image "$2" "$3"
	;;
*)
	sed -n '2,/^set -e/p' "$0" | sed '$d' >&2
	exit 2
	;;
esac
