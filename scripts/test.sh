#!/usr/bin/env bash
# The whole test suite: what `make test` and CI run. Installs what the tests need (Debian packages, Go modules),
# then runs unit tests, short fuzzing of the parsers, and the end-to-end tests with the real binary against real
# Prometheus, containerd, Docker and Podman, which the tests start and stop themselves.
#
#   FUZZTIME   how long each fuzz target runs (default 15s)
#   FUZZ_GOTOOLCHAIN  the Go toolchain that fuzzes (default go1.27.3; see the fuzzing step)
#   E2E=0      skip the end-to-end tests (they need root)
#
# The exit status is the truth: 0 only when every step passed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
# A test run must not rewrite go.mod or go.sum: a missing requirement fails the run instead of being added.
export GOFLAGS="${GOFLAGS:-} -mod=readonly"

step() { printf '\n=== %s\n' "$*"; }

# Everything this run writes goes in its own directory, so that two runs on one host do not collide; it is removed
# at exit unless a failure left a log in it to read.
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-pod-exporter-test.XXXXXX")
keep_work=0
policy_rc=""
bg_pids=()
cleanup() {
	[ -z "$policy_rc" ] || rm -f "$policy_rc"
	for pid in "${bg_pids[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
	[ "$keep_work" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

# Debian packages the tests use: promtool and the Prometheus server, systemd-analyze for the unit file, tmux. The
# container runtimes are installed by scripts/e2e/setup-runtimes.sh, which the end-to-end tests run.
need=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
# The release (scripts/release.sh, tested in test/deploy): the arm64 cross compiler for cgo, qemu to run the arm64
# binary, rpm and cpio to read the .rpm, shellcheck for actionlint to check the workflow's run steps.
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v rpm >/dev/null && command -v cpio >/dev/null || need+=(rpm cpio)
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v tmux >/dev/null || need+=(tmux) # the terminal that test/top drives `top` in
# The Alertmanager that test/alerting routes the alerts through (deploy/alertmanager/alertmanager.yml).
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
# The man page and the shell completions: groff and man render the page, each shell runs its completion script.
command -v groff >/dev/null || need+=(groff-base)
command -v man >/dev/null || need+=(man-db)
command -v zsh >/dev/null || need+=(zsh)
command -v fish >/dev/null || need+=(fish)
if [ "${#need[@]}" -gt 0 ]; then
	step "installing ${need[*]}"
	[ "$(id -u)" = 0 ] || { echo "installing ${need[*]} needs root (or install them yourself)" >&2; exit 1; }
	# Keep the packages' init scripts from starting the system's own daemons. The trap removes the file even
	# when apt-get fails.
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy_rc=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy_rc"
		chmod +x "$policy_rc"
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	if [ -n "$policy_rc" ]; then rm -f "$policy_rc"; policy_rc=""; fi
fi

step "go mod download"
go mod download

# The release and deployment tools, pinned in scripts/tools.sh: built once from the Go module proxy into
# ~/.cache/gpu-pod-exporter (cold: several minutes on 2 cores), then only looked up.
step "release tools (helm, goreleaser, actionlint, crane)"
scripts/tools.sh helm goreleaser actionlint crane

# The end-to-end tools built from the Go module proxy and cached like the release tools: Thanos for test/cluster,
# the Kubernetes binaries and KEDA for test/k8s. Cold, they take tens of CPU-minutes, so they build in the background
# at the lowest CPU priority while the steps below run: fuzzing takes its fixed time whatever CPU it gets, and the
# end-to-end tests mostly wait on servers, so the builds use what those leave, and the run waits for a build only
# where a test needs it. Cached, each is a lookup. Each build runs in a session of its own, so that a failed run
# stops the compilers it started too.
bg_build() { # NAME SCRIPT...: starts the scripts one after the other; NAME's pid goes in bg_pid_NAME
	local name="$1"
	shift
	# shellcheck disable=SC2016 # the scripts are the inner shell's arguments, expanded there
	setsid bash -c 'set -e; for s in "$@"; do nice -n 19 "$s"; done' bash "$@" >"$work/build-$name.log" 2>&1 &
	bg_pids+=($!)
	printf -v "bg_pid_$name" '%s' "$!"
}
bg_wait() { # NAME: waits for NAME's builds; a failure ends the run with their log
	local pid="bg_pid_$1"
	step "waiting for the $1 build (log: $work/build-$1.log)"
	start=$SECONDS
	if ! wait "${!pid}"; then
		keep_work=1
		tail -n 40 "$work/build-$1.log" >&2
		echo "building $1 failed; full log in $work/build-$1.log" >&2
		exit 1
	fi
	echo "waited $((SECONDS - start))s"
}
if [ "${E2E:-1}" != 0 ]; then
	step "end-to-end tools, building in the background: Thanos, and Kubernetes and KEDA"
	bg_build thanos scripts/e2e/build-thanos.sh
	[ "${K8S_E2E:-1}" = 0 ] || bg_build kubernetes scripts/e2e/build-k8s.sh scripts/e2e/build-keda.sh
fi

step "gofmt and go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$unformatted" ] || { echo "gofmt would change: $unformatted" >&2; exit 1; }
go vet ./...
# Everything but the NVML source builds without cgo and for macOS (the demo, ps and top run there).
GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 go vet ./...
go vet -tags e2e ./test/...
go vet -tags soak ./test/soak/ # make soak is not run here, but must build

step "unit tests"
go test -count=1 ./...

step "fuzzing (${FUZZTIME:-15s} per target)"
# Go before 1.27 can fail a -fuzztime run that found nothing with a bare "context deadline exceeded" as the time
# runs out (go.dev/issue/75804), so fuzzing alone runs on the first toolchain with the fix, fetched from the module
# proxy like a module. The project still builds and tests with the Go that go.mod names.
export FUZZ_GOTOOLCHAIN="${FUZZ_GOTOOLCHAIN:-go1.27.3}"
for pkg in $(go list ./internal/...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
		echo "--- $pkg $target"
		GOTOOLCHAIN="$FUZZ_GOTOOLCHAIN" go test -run '^$' -fuzz "^${target}\$" -fuzztime "${FUZZTIME:-15s}" "$pkg"
	done
done

if [ "${E2E:-1}" != 0 ]; then
	# Built once per run and shared by every release test (GPE_RELEASE_DIST); goreleaser's two cgo builds are the
	# slow part.
	step "release snapshot (make release-snapshot)"
	start=$SECONDS
	# A define that nothing reads changes cgo's part of the build cache's key, so that go-nvml is compiled afresh as
	# in a first release build, and a compiler warning it prints shows in the log that test/deploy reads.
	if ! CGO_CPPFLAGS="-DGPE_FRESH_BUILD=$$" scripts/release.sh snapshot >"$work/release.log" 2>&1; then
		keep_work=1
		tail -n 40 "$work/release.log" >&2
		echo "release snapshot failed; full log in $work/release.log" >&2
		exit 1
	fi
	echo "built in $((SECONDS - start))s"
	export GPE_RELEASE_DIST="$PWD/dist" GPE_RELEASE_LOG="$work/release.log"

	bg_wait thanos
	step "end-to-end tests"
	log="$work/e2e.log"
	# The full log goes to a file and a summary to the terminal; the status is go test's own, not the filter's
	# (grep finding no line to show is not a failure).
	set +e
	go test -count=1 -tags e2e -timeout 30m -v ./test/... 2>&1 | tee "$log" | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go'
	status=("${PIPESTATUS[@]}")
	set -e
	if [ "${status[0]}" != 0 ] || [ "${status[1]}" != 0 ]; then
		keep_work=1
		echo "end-to-end tests failed (go test exit ${status[0]}); full log in $log" >&2
		exit 1
	fi
	grep -qE '^ok ' "$log" || { keep_work=1; echo "end-to-end tests did not run; full log in $log" >&2; exit 1; }
fi
if [ "${E2E:-1}" != 0 ] && [ "${K8S_E2E:-1}" != 0 ]; then
	bg_wait kubernetes
	step "Kubernetes end-to-end test (scripts/e2e/k8s.sh; K8S_E2E=0 skips it)"
	scripts/e2e/k8s.sh
fi
step "all tests passed"
