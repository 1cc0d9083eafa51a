//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// workload is one real process that the simulated GPU config lists, with the identity the exporter must give it.
type workload struct {
	desc    string            // for messages: "pod ml/trainer-0 container trainer"
	pid     int               // host PID
	want    map[string]string // expected identity labels (see identityLabels); absent means ""
	runtime string            // expected "runtime" in ps --output json
	cgroup  string            // what /proc/<pid>/cgroup must contain (environment check)
	gpus    []int             // the GPUs the simulated config puts it on
	mem     uint64            // used_memory_bytes in the simulated config
}

// identityLabels are the labels checked on every process series (the identity labels of docs/reference.md plus the allowlisted pod
// labels of --kubernetes.pod-labels=app,team).
var identityLabels = []string{"namespace", "pod", "container", "pod_uid", "container_id", "slurm_job_id",
	"systemd_unit", "label_app", "label_team"}

// --- CRI ------------------------------------------------------------------------------------------------------------

type criClient struct {
	conn *grpc.ClientConn
	rt   runtimeapi.RuntimeServiceClient
}

func dialCRI(t *testing.T, sock string) *criClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dialling the CRI at %s: %v", sock, err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &criClient{conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatalf("CRI Version on %s: %v%s", sock, err, env.daemonLogs("containerd"))
	}
	t.Logf("CRI runtime: %s %s (CRI %s)", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	return c
}

type qosClass string

const (
	guaranteed qosClass = "guaranteed"
	burstable  qosClass = "burstable"
	besteffort qosClass = "besteffort"
)

// podSpec is a pod as the kubelet would hand it to the CRI.
type podSpec struct {
	name, namespace, uid string
	qos                  qosClass
	labels               map[string]string
}

type pod struct {
	podSpec
	sandboxID string
}

// cgroupParent is the kubelet's (cgroupfs driver) cgroup for the pod.
func (p podSpec) cgroupParent() string {
	if p.qos == guaranteed {
		return "/kubepods/pod" + p.uid
	}
	return "/kubepods/" + string(p.qos) + "/pod" + p.uid
}

func newUID(t *testing.T) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func criCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 60*time.Second)
}

// runPod creates a pod sandbox the way the kubelet does (labels from kuberuntime's newPodLabels, host network, the
// QoS cgroup parent) and removes it in cleanup.
func (c *criClient) runPod(t *testing.T, spec podSpec) *pod {
	t.Helper()
	labels := map[string]string{
		"io.kubernetes.pod.name":      spec.name,
		"io.kubernetes.pod.namespace": spec.namespace,
		"io.kubernetes.pod.uid":       spec.uid,
	}
	for k, v := range spec.labels {
		labels[k] = v
	}
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: spec.name, Namespace: spec.namespace, Uid: spec.uid},
		Labels:   labels,
		Annotations: map[string]string{
			"kubernetes.io/config.source": "api",
			"kubernetes.io/config.seen":   time.Now().UTC().Format(time.RFC3339Nano),
		},
		LogDirectory: filepath.Join(env.work, "pods", spec.namespace+"_"+spec.name+"_"+spec.uid),
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: spec.cgroupParent(),
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{
					Network: runtimeapi.NamespaceMode_NODE, // no CNI here; and so no hostname either
					Pid:     runtimeapi.NamespaceMode_CONTAINER,
					Ipc:     runtimeapi.NamespaceMode_POD,
				},
			},
		},
	}
	if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := criCtx()
	defer cancel()
	resp, err := c.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatalf("CRI RunPodSandbox %s/%s (cgroup parent %s): %v%s", spec.namespace, spec.name, spec.cgroupParent(),
			err, env.daemonLogs("containerd"))
	}
	p := &pod{podSpec: spec, sandboxID: resp.PodSandboxId}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.sandboxID}); err != nil {
			t.Logf("cleanup: StopPodSandbox %s: %v (the teardown script removes it)", p.sandboxID, err)
			return
		}
		if _, err := c.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.sandboxID}); err != nil {
			t.Logf("cleanup: RemovePodSandbox %s: %v (the teardown script removes it)", p.sandboxID, err)
		}
	})
	return p
}

type criContainer struct {
	name, id string
	pid      int
}

// runContainer creates and starts a container in the pod with the kubelet's labels and annotations, running a long
// sleep, and returns its host PID.
func (c *criClient) runContainer(t *testing.T, p *pod, name string) criContainer {
	t.Helper()
	res := &runtimeapi.LinuxContainerResources{CpuShares: 2, OomScoreAdj: 1000}
	switch p.qos {
	case guaranteed:
		res = &runtimeapi.LinuxContainerResources{CpuShares: 102, CpuPeriod: 100000, CpuQuota: 10000,
			MemoryLimitInBytes: 64 << 20, OomScoreAdj: -997}
	case burstable:
		res = &runtimeapi.LinuxContainerResources{CpuShares: 51, CpuPeriod: 100000, OomScoreAdj: 999}
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: env.image},
		Command:  []string{"sleep", "3600"},
		// kuberuntime's newContainerLabels and newContainerAnnotations.
		Labels: map[string]string{
			"io.kubernetes.container.name": name,
			"io.kubernetes.pod.name":       p.name,
			"io.kubernetes.pod.namespace":  p.namespace,
			"io.kubernetes.pod.uid":        p.uid,
		},
		Annotations: map[string]string{
			"io.kubernetes.container.hash":                     "5a1d4c2e",
			"io.kubernetes.container.restartCount":             "0",
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File",
			"io.kubernetes.pod.terminationGracePeriod":         "30",
		},
		LogPath: filepath.Join(name, "0.log"),
		Linux: &runtimeapi.LinuxContainerConfig{
			Resources: res,
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{
					Network: runtimeapi.NamespaceMode_NODE,
					Pid:     runtimeapi.NamespaceMode_CONTAINER,
					Ipc:     runtimeapi.NamespaceMode_POD,
				},
			},
		},
	}
	sandboxCfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: p.name, Namespace: p.namespace, Uid: p.uid},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{CgroupParent: p.cgroupParent()},
	}
	ctx, cancel := criCtx()
	defer cancel()
	cr, err := c.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.sandboxID, Config: cfg,
		SandboxConfig: sandboxCfg})
	if err != nil {
		t.Fatalf("CRI CreateContainer %s in pod %s/%s: %v%s", name, p.namespace, p.name, err, env.daemonLogs("containerd"))
	}
	if _, err := c.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		t.Fatalf("CRI StartContainer %s in pod %s/%s: %v%s", name, p.namespace, p.name, err, env.daemonLogs("containerd"))
	}
	pid, err := c.containerPID(ctx, cr.ContainerId)
	if err != nil {
		t.Fatalf("PID of CRI container %s (%s): %v%s", name, cr.ContainerId, err, env.daemonLogs("containerd"))
	}
	return criContainer{name: name, id: cr.ContainerId, pid: pid}
}

// containerPID reads the container's init PID from the verbose ContainerStatus (containerd's "info" JSON).
func (c *criClient) containerPID(ctx context.Context, id string) (int, error) {
	st, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0, err
	}
	if s := st.GetStatus().GetState(); s != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return 0, fmt.Errorf("container is %v, not running", s)
	}
	var info struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		return 0, fmt.Errorf("verbose ContainerStatus info: %v", err)
	}
	if info.PID <= 0 {
		return 0, errors.New("verbose ContainerStatus has no pid")
	}
	return info.PID, nil
}

func (c *criClient) removeContainer(id string) error {
	ctx, cancel := criCtx()
	defer cancel()
	if _, err := c.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 0}); err != nil {
		return fmt.Errorf("StopContainer: %w", err)
	}
	if _, err := c.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		return fmt.Errorf("RemoveContainer: %w", err)
	}
	return nil
}

// --- Docker and Podman (the test may use their CLIs; the product never does) ---------------------------------------

func dockerCLI() string {
	if _, err := os.Stat("/usr/bin/docker"); err == nil {
		return "/usr/bin/docker" // the client of the same package as the daemon
	}
	return "docker"
}

func dockerCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(dockerCLI(), append([]string{"-H", "unix://" + env.dockerSock}, args...)...)
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+filepath.Join(env.tmp, "docker-config"))
	return cmd
}

func podmanCmd(args ...string) *exec.Cmd {
	cmd := exec.Command("podman", append([]string{"--url", "unix://" + env.podmanSock}, args...)...)
	cmd.Env = append(os.Environ(), env.podmanEnv...)
	return cmd
}

func output(cmd *exec.Cmd) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	c.Env = cmd.Env
	out, err := c.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

type plainContainer struct {
	name, id string
	pid      int
}

// runPlain starts a container outside Kubernetes through a docker-compatible CLI and returns its ID and PID.
func runPlain(t *testing.T, cli func(...string) *exec.Cmd, daemon, name string, args ...string) plainContainer {
	t.Helper()
	_, _ = output(cli("rm", "-f", name)) // a leftover of a killed run
	run := append([]string{"run", "-d", "--name", name}, args...)
	run = append(run, env.image, "sleep", "3600")
	if _, err := output(cli(run...)); err != nil {
		t.Fatalf("starting the %s container %s: %v%s", daemon, name, err, env.daemonLogs(daemon))
	}
	t.Cleanup(func() {
		if _, err := output(cli("rm", "-f", name)); err != nil {
			t.Logf("cleanup: %v (the teardown script removes it)", err)
		}
	})
	out, err := output(cli("inspect", "-f", "{{.Id}} {{.State.Pid}}", name))
	if err != nil {
		t.Fatalf("inspecting the %s container %s: %v%s", daemon, name, err, env.daemonLogs(daemon))
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("inspecting the %s container %s: unexpected output %q", daemon, name, out)
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil || pid <= 0 {
		t.Fatalf("inspecting the %s container %s: bad PID %q", daemon, name, f[1])
	}
	return plainContainer{name: name, id: f[0], pid: pid}
}

// --- host processes in hand-made cgroups --------------------------------------------------------------------------

// cgroupHierarchies returns the mount points of every cgroup v1 and v2 hierarchy.
func cgroupHierarchies(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		// ... mountpoint ... - fstype source options
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, pf := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(pf) < 1 || (pf[0] != "cgroup" && pf[0] != "cgroup2") {
			continue
		}
		out = append(out, f[4])
	}
	if len(out) == 0 {
		t.Fatal("no cgroup hierarchy is mounted")
	}
	return out
}

// startInCgroup starts a host `sleep` and moves it into the cgroup path rel in every mounted hierarchy, like
// systemd (for a service) or slurmstepd (for a job step) would. Cleanup kills it and removes the directories it made.
func startInCgroup(t *testing.T, rel string) int {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting a host sleep for %s: %v", rel, err)
	}
	pid := cmd.Process.Pid
	// Recorded first, so that teardown-runtimes.sh removes it even if this process dies before its cleanup runs.
	if err := appendLine(filepath.Join(env.work, "cgroups"), rel); err != nil {
		t.Fatalf("recording cgroup %s: %v", rel, err)
	}
	var made []string // directories this call created, outermost first
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for i := len(made) - 1; i >= 0; i-- {
			var err error
			for range 50 { // a cgroup can stay busy for a moment after its last process is reaped
				if err = os.Remove(made[i]); err == nil || os.IsNotExist(err) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil && !os.IsNotExist(err) {
				t.Logf("cleanup: removing cgroup %s: %v (the teardown script removes it)", made[i], err)
			}
		}
	})
	for _, h := range cgroupHierarchies(t) {
		dir := h
		for _, part := range strings.Split(strings.Trim(rel, "/"), "/") {
			parent := dir
			dir = filepath.Join(dir, part)
			if _, err := os.Stat(dir); err == nil {
				continue
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatalf("creating cgroup %s: %v", dir, err)
			}
			made = append(made, dir)
			// A new cpuset cgroup in v1 has no CPUs or memory nodes: inherit them, or no process may join it.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if cur, err := os.ReadFile(filepath.Join(dir, f)); err == nil && strings.TrimSpace(string(cur)) == "" {
					v, _ := os.ReadFile(filepath.Join(parent, f))
					if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
						t.Fatalf("setting %s/%s: %v", dir, f, err)
					}
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatalf("moving PID %d into %s: %v", pid, dir, err)
		}
	}
	return pid
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readCgroup(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return strings.TrimRight(string(b), "\n")
}
