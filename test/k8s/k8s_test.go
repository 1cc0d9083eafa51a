//go:build k8s

package k8s

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/deviceplugin"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

func TestMain(m *testing.M) {
	if env := os.Getenv(postRenderEnv); env != "" {
		var p patch
		if err := json.Unmarshal([]byte(env), &p); err != nil {
			fmt.Fprintln(os.Stderr, "post-renderer:", err)
			os.Exit(1)
		}
		if err := postRender(os.Stdin, os.Stdout, p); err != nil {
			fmt.Fprintln(os.Stderr, "post-renderer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	flag.Parse()
	os.Exit(m.Run())
}

const (
	workNS     = "gpu-work"
	exporterNS = "gpu-pod-exporter"
	release    = "gpe"
)

// The simulated node's GPUs: three whole GPUs advertised as nvidia.com/gpu, one shared by time-slicing, advertised
// as sharedReplicas replicas of nvidia.com/gpu.shared (NVIDIA's plugin with renameByDefault), and two published by
// the DRA plugin (gpu.nvidia.com), which names them by minor number.
const (
	gpuA      = "GPU-6f1c0a00-0000-4000-8000-00000000000a"
	gpuB      = "GPU-6f1c0a00-0000-4000-8000-00000000000b"
	gpuC      = "GPU-6f1c0a00-0000-4000-8000-00000000000c"
	gpuShared = "GPU-6f1c0a00-0000-4000-8000-00000000000d"
	gpuDRA0   = "GPU-6f1c0a00-0000-4000-8000-00000000000e"
	gpuDRA1   = "GPU-6f1c0a00-0000-4000-8000-00000000000f"
)

var wholeGPUs = []string{gpuA, gpuB, gpuC}

// nodeGPUs is the node file's GPUs in NVML's order, with their minor numbers. The DRA GPUs come last but have the
// lowest minors (gpu-0, gpu-1): a DRA device name mapped by index instead of minor lands on a device plugin GPU.
var nodeGPUs = []struct {
	uuid  string
	minor int
}{{gpuA, 2}, {gpuB, 3}, {gpuC, 4}, {gpuShared, 5}, {gpuDRA0, 0}, {gpuDRA1, 1}}

// The simulated GPUs' model, memory and versions, which the node file and the DRA plugin's ResourceSlice share.
const (
	gpuProduct     = "NVIDIA H100 80GB HBM3"
	gpuMemoryBytes = 85520809984
)

// pciBusID is the PCI address of the i-th GPU of nodeGPUs.
func pciBusID(i int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x18+i) }

// workload is a container of a test pod and what the test expects of it.
type workload struct {
	pod, container string
	qos            corev1.PodQOSClass
	uid, id        string  // pod UID and container ID, from the API server
	pid            int     // the container's host PID
	gpu            string  // the UUID the node file puts its process on; "" for none
	sm             float64 // its process's SM utilization
}

func TestKubernetes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: starts containerd, etcd, the Kubernetes control plane and a kubelet")
	}
	begin := time.Now()
	bin := k8sBinaries(t)
	e2eutil.Helm(t)
	t.Logf("Kubernetes binaries in %s; helm ready (%s)", bin, time.Since(begin).Round(time.Second))

	// A run that was killed may have left its daemons and containers behind.
	script(t, 3*time.Minute, "teardown-runtimes.sh")
	runtimes := startRuntimes(t)
	t.Cleanup(func() {
		if os.Getenv("GPE_E2E_KEEP") == "1" {
			t.Logf("GPE_E2E_KEEP=1: leaving everything running; clean up with E2E_WORK=%s scripts/e2e/teardown-runtimes.sh", workDir())
			return
		}
		script(t, 3*time.Minute, "teardown-runtimes.sh")
	})
	buildImage(t, runtimes)

	c := startCluster(t, workDir(), bin, runtimes)

	// The fake NVIDIA device plugins register with the kubelet, which then reports their devices as capacity.
	pluginDir := "/var/lib/kubelet/device-plugins" // fixed: the kubelet's --root-dir does not move it
	ctx := context.Background()
	whole, err := deviceplugin.Start(ctx, pluginDir, "nvidia.com/gpu", wholeGPUs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(whole.Stop)
	// Time-slicing replicas of one GPU: the sharing pod's two containers, and the autoscaled Deployments' pods.
	shared, err := deviceplugin.Start(ctx, pluginDir, "nvidia.com/gpu.shared", deviceplugin.Replicas(gpuShared, sharedReplicas))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shared.Stop)
	// The fake DRA plugin registers and publishes its ResourceSlice while the rest starts; testDRA waits for both.
	dra := startDRAPlugin(t, c)
	testkit.WaitFor(t, 60*time.Second, "the node's GPU capacity", func() bool {
		var node nodeStatus
		return c.kube.get("/api/v1/nodes/"+nodeName, &node) == nil &&
			node.Status.Capacity["nvidia.com/gpu"] == "3" && node.Status.Capacity["nvidia.com/gpu.shared"] == strconv.Itoa(sharedReplicas)
	})
	writeNode(t, c, nil) // GPUs without processes until the pods run

	// The workloads, one per QoS class, scheduled by kube-scheduler and started by the kubelet.
	createNamespace(t, c, workNS, nil)
	image := runtimes["GPE_E2E_IMAGE"]
	cpu := func(m string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(m)}
	}
	gpus := func(name string, n int64) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceName(name): *resource.NewQuantity(n, resource.DecimalSI)}
	}
	merge := func(ls ...corev1.ResourceList) corev1.ResourceList {
		out := corev1.ResourceList{}
		for _, l := range ls {
			for k, v := range l {
				out[k] = v
			}
		}
		return out
	}
	guaranteed := merge(cpu("100m"), corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")}, gpus("nvidia.com/gpu", 1))
	specs := map[string]*corev1.Pod{
		"trainer": newPod("trainer", image, container("trainer", image, guaranteed, guaranteed)),
		"sharing": newPod("sharing", image,
			container("worker-a", image, cpu("10m"), gpus("nvidia.com/gpu.shared", 1)),
			container("worker-b", image, cpu("10m"), gpus("nvidia.com/gpu.shared", 1))),
		"notebook": newPod("notebook", image, container("notebook", image, nil, nil)),
		"idle":     newPod("idle", image, container("idle", image, cpu("10m"), gpus("nvidia.com/gpu", 1))),
	}
	for _, name := range []string{"trainer", "sharing", "notebook", "idle"} {
		createPod(t, c, specs[name])
	}
	pods := map[string]*corev1.Pod{}
	for name := range specs {
		pods[name] = waitRunning(t, c, name)
	}

	// Where the kubelet put the GPUs, from its own PodResources API.
	allocs := podResourcesList(t, c)
	t.Logf("the kubelet's PodResources: %v", allocs)
	trainerGPU, idleGPU := uuidOf(t, allocs, "trainer/trainer"), uuidOf(t, allocs, "idle/idle")
	for _, key := range []string{"sharing/worker-a", "sharing/worker-b"} {
		if got := uuidOf(t, allocs, key); got != gpuShared {
			t.Fatalf("%s got %s, want a replica of %s", key, got, gpuShared)
		}
	}
	free := slices.DeleteFunc(slices.Clone(wholeGPUs), func(u string) bool { return u == trainerGPU || u == idleGPU })
	if len(free) != 1 {
		t.Fatalf("the kubelet allocated %s and %s of %v", trainerGPU, idleGPU, wholeGPUs)
	}
	work := []*workload{
		{pod: "trainer", container: "trainer", qos: corev1.PodQOSGuaranteed, gpu: trainerGPU},
		{pod: "sharing", container: "worker-a", qos: corev1.PodQOSBurstable, gpu: gpuShared},
		{pod: "sharing", container: "worker-b", qos: corev1.PodQOSBurstable, gpu: gpuShared},
		{pod: "notebook", container: "notebook", qos: corev1.PodQOSBestEffort, gpu: free[0]}, // never requested a GPU
		{pod: "idle", container: "idle", qos: corev1.PodQOSBurstable},                        // its GPU stays idle
	}
	fillWorkloads(t, c, pods, work)
	writeNode(t, c, work)

	// The exporter, installed with helm into its own namespace, labelled as docs/install.md says.
	createNamespace(t, c, exporterNS, map[string]string{"pod-security.kubernetes.io/enforce": "privileged"})
	exporterPort, _ := strconv.Atoi(port(t))
	healthPort, _ := strconv.Atoi(port(t))
	helmInstall(t, c, exporterPort, healthPort)
	exporter := waitDaemonSetPod(t, c)
	exporterAddr := fmt.Sprintf("127.0.0.1:%d", exporterPort)
	t.Logf("exporter pod %s ready; node up in %s", exporter.Name, time.Since(begin).Round(time.Second))

	// Prometheus finds the exporter's pod through the API server, as kube-prometheus would.
	prom := e2eutil.StartPrometheus(t, prometheusConfig(t, c, exporter))
	testkit.WaitFor(t, 60*time.Second, "Prometheus to scrape the exporter's pod", func() bool {
		res, err := e2eutil.TryQuery(prom, `up{job="gpu-pod-exporter"} == 1`)
		return err == nil && len(res) == 1 && res[0].Metric["kubernetes_pod_name"] == exporter.Name
	})

	t.Run("attribution", func(t *testing.T) {
		for _, w := range work {
			if w.gpu == "" {
				continue
			}
			checkCgroup(t, w)
			checkProcess(t, prom, w)
		}
	})

	t.Run("allocations", func(t *testing.T) {
		want := map[string]bool{}
		for key, devs := range allocs {
			for _, d := range devs {
				uuid, _, _ := strings.Cut(d.id, "::")
				want[fmt.Sprintf("%s/%s/%s/%s", workNS, key, d.resource, uuid)] = true
			}
		}
		var got map[string]bool
		testkit.WaitFor(t, 30*time.Second, "gpu_allocation_info to match the kubelet's PodResources", func() bool {
			got = map[string]bool{}
			res, err := e2eutil.TryQuery(prom, `gpu_allocation_info`)
			if err != nil {
				return false
			}
			for _, s := range res {
				m := s.Metric
				got[fmt.Sprintf("%s/%s/%s/%s/%s", m["namespace"], m["pod"], m["container"], m["resource"], m["uuid"])] = true
			}
			return len(got) == len(want) && len(want) == 4
		})
		for k := range want {
			if !got[k] {
				t.Errorf("gpu_allocation_info lacks %s; it has %v", k, got)
			}
		}
		// The kubelet's allocations went through the device plugins' Allocate, one call per container.
		var called, reported []string
		for _, ids := range append(whole.Allocations(), shared.Allocations()...) {
			called = append(called, strings.Join(ids, ","))
		}
		for _, devs := range allocs {
			for _, d := range devs {
				reported = append(reported, d.id)
			}
		}
		slices.Sort(called)
		slices.Sort(reported)
		if !slices.Equal(called, reported) {
			t.Errorf("the device plugins allocated %v, the kubelet reports %v", called, reported)
		}
		procs := e2eutil.ByLabel(e2eutil.Query(t, prom, `sum by (pod) (gpu_allocation_processes)`), "pod")
		if procs["idle"] != 0 || len(procs) != 3 {
			t.Errorf("gpu_allocation_processes by pod = %v, want idle at 0 (and trainer, sharing)", procs)
		}
		if procs["trainer"] != 1 || procs["sharing"] < 2 {
			t.Errorf("gpu_allocation_processes by pod = %v, want trainer 1, sharing 2 or more", procs)
		}
	})

	t.Run("unrequested", func(t *testing.T) {
		var res []e2eutil.Sample
		testkit.WaitFor(t, 30*time.Second, "gpu_unrequested_use", func() bool {
			var err error
			res, err = e2eutil.TryQuery(prom, `gpu_unrequested_use == 1`)
			return err == nil && len(res) > 0
		})
		for _, s := range res {
			if s.Metric["pod"] != "notebook" || s.Metric["container"] != "notebook" || s.Metric["uuid"] != free[0] {
				t.Errorf("gpu_unrequested_use flags %v; only notebook/notebook on %s uses a GPU it did not request", s.Metric, free[0])
			}
		}
		if n := len(e2eutil.Query(t, prom, `gpu_unrequested_use{pod!="notebook"}`)); n != 0 {
			t.Errorf("%d gpu_unrequested_use series for pods other than notebook", n)
		}
	})

	t.Run("recreated-pod", func(t *testing.T) {
		old := *work[3]
		deletePod(t, c, "notebook")
		createPod(t, c, specs["notebook"])
		pods["notebook"] = waitRunning(t, c, "notebook")
		fillWorkloads(t, c, pods, work)
		if work[3].uid == old.uid {
			t.Fatalf("the recreated pod kept UID %s", old.uid)
		}
		writeNode(t, c, work)
		// The first reading that starts after the node file changed names the new pod. A scrape may join a reading
		// that Prometheus' scrape started before the change (concurrent scrapes share one), so the scrape after it
		// is the one that must.
		var body string
		for i := 0; i < 2; i++ {
			var err error
			if body, err = e2eutil.Get("http://" + exporterAddr + "/metrics"); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(processLine(body, work[3].pid), work[3].uid) {
				break
			}
		}
		if strings.Contains(body, old.uid) {
			t.Errorf("the first scrape after the pod was recreated still has its old UID %s", old.uid)
		}
		line := processLine(body, work[3].pid)
		for _, want := range []string{`pod="notebook"`, `pod_uid="` + work[3].uid + `"`, `container_id="` + work[3].id + `"`} {
			if !strings.Contains(line, want) {
				t.Errorf("the first scrape after the pod was recreated: %q lacks %s", line, want)
			}
		}
		checkProcess(t, prom, work[3])
	})

	t.Run("containerd-restart", func(t *testing.T) {
		before := getPod(t, c, exporterNS, exporter.Name)
		restartContainerd(t, c)
		// A pod started after the restart: its names can only come from the new containerd.
		createPod(t, c, newPod("after-restart", image, container("after-restart", image, nil, nil)))
		pods["after-restart"] = waitRunning(t, c, "after-restart")
		late := &workload{pod: "after-restart", container: "after-restart", qos: corev1.PodQOSBestEffort, gpu: free[0]}
		work = append(work, late)
		fillWorkloads(t, c, pods, work)
		writeNode(t, c, work)
		for _, w := range work {
			if w.gpu != "" {
				checkProcess(t, prom, w)
			}
		}
		after := getPod(t, c, exporterNS, exporter.Name)
		if after.UID != before.UID || restarts(after) != restarts(before) ||
			after.Status.ContainerStatuses[0].ContainerID != before.Status.ContainerStatuses[0].ContainerID {
			t.Errorf("the exporter's pod restarted: before %s %s (%d restarts), after %s %s (%d restarts)",
				before.UID, before.Status.ContainerStatuses[0].ContainerID, restarts(before),
				after.UID, after.Status.ContainerStatuses[0].ContainerID, restarts(after))
		}
	})

	t.Run("dra", func(t *testing.T) {
		work = testDRA(t, c, prom, dra, image, pods, work)
	})

	t.Run("autoscaling", func(t *testing.T) {
		testAutoscaling(t, c, prom, image, work)
	})

	t.Run("privileges", func(t *testing.T) {
		checkPrivileges(t, c, getPod(t, c, exporterNS, exporter.Name))
	})
	c.alive(t)
	t.Logf("done in %s", time.Since(begin).Round(time.Second))
}

// --- pods -----------------------------------------------------------------------------------------------------------

func newPod(name, image string, containers ...corev1.Container) *corev1.Pod {
	no, grace := false, int64(1)
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workNS, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			HostNetwork:                   true, // no CNI here
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    containers,
		},
	}
}

func container(name, image string, requests, limits corev1.ResourceList) corev1.Container {
	return corev1.Container{
		Name: name, Image: image, ImagePullPolicy: corev1.PullNever, Command: []string{"/bin/sleep", "86400"},
		Resources: corev1.ResourceRequirements{Requests: requests, Limits: limits},
	}
}

func createNamespace(t *testing.T, c *cluster, name string, labels map[string]string) {
	t.Helper()
	ns := corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := c.kube.do("POST", "/api/v1/namespaces", ns, nil); err != nil {
		t.Fatal(err)
	}
	// Pods need the namespace's default service account, which the controller-manager creates.
	testkit.WaitFor(t, 60*time.Second, "the default service account of "+name, func() bool {
		return c.kube.get("/api/v1/namespaces/"+name+"/serviceaccounts/default", nil) == nil
	})
}

func createPod(t *testing.T, c *cluster, p *corev1.Pod) {
	t.Helper()
	if err := c.kube.do("POST", "/api/v1/namespaces/"+p.Namespace+"/pods", p, nil); err != nil {
		t.Fatal(err)
	}
}

func getPod(t *testing.T, c *cluster, ns, name string) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := c.kube.get("/api/v1/namespaces/"+ns+"/pods/"+name, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func deletePod(t *testing.T, c *cluster, name string) {
	t.Helper()
	path := "/api/v1/namespaces/" + workNS + "/pods/" + name
	if err := c.kube.do("DELETE", path, nil, nil); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 60*time.Second, "pod "+name+" to be gone", func() bool {
		_, err := c.kube.raw("GET", path, nil)
		return err != nil && strings.Contains(err.Error(), "404")
	})
}

// waitRunning waits until every container of the pod runs, and returns the pod.
func waitRunning(t *testing.T, c *cluster, name string) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	ok := false
	deadline := time.Now().Add(120 * time.Second)
	for !ok {
		c.alive(t)
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not running after 120s: %s", name, dump(p.Status))
		}
		time.Sleep(300 * time.Millisecond)
		if err := c.kube.get("/api/v1/namespaces/"+workNS+"/pods/"+name, &p); err != nil {
			continue
		}
		ok = p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == len(p.Spec.Containers)
		for _, s := range p.Status.ContainerStatuses {
			ok = ok && s.State.Running != nil && s.ContainerID != ""
		}
	}
	return &p
}

// waitDaemonSetPod waits for the DaemonSet's pod on the node to be ready, and returns it.
func waitDaemonSetPod(t *testing.T, c *cluster) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	var list corev1.PodList
	deadline := time.Now().Add(180 * time.Second)
	for pod == nil {
		c.alive(t)
		if time.Now().After(deadline) {
			t.Fatalf("no ready exporter pod after 180s: %s", dump(list.Items))
		}
		time.Sleep(500 * time.Millisecond)
		if err := c.kube.get("/api/v1/namespaces/"+exporterNS+"/pods?labelSelector="+
			url.QueryEscape("app.kubernetes.io/name=gpu-pod-exporter"), &list); err != nil {
			continue
		}
		for i, p := range list.Items {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && p.Spec.NodeName == nodeName {
					pod = &list.Items[i]
				}
			}
		}
	}
	return pod
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// fillWorkloads sets each workload's pod UID, container ID and host PID from the API server and containerd.
func fillWorkloads(t *testing.T, c *cluster, pods map[string]*corev1.Pod, work []*workload) {
	t.Helper()
	pids := taskPIDs(t, c)
	for _, w := range work {
		p := pods[w.pod]
		if p.Status.QOSClass != w.qos {
			t.Errorf("pod %s has QoS class %s, want %s", w.pod, p.Status.QOSClass, w.qos)
		}
		w.uid = string(p.UID)
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == w.container {
				_, w.id, _ = strings.Cut(s.ContainerID, "://")
			}
		}
		if w.pid = pids[w.id]; w.pid == 0 {
			t.Fatalf("no running containerd task for %s/%s (container %q)", w.pod, w.container, w.id)
		}
	}
}

// --- the node file, PodResources, Prometheus ------------------------------------------------------------------------

// writeNode writes the simulated node file: the GPUs, each workload's process on its GPU. It is replaced
// atomically in its directory, which the exporter's pod mounts.
func writeNode(t *testing.T, c *cluster, work []*workload) {
	t.Helper()
	if err := writeNodeFile(c, work); err != nil {
		t.Fatal(err)
	}
}

// writeNodeFile is writeNode for a caller that is not the test's goroutine. Each GPU's utilization is its processes'
// SM utilization added up, as the driver's roughly is under time-slicing; the shared GPU has a performance monitor
// (as on an H100) whose engine activity is a little above it.
func writeNodeFile(c *cluster, work []*workload) error {
	var b strings.Builder
	b.WriteString("driver_version: \"580.95.05\"\ncuda_version: \"13.0\"\ngpus:\n")
	for i, g := range nodeGPUs {
		util := 0.0
		for _, w := range work {
			if w.gpu == g.uuid {
				util += w.sm
			}
		}
		util = min(util, 1)
		fmt.Fprintf(&b, "  - uuid: %s\n    name: %s\n    pci_bus_id: %q\n    minor_number: %d\n"+
			"    memory_total_bytes: %d\n    utilization_ratio: %g\n", g.uuid, gpuProduct, pciBusID(i), g.minor, gpuMemoryBytes, util)
		if g.uuid == gpuShared {
			fmt.Fprintf(&b, "    profiling: {graphics_engine_active: %g}\n", sharedEngineActive(util))
		}
		b.WriteString("    processes:\n")
		n := 0
		for _, w := range work {
			if w.gpu == g.uuid {
				fmt.Fprintf(&b, "      - {pid: %d, type: compute, used_memory_bytes: %d, sm_utilization_ratio: %g}\n", w.pid, (n+1)<<30, w.sm)
				n++
			}
		}
		if n == 0 {
			b.WriteString("      []\n")
		}
	}
	dir := filepath.Join(c.dir, "node")
	tmp := filepath.Join(dir, ".node.yaml")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "node.yaml"))
}

// sharedEngineActive is the shared GPU's engine activity (DCGM_FI_PROF_GR_ENGINE_ACTIVE) at a utilization.
func sharedEngineActive(util float64) float64 { return min(1, util*1.1) }

type device struct{ resource, id string }

// listPodResources asks the kubelet's PodResources API for the resources of the workload namespace's pods.
func listPodResources(t *testing.T, c *cluster) []*podresources.PodResources {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(c.kubelet, "pod-resources/kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := podresources.NewPodResourcesListerClient(conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("PodResources List: %v", err)
	}
	return slices.DeleteFunc(resp.GetPodResources(), func(p *podresources.PodResources) bool { return p.GetNamespace() != workNS })
}

// podResourcesList is the kubelet's device plugin devices of the workload namespace's containers, keyed
// pod/container.
func podResourcesList(t *testing.T, c *cluster) map[string][]device {
	t.Helper()
	out := map[string][]device{}
	for _, p := range listPodResources(t, c) {
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					key := p.GetName() + "/" + ctr.GetName()
					out[key] = append(out[key], device{d.GetResourceName(), id})
				}
			}
		}
	}
	return out
}

// uuidOf is the GPU UUID of the one device the kubelet allocated to pod/container.
func uuidOf(t *testing.T, allocs map[string][]device, key string) string {
	t.Helper()
	if len(allocs[key]) != 1 {
		t.Fatalf("the kubelet allocated %v to %s, want one device", allocs[key], key)
	}
	uuid, _, _ := strings.Cut(allocs[key][0].id, "::")
	return uuid
}

// prometheusConfig scrapes the exporter's pod, found through the API server, labelled like the chart's
// ServiceMonitor labels its targets (job gpu-pod-exporter, instance the node, honor_labels). Debian's Prometheus is
// built without Kubernetes service discovery, so the test does the discovery (the DaemonSet's pod, its metrics
// port and node) and hands the target over through file_sd; the pod is on the host's network, reached over loopback.
func prometheusConfig(t *testing.T, c *cluster, pod *corev1.Pod) string {
	var port int32
	for _, p := range pod.Spec.Containers[0].Ports {
		if p.Name == "metrics" {
			port = p.ContainerPort
		}
	}
	targets, err := json.Marshal([]map[string]any{{
		"targets": []string{fmt.Sprintf("127.0.0.1:%d", port)},
		"labels":  map[string]string{"instance": pod.Spec.NodeName, "kubernetes_pod_name": pod.Name},
	}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(c.dir, "targets.json")
	write(t, file, string(targets))
	return fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: gpu-pod-exporter
    honor_labels: true
    file_sd_configs: [{files: [%q]}]
`, file)
}

// checkProcess waits until Prometheus has the workload's process with every identity label right.
func checkProcess(t *testing.T, prom string, w *workload) {
	t.Helper()
	want := map[string]string{"namespace": workNS, "pod": w.pod, "container": w.container, "pod_uid": w.uid,
		"container_id": w.id, "uuid": w.gpu, "instance": nodeName}
	var got []e2eutil.Sample
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		got, err = e2eutil.TryQuery(prom, fmt.Sprintf(`gpu_process_memory_used_bytes{pid="%d"}`, w.pid))
		if err == nil && len(got) == 1 && matches(got[0].Metric, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s/%s (%s, pid %d): want one series with %v, Prometheus has %v", w.pod, w.container, w.qos, w.pid, want, got)
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func matches(m map[string]string, want map[string]string) bool {
	for k, v := range want {
		if m[k] != v {
			return false
		}
	}
	return true
}

// processLine is the gpu_process_memory_used_bytes line of pid in an exposition.
func processLine(body string, pid int) string {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "gpu_process_memory_used_bytes{") && strings.Contains(line, `pid="`+strconv.Itoa(pid)+`"`) {
			return line
		}
	}
	return ""
}

// checkCgroup checks that the kubelet put the container where a cgroupfs kubelet puts each QoS class.
func checkCgroup(t *testing.T, w *workload) {
	t.Helper()
	parent := map[corev1.PodQOSClass]string{
		corev1.PodQOSGuaranteed: "/kubepods/", corev1.PodQOSBurstable: "/kubepods/burstable/", corev1.PodQOSBestEffort: "/kubepods/besteffort/",
	}[w.qos]
	want := parent + "pod" + w.uid + "/" + w.id
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", w.pid))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && strings.Contains(f[1], "memory") {
			if f[2] != want {
				t.Errorf("%s/%s (%s): memory cgroup %s, want %s", w.pod, w.container, w.qos, f[2], want)
			}
			found++
		}
	}
	if found != 1 {
		t.Errorf("%s/%s: no memory cgroup in /proc/%d/cgroup:\n%s", w.pod, w.container, w.pid, b)
	}
}

// restartContainerd stops the test's containerd and starts it again with setup-runtimes.sh. Its containers keep
// running under their shims.
func restartContainerd(t *testing.T, c *cluster) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(workDir(), "pids/containerd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "containerd to exit", func() bool { return syscall.Kill(pid, 0) != nil })
	script(t, 2*time.Minute, "setup-runtimes.sh")
	t.Log("containerd restarted")
}
