# shellcheck shell=bash
# Sourced by scripts/e2e/build-*.sh: the one way they build an end-to-end tool from the Go module proxy once and
# keep it in a cache that every checkout and run shares. The caller runs in its tool's wrapper module (tools/<tool>),
# whose go.mod pins the version.

# pinned_version MODULE prints MODULE's version as the current directory's go.mod pins it: read from go.mod,
# nothing is downloaded.
pinned_version() { go list -m -f '{{.Version}}' "$1"; }

# tool_dir TOOL VERSION prints the tool's cache directory for that version: $GPE_TOOLS_CACHE/TOOL-VERSION (default
# ~/.cache/gpu-pod-exporter).
tool_dir() { echo "${GPE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-pod-exporter}/$1-$2"; }

# build_cached DIR [GO-BUILD-FLAGS...] -- BINARY=PACKAGE... builds into DIR each BINARY that is not there yet, from
# its PACKAGE with the flags, and says so on stderr. Each is built under a name of its own, then renamed: two builds
# at once, or one killed half way, never leave a partial binary at the cached path.
build_cached() {
	local dir=$1 name=${0##*/} flags=() missing=() spec b tmp start
	name=${name%.sh}
	shift
	while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
		flags+=("$1")
		shift
	done
	shift
	for spec in "$@"; do
		[ -x "$dir/${spec%%=*}" ] || missing+=("$spec")
	done
	[ "${#missing[@]}" -gt 0 ] || return 0
	echo "[$name] building ${missing[*]%%=*} into $dir (once)" >&2
	mkdir -p "$dir"
	for spec in "${missing[@]}"; do
		b=${spec%%=*} start=$SECONDS
		tmp="$dir/$b.tmp.$$"
		if ! go build -trimpath "${flags[@]}" -o "$tmp" "${spec#*=}"; then
			rm -f "$tmp"
			return 1
		fi
		mv "$tmp" "$dir/$b"
		echo "[$name] built $b in $((SECONDS - start)) s" >&2
	done
}
