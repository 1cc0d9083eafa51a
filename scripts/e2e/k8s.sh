#!/usr/bin/env bash
# The end-to-end test on a real single-node Kubernetes (test/k8s): what `make e2e-k8s` runs, and scripts/test.sh
# after the other end-to-end tests. Needs root. Installs Debian's etcd-server when it is missing, builds the
# Kubernetes binaries and KEDA once (scripts/e2e/build-k8s.sh, scripts/e2e/build-keda.sh; cached), then runs the
# test, which starts containerd, etcd, the control plane, a kubelet and KEDA, and tears them all down.
#
#   GPE_E2E_KEEP=1   leave everything running (clean up with E2E_WORK=/tmp/gpe-e2e-k8s scripts/e2e/teardown-runtimes.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"

[ "$(id -u)" = 0 ] || { echo "the Kubernetes end-to-end test needs root" >&2; exit 1; }
if ! command -v etcd >/dev/null; then
	echo "[k8s] installing etcd-server" >&2
	# Keep the package's init script from starting the system's own etcd.
	policy=0
	if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; policy=1; fi
	rc=0
	{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null; } || rc=$?
	[ "$policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
	[ "$rc" = 0 ] || { echo "apt-get install etcd-server failed" >&2; exit 1; }
fi
GPE_K8S_BIN=$(scripts/e2e/build-k8s.sh | tail -n 1)
# KEDA's operator and metrics API server, for the autoscaling test (scripts/e2e/build-keda.sh; cached).
GPE_KEDA_BIN=$(scripts/e2e/build-keda.sh | tail -n 1)
export GPE_K8S_BIN GPE_KEDA_BIN
go vet -tags k8s ./test/k8s
go test -tags k8s -count=1 -timeout 30m -v ./test/k8s
