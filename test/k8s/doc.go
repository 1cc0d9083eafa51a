// Package k8s is the end-to-end test on a real single-node Kubernetes: kube-apiserver on Debian's etcd,
// kube-controller-manager, kube-scheduler and a kubelet on the containerd that scripts/e2e/setup-runtimes.sh starts,
// built from upstream sources by scripts/e2e/build-k8s.sh; a fake NVIDIA device plugin on the kubelet's real
// device-plugin API, and a fake NVIDIA DRA kubelet plugin (gpu.nvidia.com) whose ResourceSlice the real scheduler
// allocates ResourceClaims from; the exporter installed with `helm install` from the chart, on a locally built image, scraped by
// a real Prometheus that finds it through the API server; and KEDA's operator and metrics API server, built from
// its Go module by scripts/e2e/build-keda.sh, behind the API server's aggregation layer, which autoscale
// Deployments that share a GPU through the HPA controller of kube-controller-manager.
//
// It needs root and the k8s build tag; `make e2e-k8s` (scripts/e2e/k8s.sh) installs etcd, builds the binaries once
// and runs it:
//
//	go test -tags k8s -count=1 -v ./test/k8s
package k8s
