//go:build k8s

package k8s

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/draplugin"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// Dynamic Resource Allocation needs no feature gate on this Kubernetes (1.37, tools/k8s/go.mod), so none is set:
//   - DynamicResourceAllocation (API server, scheduler, controller-manager, kubelet) is GA since 1.34 and locked on
//     since 1.35;
//   - KubeletPodResourcesDynamicResources (the kubelet's PodResources dynamic_resources, which the exporter reads)
//     is GA and locked on since 1.36;
//   - the API server serves resource.k8s.io/v1 by default since 1.34.
//
// A gate locked on may still be set to true, but the flag fails once the gate is removed (1.38 for
// DynamicResourceAllocation), so setting them would only break the next version bump. On 1.32 and 1.33 the first
// two were off by default and resource.k8s.io was v1beta1: there the API server, scheduler, controller-manager and
// kubelet need --feature-gates=DynamicResourceAllocation=true, the kubelet KubeletPodResourcesDynamicResources=true
// too, and the API server --runtime-config=resource.k8s.io/v1beta1=true.

// draGPUs are the GPUs of the node file that the DRA plugin publishes; the device plugins never hand them out.
var draGPUs = []string{gpuDRA0, gpuDRA1}

const (
	draClaim     = "shared-gpu"
	draContainer = "main"
)

// startDRAPlugin starts the fake NVIDIA DRA kubelet plugin in the test's process, as the device plugins are: it
// registers with the kubelet through <root-dir>/plugins_registry and publishes draGPUs in a ResourceSlice. Its
// log goes to logs/dra-plugin.log, kept with the daemons' when the test fails.
func startDRAPlugin(t *testing.T, c *cluster) *draplugin.Plugin {
	t.Helper()
	registry := filepath.Join(c.kubelet, "plugins_registry")
	data := filepath.Join(c.kubelet, "plugins", draplugin.DriverName)
	for _, d := range []string{registry, data} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	// NVIDIA's plugin writes ResourceSlices under a service account of its own; the admin's token stands in.
	client, err := kubernetes.NewForConfig(&rest.Config{Host: c.apiURL, BearerToken: c.token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(c.dir, "pki/ca.crt")}})
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.OpenFile(filepath.Join(c.dir, "logs", "dra-plugin.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	var logMu sync.Mutex
	logger := funcr.New(func(prefix, args string) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintln(logFile, time.Now().Format(time.RFC3339Nano), prefix, args)
	}, funcr.Options{Verbosity: 3})

	var gpus []draplugin.GPU
	for i, g := range nodeGPUs {
		if slices.Contains(draGPUs, g.uuid) {
			gpus = append(gpus, draplugin.GPU{Minor: g.minor, UUID: g.uuid, ProductName: gpuProduct,
				MemoryBytes: gpuMemoryBytes, PCIBusID: pciBusID(i)})
		}
	}
	p, err := draplugin.Start(context.Background(), draplugin.Config{
		Client: client, NodeName: nodeName, RegistryDir: registry, DataDir: data, GPUs: gpus,
		// The node file's 580.95.05 and 13.0, as NVIDIA's driver turns them into semantic versions.
		DriverVersion: "580.95.5", CUDAVersion: "13.0.0",
		Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// testDRA runs two pods on one ResourceClaim, which the real scheduler allocates from the plugin's ResourceSlice,
// and a third pod without a claim on the claim's GPU, and checks that the exporter joins what the real kubelet
// reports in PodResources dynamic_resources to the GPU's processes pod by pod: the claim's dra_* labels on each
// pod's gpu_allocation_info, the pod without a process idle while the other keeps the GPU busy, and only the pod
// outside the claim using the GPU unrequested. It returns the workloads it added, with work.
func testDRA(t *testing.T, c *cluster, prom string, plugin *draplugin.Plugin, image string,
	pods map[string]*corev1.Pod, work []*workload) []*workload {
	var names []string
	for _, g := range nodeGPUs {
		if slices.Contains(draGPUs, g.uuid) {
			names = append(names, fmt.Sprintf("gpu-%d", g.minor))
		}
	}
	testkit.WaitFor(t, 60*time.Second, "the kubelet to register the DRA plugin", plugin.Registered)
	var published []string
	sliceQuery := "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=" + url.QueryEscape("spec.nodeName="+nodeName)
	testkit.WaitFor(t, 60*time.Second, "the DRA plugin's ResourceSlice", func() bool {
		var list resourceapi.ResourceSliceList
		if c.kube.get(sliceQuery, &list) != nil {
			return false
		}
		published = nil
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				if s.Spec.Driver == draplugin.DriverName && s.Spec.Pool.Name == nodeName {
					published = append(published, d.Name)
				}
			}
		}
		slices.Sort(published)
		return slices.Equal(published, names)
	})
	if err := plugin.Err(); err != nil {
		t.Errorf("the DRA plugin reported: %v", err)
	}

	// NVIDIA's DeviceClass, and a claim on one GPU of it that two pods share.
	class := resourceapi.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: draplugin.DriverName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{
			{CEL: &resourceapi.CELDeviceSelector{Expression: draplugin.DeviceClassExpression}}}},
	}
	if err := c.kube.do("POST", "/apis/resource.k8s.io/v1/deviceclasses", class, nil); err != nil {
		t.Fatal(err)
	}
	claim := resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: draClaim, Namespace: workNS},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: draplugin.DriverName},
		}}}},
	}
	claimPath := "/apis/resource.k8s.io/v1/namespaces/" + workNS + "/resourceclaims"
	if err := c.kube.do("POST", claimPath, claim, nil); err != nil {
		t.Fatal(err)
	}
	claimed := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: new(draClaim)}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		return p
	}
	cpu := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
	for _, p := range []*corev1.Pod{
		claimed(newPod("dra-busy", image, container(draContainer, image, cpu, nil))),
		claimed(newPod("dra-idle", image, container(draContainer, image, nil, nil))),
		newPod("dra-squatter", image, container(draContainer, image, nil, nil)),
	} {
		createPod(t, c, p)
	}
	for _, name := range []string{"dra-busy", "dra-idle", "dra-squatter"} {
		pods[name] = waitRunning(t, c, name)
	}

	// The scheduler allocated one of the plugin's GPUs to the claim, and reserved it for both pods.
	if err := c.kube.get(claimPath+"/"+draClaim, &claim); err != nil {
		t.Fatal(err)
	}
	alloc := claim.Status.Allocation
	if alloc == nil || len(alloc.Devices.Results) != 1 {
		t.Fatalf("claim %s: want one allocated device, status %s", draClaim, dump(claim.Status))
	}
	res := alloc.Devices.Results[0]
	if res.Driver != draplugin.DriverName || res.Pool != nodeName || !slices.Contains(names, res.Device) {
		t.Fatalf("claim %s: allocated %s/%s/%s, want a device of %v in pool %s of %s", draClaim, res.Driver, res.Pool,
			res.Device, names, nodeName, draplugin.DriverName)
	}
	var reserved []string
	for _, r := range claim.Status.ReservedFor {
		reserved = append(reserved, r.Name)
	}
	slices.Sort(reserved)
	if !slices.Equal(reserved, []string{"dra-busy", "dra-idle"}) {
		t.Errorf("claim %s is reserved for %v, want dra-busy and dra-idle", draClaim, reserved)
	}
	index, uuid := -1, ""
	for i, g := range nodeGPUs {
		if fmt.Sprintf("gpu-%d", g.minor) == res.Device {
			index, uuid = i, g.uuid
		}
	}
	t.Logf("the scheduler allocated %s (GPU %d, %s) to claim %s/%s", res.Device, index, uuid, workNS, draClaim)

	// The kubelet prepared the claim through the plugin, and reports it for each container that uses it.
	if got, want := plugin.Prepared(), []draplugin.Prepared{{Namespace: workNS, Name: draClaim, Devices: []string{res.Device}}}; !equalPrepared(got, want) {
		t.Errorf("the DRA plugin prepared %v, want %v", got, want)
	}
	wantDynamic := fmt.Sprintf("%s/%s %s/%s/%s", workNS, draClaim, draplugin.DriverName, nodeName, res.Device)
	dynamic := podResourcesClaims(t, c)
	for _, key := range []string{"dra-busy/" + draContainer, "dra-idle/" + draContainer} {
		if got := dynamic[key]; !slices.Equal(got, []string{wantDynamic}) {
			t.Errorf("the kubelet's PodResources dynamic_resources of %s: %v, want [%s]", key, got, wantDynamic)
		}
	}
	if got := dynamic["dra-squatter/"+draContainer]; len(got) != 0 {
		t.Errorf("the kubelet's PodResources dynamic_resources of dra-squatter: %v, want none", got)
	}

	// dra-busy and dra-squatter run on the claim's GPU; dra-idle holds it and runs nothing.
	added := []*workload{
		{pod: "dra-busy", container: draContainer, qos: corev1.PodQOSBurstable, gpu: uuid},
		{pod: "dra-idle", container: draContainer, qos: corev1.PodQOSBestEffort},
		{pod: "dra-squatter", container: draContainer, qos: corev1.PodQOSBestEffort, gpu: uuid},
	}
	fillWorkloads(t, c, pods, added)
	work = append(work, added...)
	writeNode(t, c, work)

	// One gpu_allocation_info per pod of the claim, with the claim as the kubelet reports it.
	allocation := func(pod string) map[string]string {
		return map[string]string{"gpu": strconv.Itoa(index), "uuid": uuid, "gpu_instance": "", "compute_instance": "",
			"namespace": workNS, "pod": pod, "container": draContainer, "resource": draplugin.DriverName,
			"dra_claim_name": draClaim, "dra_claim_namespace": workNS, "dra_driver_name": draplugin.DriverName,
			"dra_pool_name": nodeName, "dra_device_name": res.Device, "instance": nodeName, "job": "gpu-pod-exporter"}
	}
	checkSeries(t, prom, `gpu_allocation_info{resource="gpu.nvidia.com"}`, map[string]float64{
		labelSet(allocation("dra-busy")): 1, labelSet(allocation("dra-idle")): 1})
	// Idleness is judged per pod: dra-idle's allocation has no process while dra-busy's GPU is busy.
	checkSeries(t, prom, `gpu_allocation_processes{resource="gpu.nvidia.com"}`, map[string]float64{
		labelSet(allocation("dra-busy")): 1, labelSet(allocation("dra-idle")): 0})
	// So is unrequested use: the pods of the claim hold its GPU; dra-squatter, on the same GPU, does not.
	checkSeries(t, prom, `gpu_unrequested_use{pod=~"dra-.*"}`, map[string]float64{
		labelSet(map[string]string{"gpu": strconv.Itoa(index), "uuid": uuid, "gpu_instance": "", "compute_instance": "",
			"namespace": workNS, "pod": "dra-squatter", "container": draContainer, "instance": nodeName,
			"job": "gpu-pod-exporter"}): 1})
	return work
}

// checkSeries waits until the query returns exactly the series of want (each series' labels, less
// kubernetes_pod_name, as labelSet writes them) with its value, and fails the test with what it last returned
// otherwise.
func checkSeries(t *testing.T, prom, query string, want map[string]float64) {
	t.Helper()
	var got map[string]float64
	problems := testkit.Eventually(30*time.Second, func() []string {
		res, err := e2eutil.TryQuery(prom, query)
		if err != nil {
			return []string{err.Error()}
		}
		got = map[string]float64{}
		for _, s := range res {
			labels := s.Metric
			delete(labels, "__name__")
			delete(labels, "kubernetes_pod_name")
			got[labelSet(labels)] = s.Value
		}
		var problems []string
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				problems = append(problems, fmt.Sprintf("want %s = %g", k, v))
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				problems = append(problems, "unexpected "+k)
			}
		}
		return problems
	})
	if problems != nil {
		t.Errorf("%s:\n%s\nPrometheus has %v", query, strings.Join(problems, "\n"), got)
	}
}

// labelSet writes labels as PromQL does, sorted: {a="1", b="2"}. An empty label is left out: Prometheus does not
// store one.
func labelSet(labels map[string]string) string {
	var pairs []string
	for k, v := range labels {
		if v != "" {
			pairs = append(pairs, fmt.Sprintf("%s=%q", k, v))
		}
	}
	slices.Sort(pairs)
	return "{" + strings.Join(pairs, ", ") + "}"
}

func equalPrepared(a, b []draplugin.Prepared) bool {
	return slices.EqualFunc(a, b, func(x, y draplugin.Prepared) bool {
		return x.Namespace == y.Namespace && x.Name == y.Name && slices.Equal(x.Devices, y.Devices)
	})
}

// podResourcesClaims is the kubelet's DRA devices of the workload namespace's containers, keyed pod/container, each
// as "claim namespace/name driver/pool/device".
func podResourcesClaims(t *testing.T, c *cluster) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range listPodResources(t, c) {
		for _, ctr := range p.GetContainers() {
			key := p.GetName() + "/" + ctr.GetName()
			for _, dr := range ctr.GetDynamicResources() {
				for _, r := range dr.GetClaimResources() {
					out[key] = append(out[key], fmt.Sprintf("%s/%s %s/%s/%s", dr.GetClaimNamespace(), dr.GetClaimName(),
						r.GetDriverName(), r.GetPoolName(), r.GetDeviceName()))
				}
			}
		}
	}
	return out
}
