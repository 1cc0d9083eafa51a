//go:build e2e

package e2e

import (
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/kubelet/fake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"

	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// TestAttribution runs real workloads of every kind (two Kubernetes pods through the CRI, a Docker and a Podman
// container, a systemd-service-shaped and a Slurm-job-shaped host process), lists exactly their PIDs in a simulated
// GPU config, and checks that the real binary labels each one correctly through /metrics and `ps --output json`,
// survives containerd going away and coming back, and forgets a removed container.
func TestAttribution(t *testing.T) {
	cri := dialCRI(t, env.containerdSock)

	// --- workloads ------------------------------------------------------------------------------------------------
	trainerPod := cri.runPod(t, podSpec{name: "trainer-0", namespace: "ml", uid: newUID(t), qos: guaranteed,
		labels: map[string]string{"app": "trainer", "team": "ml", "pod-template-hash": "6d4cf56db6"}})
	notebookPod := cri.runPod(t, podSpec{name: "notebook-7f9c", namespace: "research", uid: newUID(t), qos: burstable,
		labels: map[string]string{"app": "notebook", "team": "research"}})

	k8s := func(p *pod, c criContainer, gpus ...int) *workload {
		return &workload{
			desc: fmt.Sprintf("pod %s/%s container %s", p.namespace, p.name, c.name),
			pid:  c.pid,
			want: map[string]string{"namespace": p.namespace, "pod": p.name, "container": c.name, "pod_uid": p.uid,
				"container_id": c.id, "label_app": p.labels["app"], "label_team": p.labels["team"]},
			runtime: "containerd",
			cgroup:  p.cgroupParent() + "/" + c.id,
			gpus:    gpus,
			mem:     uint64(1+len(c.name)) << 28,
		}
	}
	trainer := k8s(trainerPod, cri.runContainer(t, trainerPod, "trainer"), 0, 1) // one process on two GPUs
	sidecarC := cri.runContainer(t, trainerPod, "sidecar")
	sidecar := k8s(trainerPod, sidecarC, 0)
	jupyter := k8s(notebookPod, cri.runContainer(t, notebookPod, "jupyter"), 1)

	dc := runPlain(t, dockerCmd, "dockerd", "gpe-docker", "--network", "none")
	docker := &workload{desc: "docker container gpe-docker", pid: dc.pid, runtime: "docker",
		want:   map[string]string{"container": "gpe-docker", "container_id": dc.id},
		cgroup: "/docker/" + dc.id, gpus: []int{0}, mem: 3 << 28}
	pc := runPlain(t, podmanCmd, "podman", "gpe-podman", "--network", "host")
	podman := &workload{desc: "podman container gpe-podman", pid: pc.pid, runtime: "podman",
		want:   map[string]string{"container": "gpe-podman", "container_id": pc.id},
		cgroup: "/libpod-" + pc.id, gpus: []int{1}, mem: 5 << 28}

	// Names unique to this run, so that runs with different E2E_WORK on one host do not meet.
	unit := fmt.Sprintf("gpe-e2e-%s.service", newUID(t)[:8])
	jobID := strconv.Itoa(10000 + int(time.Now().UnixNano()%90000))
	unitPath, slurmPath := "/system.slice/"+unit, "/slurm/uid_0/job_"+jobID+"/step_0/task_0"
	service := &workload{desc: "systemd unit " + unit, pid: startInCgroup(t, unitPath),
		want: map[string]string{"systemd_unit": unit}, cgroup: unitPath, gpus: []int{0}, mem: 7 << 28}
	slurm := &workload{desc: "slurm job " + jobID, pid: startInCgroup(t, slurmPath),
		want: map[string]string{"slurm_job_id": jobID}, cgroup: slurmPath, gpus: []int{1}, mem: 9 << 28}

	ws := []*workload{trainer, sidecar, jupyter, docker, podman, service, slurm}

	// --- the environment is what a real node looks like --------------------------------------------------------------
	if !t.Run("environment", func(t *testing.T) {
		for _, w := range ws {
			checkCgroupShape(t, w)
		}
	}) {
		t.Fatal("the environment is not right: the exporter checks would be meaningless")
	}

	// --- the kubelet's allocations ---------------------------------------------------------------------------------
	// trainer-0 was allocated GPU 0 only, through the device plugin, but its trainer also runs on GPU 1;
	// notebook-7f9c holds a DRA claim of NVIDIA's driver for GPU 1, which jupyter uses, and GPU 2, which nothing
	// uses. The driver names GPUs gpu-<minor> (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go).
	kubeletSock := filepath.Join(env.tmp, "kubelet.sock")
	podResources, err := fake.Start(kubeletSock, []fake.Device{
		{Namespace: "ml", Pod: "trainer-0", Container: "trainer", Resource: "nvidia.com/gpu", IDs: []string{gpuUUIDs[0]}},
		{Namespace: "research", Pod: "notebook-7f9c", Container: "jupyter", Resource: "gpu.nvidia.com",
			IDs:   []string{fmt.Sprintf("gpu-%d", gpuMinors[1]), fmt.Sprintf("gpu-%d", gpuMinors[2])},
			Claim: &fake.Claim{Name: "notebook-gpus", Namespace: "research", Pool: "e2e-node", UID: newUID(t)}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(podResources.Stop)

	// --- the exporter ---------------------------------------------------------------------------------------------
	sim := filepath.Join(env.tmp, "gpus.yaml")
	writeSimConfig(t, sim, ws)
	exp := startExporter(t, sim)

	t.Run("metrics", func(t *testing.T) {
		var mfs map[string]*dto.MetricFamily
		problems := testkit.Eventually(30*time.Second, func() []string {
			var err error
			if mfs, err = exp.scrape(); err != nil {
				return []string{err.Error()}
			}
			var p []string
			for _, w := range ws {
				if d := checkProcess(mfs, w, true); d != "" {
					p = append(p, d)
				}
			}
			return p
		})
		for _, p := range problems {
			t.Error(p)
		}
		if mfs == nil {
			return
		}
		if n := len(mfs["gpu_process_memory_used_bytes"].GetMetric()); n != 8 {
			t.Errorf("%d gpu_process_memory_used_bytes series, want 8 (7 PIDs, one of them on both GPUs)", n)
		}
		for _, w := range ws {
			for _, d := range checkWorkloadSeries(mfs, w) {
				t.Error(d)
			}
		}
	})

	t.Run("allocations", func(t *testing.T) {
		problems := testkit.Eventually(30*time.Second, func() []string {
			mfs, err := exp.scrape()
			if err != nil {
				return []string{err.Error()}
			}
			return checkAllocations(mfs)
		})
		for _, p := range problems {
			t.Error(p)
		}
	})

	t.Run("ps", func(t *testing.T) {
		if env.buildErr != nil {
			t.Fatal(env.buildErr)
		}
		rows := exp.ps(t)
		if len(rows) != 8 {
			t.Errorf("ps --output json has %d rows, want 8 (7 PIDs, one of them on both GPUs)", len(rows))
		}
		for _, w := range ws {
			for _, d := range checkPsRows(rows, w) {
				t.Error(d)
			}
		}
	})

	// --- containerd goes away and comes back ------------------------------------------------------------------------
	// A container that the exporter has not seen yet is started first and listed only while containerd is down, so
	// that the exporter must ask the CRI for it and cannot: it keeps the cgroup-derived labels and counts an error.
	late := k8s(notebookPod, cri.runContainer(t, notebookPod, "late"), 0)
	ws = append(ws, late)

	t.Run("containerd down", func(t *testing.T) {
		mfs, err := exp.scrape()
		if err != nil {
			t.Fatalf("scrape before stopping containerd: %v", err)
		}
		errsBefore, _ := resolverErrors(mfs, "cri")

		if err := env.stopContainerd(); err != nil {
			t.Fatalf("stopping containerd: %v%s", err, env.daemonLogs("containerd"))
		}
		restarted := false
		defer func() { // the later steps and the cleanup need it
			if !restarted {
				if err := env.startContainerd(); err != nil {
					t.Errorf("starting containerd again: %v", err)
				}
			}
		}()
		writeSimConfig(t, sim, ws)

		var slowest time.Duration
		problems := testkit.Eventually(30*time.Second, func() []string {
			start := time.Now()
			mfs, err = exp.scrape()
			if d := time.Since(start); d > slowest {
				slowest = d
			}
			if err != nil {
				return []string{"scrape with containerd down: " + err.Error()}
			}
			var p []string
			for _, w := range ws {
				if d := checkProcess(mfs, w, false); d != "" {
					p = append(p, d)
				}
			}
			if n, ok := resolverErrors(mfs, "cri"); !ok {
				p = append(p, "no CRI resolver error counter; self-metrics: "+selfMetrics(mfs))
			} else if n <= errsBefore {
				p = append(p, fmt.Sprintf("CRI resolver errors stayed at %v with containerd down", n))
			}
			return p
		})
		for _, p := range problems {
			t.Error(p)
		}
		if slowest > 5*time.Second {
			t.Errorf("a scrape with containerd down took %s; a runtime that is down must cost a bounded wait", slowest)
		}
		if mfs != nil {
			ss := processSeries(mfs, late.pid)["0"]
			if len(ss) == 1 {
				t.Logf("with containerd down, the new container's labels: %v", ss[0])
			}
		}

		if err := env.startContainerd(); err != nil {
			t.Fatalf("starting containerd again: %v%s", err, env.daemonLogs("containerd"))
		}
		restarted = true
		start := time.Now()
		problems = testkit.Eventually(2*time.Minute, func() []string {
			if mfs, err = exp.scrape(); err != nil {
				return []string{err.Error()}
			}
			var p []string
			for _, w := range ws {
				if d := checkProcess(mfs, w, true); d != "" {
					p = append(p, d)
				}
			}
			return p
		})
		for _, p := range problems {
			t.Errorf("after containerd came back: %s", p)
		}
		if len(problems) == 0 {
			t.Logf("names were back %s after containerd started again", time.Since(start).Round(100*time.Millisecond))
		}
	})

	// --- a removed container is forgotten ---------------------------------------------------------------------------
	t.Run("container removed", func(t *testing.T) {
		mfs, err := exp.scrape()
		if err != nil {
			t.Fatalf("scrape: %v", err)
		}
		cacheBefore, cacheName, cacheOK := cacheSize(mfs)
		if !cacheOK {
			t.Errorf("no resolver cache size gauge (gpu_pod_exporter_resolver_cache_entries); self-metrics: %s",
				selfMetrics(mfs))
		} else {
			t.Logf("cache size before removal: %s = %v", cacheName, cacheBefore)
		}

		if err := cri.removeContainer(sidecarC.id); err != nil {
			t.Fatalf("removing the CRI container sidecar: %v%s", err, env.daemonLogs("containerd"))
		}
		if _, err := output(dockerCmd("rm", "-f", "gpe-docker")); err != nil {
			t.Fatalf("removing the docker container: %v%s", err, env.daemonLogs("dockerd"))
		}
		var kept []*workload
		for _, w := range ws {
			if w != sidecar && w != docker {
				kept = append(kept, w)
			}
		}
		writeSimConfig(t, sim, kept)

		problems := testkit.Eventually(30*time.Second, func() []string {
			if mfs, err = exp.scrape(); err != nil {
				return []string{err.Error()}
			}
			var p []string
			for _, w := range []*workload{sidecar, docker} {
				if n := len(processSeries(mfs, w.pid)); n > 0 {
					p = append(p, fmt.Sprintf("%s (pid %d) still has series on %d GPUs", w.desc, w.pid, n))
				}
				for _, m := range mfs["gpu_workload_memory_used_bytes"].GetMetric() {
					if workloadIdentityDiff(labelsOf(m), w.want) == "" {
						p = append(p, fmt.Sprintf("%s still has a workload series: %v", w.desc, labelsOf(m)))
					}
				}
			}
			for _, w := range kept {
				if d := checkProcess(mfs, w, true); d != "" {
					p = append(p, d)
				}
			}
			return p
		})
		for _, p := range problems {
			t.Error(p)
		}
		if !cacheOK {
			return
		}
		// Two containers are gone: their entries must go (docs/reference.md: "cached per container ID and dropped when the
		// container is gone").
		problems = testkit.Eventually(30*time.Second, func() []string {
			if mfs, err = exp.scrape(); err != nil {
				return []string{err.Error()}
			}
			if n, _, _ := cacheSize(mfs); n > cacheBefore-2 {
				return []string{fmt.Sprintf("%s = %v after removing 2 containers, want at most %v",
					cacheName, n, cacheBefore-2)}
			}
			return nil
		})
		for _, p := range problems {
			t.Error(p)
		}
	})
}

// checkAllocations: the one unrequested use is trainer-0 on GPU 1, which another pod's DRA claim holds (plain
// containers, the service and the Slurm job are not Kubernetes workloads and have no allocations to miss), and
// GPU 2 is claimed and idle. Device plugin and DRA allocations carry their own labels.
func checkAllocations(mfs map[string]*dto.MetricFamily) []string {
	var p []string
	var unrequested []string
	for _, m := range mfs["gpu_unrequested_use"].GetMetric() {
		l := labelsOf(m)
		unrequested = append(unrequested, fmt.Sprintf("%s/%s/%s on GPU %s", l["namespace"], l["pod"], l["container"], l["gpu"]))
	}
	if want := "ml/trainer-0/trainer on GPU 1"; len(unrequested) != 1 || unrequested[0] != want {
		p = append(p, fmt.Sprintf("gpu_unrequested_use: %v, want exactly [%s]", unrequested, want))
	}
	processes := map[string]float64{}
	for _, m := range mfs["gpu_allocation_processes"].GetMetric() {
		l := labelsOf(m)
		processes[l["pod"]+" GPU "+l["gpu"]] = e2eutil.Value(m)
		dra := fmt.Sprintf("resource=%s claim=%s/%s driver=%s pool=%s device=%s", l["resource"], l["dra_claim_namespace"],
			l["dra_claim_name"], l["dra_driver_name"], l["dra_pool_name"], l["dra_device_name"])
		want := "resource=nvidia.com/gpu claim=/ driver= pool= device="
		if l["pod"] == "notebook-7f9c" {
			g, _ := strconv.Atoi(l["gpu"])
			want = fmt.Sprintf("resource=gpu.nvidia.com claim=research/notebook-gpus driver=gpu.nvidia.com pool=e2e-node device=gpu-%d", gpuMinors[g])
		}
		if dra != want {
			p = append(p, fmt.Sprintf("allocation of %s on GPU %s: %s, want %s", l["pod"], l["gpu"], dra, want))
		}
	}
	for key, want := range map[string]float64{"trainer-0 GPU 0": 2, "notebook-7f9c GPU 1": 1, "notebook-7f9c GPU 2": 0} {
		if got, ok := processes[key]; !ok || got != want {
			p = append(p, fmt.Sprintf("gpu_allocation_processes for %s = %v (present %v), want %v; all: %v", key, got, ok, want, processes))
		}
	}
	return p
}

// checkCgroupShape logs a workload's /proc/<pid>/cgroup and checks that every hierarchy puts it where a real node's
// kubelet, dockerd, podman, systemd or slurmstepd would.
func checkCgroupShape(t *testing.T, w *workload) {
	t.Helper()
	cg := readCgroup(w.pid)
	t.Logf("%s, pid %d, /proc/%d/cgroup:\n%s", w.desc, w.pid, w.pid, cg)
	for _, line := range strings.Split(cg, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			t.Errorf("%s: bad /proc/%d/cgroup line %q", w.desc, w.pid, line)
			continue
		}
		if !strings.Contains(parts[2], w.cgroup) {
			t.Errorf("%s: /proc/%d/cgroup line %q does not contain %q", w.desc, w.pid, line, w.cgroup)
		}
	}
}

// checkWorkloadSeries checks the workload series (sum per identity per GPU) of a workload that is the only process
// of its identity.
func checkWorkloadSeries(mfs map[string]*dto.MetricFamily, w *workload) []string {
	var out []string
	for _, g := range w.gpus {
		for _, name := range []string{"gpu_workload_memory_used_bytes", "gpu_workload_processes"} {
			var found []*dto.Metric
			for _, m := range mfs[name].GetMetric() {
				l := labelsOf(m)
				if l["gpu"] == strconv.Itoa(g) && workloadIdentityDiff(l, w.want) == "" {
					found = append(found, m)
				}
			}
			want := float64(w.mem)
			if name == "gpu_workload_processes" {
				want = 1
			}
			switch {
			case len(found) != 1:
				out = append(out, fmt.Sprintf("%s: %d %s series on gpu %d with its identity, want 1",
					w.desc, len(found), name, g))
			case e2eutil.Value(found[0]) != want:
				out = append(out, fmt.Sprintf("%s: %s on gpu %d is %v, want %v", w.desc, name, g, e2eutil.Value(found[0]), want))
			}
		}
	}
	return out
}

// psKeys are the keys of every object of `ps --output json` (docs/reference.md).
var psKeys = []string{"gpu", "uuid", "pid", "process_name", "process_type", "memory_used_bytes",
	"sm_utilization_ratio", "namespace", "pod", "container", "pod_uid", "container_id", "runtime", "slurm_job_id",
	"systemd_unit", "user"}

func checkPsRows(rows []map[string]any, w *workload) []string {
	var out []string
	for _, g := range w.gpus {
		var found []map[string]any
		for _, r := range rows {
			if fmt.Sprint(r["pid"]) == strconv.Itoa(w.pid) && fmt.Sprint(r["gpu"]) == strconv.Itoa(g) {
				found = append(found, r)
			}
		}
		if len(found) != 1 {
			out = append(out, fmt.Sprintf("ps: %s (pid %d): %d rows on gpu %d, want 1", w.desc, w.pid, len(found), g))
			continue
		}
		r := found[0]
		var d []string
		for _, k := range psKeys {
			if _, ok := r[k]; !ok {
				d = append(d, "no key "+k)
			}
		}
		want := map[string]any{"uuid": gpuUUIDs[g], "process_name": "sleep", "process_type": "compute",
			"memory_used_bytes": strconv.FormatUint(w.mem, 10), "sm_utilization_ratio": "0.25", "runtime": w.runtime}
		for _, k := range []string{"namespace", "pod", "container", "pod_uid", "container_id", "slurm_job_id",
			"systemd_unit"} {
			want[k] = w.want[k]
		}
		for k, v := range want {
			got, ok := r[k]
			if !ok {
				continue
			}
			gs := fmt.Sprint(got)
			if f, isNum := got.(float64); isNum {
				gs = strconv.FormatFloat(f, 'f', -1, 64)
			} else if got == nil {
				gs = ""
			}
			if gs != fmt.Sprint(v) {
				d = append(d, fmt.Sprintf("%s=%q (want %q)", k, gs, v))
			}
		}
		if len(d) > 0 {
			out = append(out, fmt.Sprintf("ps: %s (pid %d) on gpu %d: %s", w.desc, w.pid, g, strings.Join(d, ", ")))
		}
	}
	return out
}
