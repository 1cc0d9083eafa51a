//go:build k8s

package k8s

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// Three Deployments share the time-sliced GPU, each with a KEDA ScaledObject:
//   - busy and idle scale on their own pods' SM use, with deploy/keda/scaledobject.yaml's query;
//   - perGPU, idle too, scales on the signal of every per-GPU guide: the GPU's utilization on each pod the kubelet
//     allocated the GPU to, which is what dcgm-exporter's DCGM_FI_DEV_GPU_UTIL{pod=...} gives a time-sliced GPU.
//
// Only busy does work. It must scale 1 -> maxReplicas and back; idle must stay at 1 throughout; perGPU scales with
// busy, which is the misfire per-pod metrics avoid.
const (
	busyApp, idleApp, perGPUApp = "inference-busy", "inference-idle", "inference-pergpu"
	maxReplicas                 = 3
	// Each pod should use this much of a GPU's time (the ScaledObject's threshold, an AverageValue).
	perPodTarget = 0.3
	// The busy Deployment's SM use, spread over its pods as a load balancer would: ceil(0.8 / 0.3) = 3 replicas,
	// then ceil(0.05 / 0.3) = 1.
	busyLoad, quietLoad = 0.8, 0.05
	// The time-slicing replicas of the shared GPU: the sharing pod's two containers, idle's pod, and busy's and
	// perGPU's pods at their most, and one to spare.
	sharedReplicas = 2 + 1 + 2*maxReplicas + 1
)

func testAutoscaling(t *testing.T, c *cluster, prom, image string, base []*workload) {
	startKEDA(t, c, kedaBinaries(t))

	// The node file follows the Deployments' pods as the HPA adds and removes them: each running pod gets a process
	// on the shared GPU, busy's pods the load between them.
	var load atomic.Value
	load.Store(0.0)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	var lastErr atomic.Value
	go func() {
		defer close(stopped)
		for {
			if err := writeAppNode(c, base, load.Load().(float64)); err != nil {
				lastErr.Store(err.Error())
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-stopped
		for _, app := range []string{busyApp, idleApp, perGPUApp} {
			c.kube.do("DELETE", "/apis/keda.sh/v1alpha1/namespaces/"+workNS+"/scaledobjects/"+app, nil, nil)
			c.kube.do("DELETE", "/apis/apps/v1/namespaces/"+workNS+"/deployments/"+app, metav1.DeleteOptions{
				TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "DeleteOptions"}, PropagationPolicy: ptr(metav1.DeletePropagationBackground)}, nil)
		}
		testkit.WaitFor(t, 90*time.Second, "the autoscaled Deployments' pods to be gone", func() bool {
			return len(appPods(c)) == 0
		})
		writeNode(t, c, base)
	})

	for _, app := range []string{busyApp, idleApp, perGPUApp} {
		createDeployment(t, c, app, image)
	}
	example := exampleScaledObject(t)
	createScaledObject(t, c, example, prom, busyApp, perPodQuery(example, busyApp))
	createScaledObject(t, c, example, prom, idleApp, perPodQuery(example, idleApp))
	createScaledObject(t, c, example, prom, perGPUApp, perGPUQuery(perGPUApp))

	// KEDA creates an HPA per ScaledObject; the HPA controller reads each one's metric through the aggregated API.
	testkit.WaitFor(t, 3*time.Minute, "the three HPAs to read their metric from KEDA", func() bool {
		c.alive(t)
		for _, app := range []string{busyApp, idleApp, perGPUApp} {
			if _, ok := hpaMetric(c, app); !ok {
				return false
			}
		}
		return true
	})
	if v, _ := hpaMetric(c, idleApp); v != 0 {
		t.Errorf("idle's HPA reads %v before any load, want 0", v)
	}
	if err, _ := lastErr.Load().(string); err != "" {
		t.Logf("the node file writer: %s", err)
	}

	// Busy gets to work: only busy, and perGPU on the per-GPU signal, scale up.
	load.Store(busyLoad)
	up := waitReplicas(t, c, "busy's load", map[string]int{busyApp: maxReplicas, perGPUApp: maxReplicas}, idleApp)
	t.Logf("scale up 1 -> %d: busy in %s, perGPU in %s after the load rose", maxReplicas, up[busyApp].Round(time.Second), up[perGPUApp].Round(time.Second))

	t.Run("contrast", func(t *testing.T) {
		// What the HPAs read (once they have read at the new replica count): busy's pods their load, idle's nothing.
		var busy, idle float64
		deadline := time.Now().Add(60 * time.Second)
		for {
			busy, _ = hpaMetric(c, busyApp)
			idle, _ = hpaMetric(c, idleApp)
			if math.Abs(busy-busyLoad) < 0.01 && idle == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		if math.Abs(busy-busyLoad) >= 0.01 || idle != 0 {
			t.Errorf("the HPAs read %v for busy, want its pods' SM use %v, and %v for idle, want 0", busy, busyLoad, idle)
		}
		// The same two questions asked of idle's pods in Prometheus: per pod, nothing; per GPU, busy's load on each.
		own := e2eutil.Query(t, prom, perPodQuery(example, idleApp))
		gpuWide := e2eutil.Query(t, prom, perGPUQuery(idleApp))
		if len(own) != 1 || own[0].Value != 0 || len(gpuWide) != 1 || math.Abs(gpuWide[0].Value-busyLoad) > 1e-9 {
			t.Errorf("idle's pod: its own SM use %v, want 0; the per-GPU signal %v, want %v: a per-GPU metric would scale it to %d",
				own, gpuWide, busyLoad, int(math.Ceil(busyLoad/perPodTarget)))
		}
	})

	t.Run("opencost", func(t *testing.T) {
		checkOpenCostUsage(t, prom)
	})

	// Busy's load falls: it, and perGPU with it, scale back to 1.
	load.Store(quietLoad)
	down := waitReplicas(t, c, "busy's load to fall", map[string]int{busyApp: 1, perGPUApp: 1}, idleApp)
	t.Logf("scale down %d -> 1: busy in %s, perGPU in %s after the load fell", maxReplicas, down[busyApp].Round(time.Second), down[perGPUApp].Round(time.Second))
}

// checkOpenCostUsage runs OpenCost's GPU usage query (its pkg/costmodel/allocation.go, over a 10 s window) on the
// node: each pod on the shared GPU is charged its SM share of the GPU's engine activity, busy's pods busy's work,
// the others nothing, and together the GPU's value.
func checkOpenCostUsage(t *testing.T, prom string) {
	const query = `avg(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{container!=""}[10s])) by (container, pod, namespace, cluster_id)`
	engine := sharedEngineActive(busyLoad)
	var got map[string]float64
	ok := false
	deadline := time.Now().Add(60 * time.Second)
	for !ok && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		res, err := e2eutil.TryQuery(prom, query)
		if err != nil {
			continue
		}
		got = map[string]float64{}
		busy, total := 0, 0.0
		ok = true
		for _, s := range res {
			got[s.Metric["pod"]+"/"+s.Metric["container"]] = s.Value
			total += s.Value
			switch {
			case strings.HasPrefix(s.Metric["pod"], busyApp+"-"):
				busy++
				ok = ok && math.Abs(s.Value-engine/maxReplicas) < 1e-6
			case s.Metric["namespace"] == workNS:
				ok = ok && s.Value == 0
			}
		}
		ok = ok && busy == maxReplicas && math.Abs(total-engine) < 1e-6
	}
	if !ok {
		t.Errorf("%s = %v; want %g for each of busy's %d pods, 0 for the other pods, %g in all", query, got, engine/maxReplicas, maxReplicas, engine)
	}
}

// waitReplicas waits until each Deployment of want has that many replicas, and checks all along that steady stays
// at 1. It returns how long each took.
func waitReplicas(t *testing.T, c *cluster, after string, want map[string]int, steady string) map[string]time.Duration {
	t.Helper()
	start := time.Now()
	took := map[string]time.Duration{}
	for len(took) < len(want) {
		c.alive(t)
		if time.Since(start) > 4*time.Minute {
			t.Fatalf("after %s, replicas %v after 4m, want %v; the HPAs:\n%s", after, replicasOf(c, want), want, hpaStatuses(c))
		}
		if n := replicas(c, steady); n != 1 {
			t.Fatalf("after %s, %s has %d replicas, want 1: its own pods do nothing; the HPAs:\n%s", after, steady, n, hpaStatuses(c))
		}
		for app, n := range want {
			if _, done := took[app]; !done && replicas(c, app) == n {
				took[app] = time.Since(start)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return took
}

// writeAppNode writes the node file with the base workloads and a process for each running pod of the autoscaled
// Deployments on the shared GPU, busy's pods sharing load.
func writeAppNode(c *cluster, base []*workload, load float64) error {
	pids, err := containerPIDs(c)
	if err != nil {
		return err
	}
	work := append([]*workload{}, base...)
	var busy []*workload
	for _, p := range appPods(c) {
		w := &workload{pod: p.Name, container: p.Spec.Containers[0].Name, gpu: gpuShared}
		_, w.id, _ = strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
		if w.pid = pids[w.id]; w.pid == 0 {
			continue
		}
		if p.Labels["app"] == busyApp {
			busy = append(busy, w)
		}
		work = append(work, w)
	}
	for _, w := range busy {
		w.sm = load / float64(len(busy))
	}
	return writeNodeFile(c, work)
}

// appPods are the running pods of the autoscaled Deployments.
func appPods(c *cluster) []corev1.Pod {
	var list corev1.PodList
	sel := url.QueryEscape("app in (" + busyApp + "," + idleApp + "," + perGPUApp + ")")
	if c.kube.get("/api/v1/namespaces/"+workNS+"/pods?labelSelector="+sel, &list) != nil {
		return nil
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 &&
			p.Status.ContainerStatuses[0].State.Running != nil && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

func createDeployment(t *testing.T, c *cluster, app, image string) {
	t.Helper()
	pod := newPod(app, image, container("server", image,
		corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), "nvidia.com/gpu.shared": resource.MustParse("1")},
		corev1.ResourceList{"nvidia.com/gpu.shared": resource.MustParse("1")}))
	d := appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: workNS, Labels: map[string]string{"app": app}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}}, Spec: pod.Spec},
		},
	}
	if err := c.kube.do("POST", "/apis/apps/v1/namespaces/"+workNS+"/deployments", d, nil); err != nil {
		t.Fatal(err)
	}
}

// exampleScaledObject is deploy/keda/scaledobject.yaml, the example the docs give.
func exampleScaledObject(t *testing.T) map[string]any {
	t.Helper()
	var so map[string]any
	if err := yaml.Unmarshal(readFile(t, filepath.Join(e2eutil.RepoRoot(), "deploy/keda/scaledobject.yaml")), &so); err != nil {
		t.Fatal(err)
	}
	return so
}

// trigger is the example's Prometheus trigger's metadata.
func trigger(so map[string]any) map[string]any {
	return dig(so, "spec")["triggers"].([]any)[0].(map[string]any)["metadata"].(map[string]any)
}

// perPodQuery is the example's query for app's pods in the workload namespace.
func perPodQuery(example map[string]any, app string) string {
	q := trigger(example)["query"].(string)
	return strings.NewReplacer(`namespace="inference"`, `namespace="`+workNS+`"`, `label_app="inference"`, `label_app="`+app+`"`).Replace(q)
}

// perGPUQuery is the per-GPU signal for app's pods: the utilization of each GPU the kubelet allocated to one of
// them, once per pod, summed.
func perGPUQuery(app string) string {
	return fmt.Sprintf(`sum(gpu_utilization_ratio * on (instance, uuid) group_right () gpu_allocation_info{namespace=%q, pod=~%q})`, workNS, app+"-.*")
}

// createScaledObject creates the example ScaledObject for app's Deployment with query, this Prometheus and
// maxReplicas; the test's HPAs scale down without the example's 5-minute stabilization window, which only makes
// the test longer.
func createScaledObject(t *testing.T, c *cluster, example map[string]any, prom, app, query string) {
	t.Helper()
	var so map[string]any
	b, _ := yaml.Marshal(example)
	if err := yaml.Unmarshal(b, &so); err != nil {
		t.Fatal(err)
	}
	meta := dig(so, "metadata")
	meta["name"], meta["namespace"] = app, workNS
	spec := dig(so, "spec")
	dig(spec, "scaleTargetRef")["name"] = app
	spec["maxReplicaCount"] = maxReplicas
	spec["pollingInterval"] = 5
	dig(spec, "advanced", "horizontalPodAutoscalerConfig", "behavior", "scaleDown")["stabilizationWindowSeconds"] = 0
	md := trigger(so)
	if md["threshold"] != strconv.FormatFloat(perPodTarget, 'f', -1, 64) {
		t.Fatalf("the example's threshold is %v, the test's %v", md["threshold"], perPodTarget)
	}
	md["serverAddress"], md["query"] = "http://"+prom, query
	if err := c.kube.do("POST", "/apis/keda.sh/v1alpha1/namespaces/"+workNS+"/scaledobjects", so, nil); err != nil {
		t.Fatal(err)
	}
}

// replicas is a Deployment's desired replicas; -1 when it cannot be read.
func replicas(c *cluster, app string) int {
	var d appsv1.Deployment
	if c.kube.get("/apis/apps/v1/namespaces/"+workNS+"/deployments/"+app, &d) != nil || d.Spec.Replicas == nil {
		return -1
	}
	return int(*d.Spec.Replicas)
}

func replicasOf(c *cluster, apps map[string]int) map[string]int {
	out := map[string]int{}
	for app := range apps {
		out[app] = replicas(c, app)
	}
	return out
}

// hpaMetric is the value the HPA that KEDA made for app last read, and whether it has read one.
func hpaMetric(c *cluster, app string) (float64, bool) {
	var h autoscalingv2.HorizontalPodAutoscaler
	if c.kube.get("/apis/autoscaling/v2/namespaces/"+workNS+"/horizontalpodautoscalers/keda-hpa-"+app, &h) != nil {
		return 0, false
	}
	for _, m := range h.Status.CurrentMetrics {
		if m.External != nil && m.External.Current.AverageValue != nil {
			return m.External.Current.AverageValue.AsApproximateFloat64() * float64(max(h.Status.CurrentReplicas, 1)), true
		}
	}
	return 0, false
}

// hpaStatuses is the HPAs' status, for failure messages.
func hpaStatuses(c *cluster) string {
	var list autoscalingv2.HorizontalPodAutoscalerList
	if err := c.kube.get("/apis/autoscaling/v2/namespaces/"+workNS+"/horizontalpodautoscalers", &list); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, h := range list.Items {
		fmt.Fprintf(&b, "%s: %s\n", h.Name, dump(h.Status))
	}
	return b.String()
}

func ptr[T any](v T) *T { return &v }
