#!/usr/bin/env bash
# The whole test suite: what `make test` and CI run. Installs what the tests need (Debian packages, Go modules),
# then runs unit tests, short fuzzing of the parsers, and the end-to-end tests with the real binary against real
# Prometheus, containerd, Docker and Podman, which the tests start and stop themselves.
#
#   FUZZTIME   how long each fuzz target runs (default 15s)
#   E2E=0      skip the end-to-end tests (they need root)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
export GOFLAGS="${GOFLAGS:-} -mod=mod"

step() { printf '\n=== %s\n' "$*"; }

# Debian packages the tests use: promtool and the Prometheus server, systemd-analyze for the unit file. The
# container runtimes are installed by scripts/e2e/setup-runtimes.sh, which the end-to-end tests run.
need=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || need+=(prometheus)
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ "${#need[@]}" -gt 0 ]; then
	step "installing ${need[*]}"
	[ "$(id -u)" = 0 ] || { echo "installing ${need[*]} needs root (or install them yourself)" >&2; exit 1; }
	# Keep the packages' init scripts from starting the system's own daemons.
	policy=0
	if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; policy=1; fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	[ "$policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

step "go mod download"
go mod download

step "gofmt and go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$unformatted" ] || { echo "gofmt would change: $unformatted" >&2; exit 1; }
go vet ./...
go vet -tags e2e ./test/...

step "unit tests"
go test -count=1 ./...

step "fuzzing (${FUZZTIME:-15s} per target)"
for pkg in $(go list ./internal/...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
		echo "--- $pkg $target"
		go test -run '^$' -fuzz "^${target}\$" -fuzztime "${FUZZTIME:-15s}" "$pkg"
	done
done

if [ "${E2E:-1}" != 0 ]; then
	step "end-to-end tests"
	go test -count=1 -tags e2e -timeout 30m -v ./test/... 2>&1 | tee /tmp/gpu-pod-exporter-e2e.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go' || true
	grep -qE '^(FAIL|panic)' /tmp/gpu-pod-exporter-e2e.log && { echo "end-to-end tests failed; full log in /tmp/gpu-pod-exporter-e2e.log" >&2; exit 1; }
	grep -qE '^ok ' /tmp/gpu-pod-exporter-e2e.log || { echo "end-to-end tests did not run" >&2; exit 1; }
fi
step "all tests passed"
