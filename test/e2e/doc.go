// Package e2e holds the end-to-end tests: the real gpu-pod-exporter binary against real containerd (CRI), Docker
// and Podman daemons and real cgroups. They need root and a cgroup v1/hybrid host, install Debian's runtime packages
// if missing, and are built only with the e2e tag:
//
//	go test -tags e2e -v -count=1 ./test/e2e/
//
// The daemons are started by scripts/e2e/setup-runtimes.sh and stopped by scripts/e2e/teardown-runtimes.sh (both
// also usable by hand). Environment: E2E_WORK (work directory, default /tmp/gpe-e2e), GPE_E2E_KEEP=1 (leave the
// daemons and workloads running after the test, for debugging; run the teardown script afterwards).
package e2e
