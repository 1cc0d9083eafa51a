//go:build e2e

package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/nvml/stubnvml"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// dockerRunPod translates the exporter's container of a rendered DaemonSet into docker run options and exporter
// arguments: its security context, host PIDs, hostPath mounts (read-only, each from nodeRoot where a fake of the
// node's path exists there, else from this host; paths neither has are left out, as there is no kubelet or runtime
// socket to mount), environment and arguments, listening on addr on the host's network.
func dockerRunPod(t *testing.T, r *rendered, nodeRoot, addr string) (opts, args []string) {
	t.Helper()
	pod := r.daemonSet.Spec.Template.Spec
	c := exporterContainer(t, r.daemonSet)
	opts = []string{"--network", "host", "--cap-drop", "ALL"}
	sc := c.SecurityContext
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		opts = append(opts, "--read-only")
	}
	if sc.AllowPrivilegeEscalation == nil || !*sc.AllowPrivilegeEscalation {
		opts = append(opts, "--security-opt", "no-new-privileges")
	}
	if sc.Privileged != nil && *sc.Privileged {
		// A privileged container gets every capability, which runc cannot give where this host's own bounding set
		// lacks one (as in some VMs and containers). What privilege gives the exporter is the node's /dev/nvidia*,
		// which this host has none of and the stub library does not open: without it the run shows the rest.
		if full, err := fullBoundingSet(); err != nil || !full {
			t.Logf("running without --privileged: this host's bounding set is not full (%v)", err)
		} else {
			opts = append(opts, "--privileged")
		}
	}
	if psc := pod.SecurityContext; psc != nil && psc.RunAsUser != nil {
		gid := int64(0)
		if psc.RunAsGroup != nil {
			gid = *psc.RunAsGroup
		}
		opts = append(opts, "--user", fmt.Sprintf("%d:%d", *psc.RunAsUser, gid))
	}
	if pod.HostPID {
		opts = append(opts, "--pid", "host")
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v := volumes[m.Name]
		if v.HostPath == nil {
			t.Fatalf("mount %s is not a hostPath: extend dockerRunPod", m.Name)
		}
		src := filepath.Join(nodeRoot, v.HostPath.Path)
		if _, err := os.Stat(src); err != nil {
			src = v.HostPath.Path
		}
		if _, err := os.Stat(src); err != nil {
			t.Logf("leaving out the mount of %s, which this host does not have", v.HostPath.Path)
			continue
		}
		opts = append(opts, "--mount", "type=bind,source="+src+",target="+m.MountPath+",readonly")
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			host, _ := os.Hostname()
			opts = append(opts, "-e", e.Name+"="+host)
		case e.ValueFrom != nil:
			t.Fatalf("env %s from %+v: extend dockerRunPod", e.Name, e.ValueFrom)
		default:
			opts = append(opts, "-e", e.Name+"="+e.Value)
		}
	}
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--web.listen-address=") {
			a = "--web.listen-address=" + addr
		}
		args = append(args, a)
	}
	return opts, args
}

// testChartPodSpecs runs the image the way each preset's (and processUser's) rendered pod spec runs it.
func testChartPodSpecs(t *testing.T, image, tag string) {
	// A GKE node as Google's driver installer leaves it, with the stub library in the driver's lib64.
	gkeNode := t.TempDir()
	driver := filepath.Join(gkeNode, "home/kubernetes/bin/nvidia")
	for _, d := range []string{"lib64", "bin"} {
		if err := os.MkdirAll(filepath.Join(driver, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lib, err := os.ReadFile(stubnvml.H100R580.Build(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(driver, "lib64", "libnvidia-ml.so.1"), lib, 0o755); err != nil {
		t.Fatal(err)
	}

	preset := func(name string) string { return filepath.Join(repoRoot(t), presetsDir, name) }
	for _, tc := range []struct {
		name     string
		values   []string
		nodeRoot string
		args     []string // added to the pod's
		check    func(t *testing.T, body string)
	}{
		{
			// No --demo: the exporter finds the driver's library in the mounted directory through LD_LIBRARY_PATH,
			// as the preset sets it up.
			name: "gke", values: []string{"--values", preset("gke.yaml")}, nodeRoot: gkeNode,
			check: func(t *testing.T, body string) {
				for _, want := range []string{`gpu_pod_exporter_source_up{source="nvml"} 1`, `uuid="GPU-stub-0"`} {
					if !strings.Contains(body, want) {
						t.Errorf("the GKE preset's pod read no GPU through the mounted driver: no %s", want)
					}
				}
			},
		},
		{
			name: "nvidia-volume-mounts", values: []string{"--values", preset("nvidia-volume-mounts.yaml")},
			args: []string{"--demo"},
			check: func(t *testing.T, body string) {
				if !strings.Contains(body, `simulated="true"`) {
					t.Error("the volume-mounts preset's pod does not serve")
				}
			},
		},
		{
			name:   "eks-managed-node-groups+nvidia-volume-mounts",
			values: []string{"--values", preset("eks-managed-node-groups.yaml"), "--values", preset("nvidia-volume-mounts.yaml")},
			args:   []string{"--demo"},
			check: func(t *testing.T, body string) {
				if !strings.Contains(body, `simulated="true"`) {
					t.Error("the combined presets' pod does not serve")
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := template(t, "gpe", "gpu-pod-exporter", tc.values...)
			addr := e2eutil.FreeAddr(t)
			opts, args := dockerRunPod(t, r, tc.nodeRoot, addr)
			name := "gpe-deploy-preset-" + strings.ReplaceAll(tc.name, "+", "-") + "-" + tag
			runContainer(t, name, append(append(append(opts, image), args...), tc.args...)...)
			var body string
			testkit.WaitFor(t, 30*time.Second, "a reading of the GPUs", func() bool {
				var err error
				body, err = e2eutil.Get("http://" + addr + "/metrics")
				return err == nil && strings.Contains(body, "gpu_info{")
			})
			tc.check(t, body)
		})
	}

	// processUser: a workload process of a user the node's passwd names and the image's does not (uid 1, daemon on
	// Debian) is named through the mounted file.
	t.Run("processUser", func(t *testing.T) {
		workload := "gpe-deploy-user-workload-" + tag
		runContainer(t, workload, "--user", "1:1", runtimesEnv["GPE_E2E_IMAGE"], "/bin/sleep", "3600")
		pid := mustDocker(t, "inspect", "-f", "{{.State.Pid}}", workload)
		node := filepath.Join(t.TempDir(), "node.yaml")
		if err := os.WriteFile(node, []byte(fmt.Sprintf(`gpus:
  - uuid: GPU-00000000-0000-0000-0000-000000000001
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
    processes:
      - {pid: %s, type: compute, used_memory_bytes: 1073741824}
`, pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		want := passwdName(t, "/etc/passwd", "1")
		r := template(t, "gpe", "gpu-pod-exporter", "--set", "processUser.enabled=true")
		addr := e2eutil.FreeAddr(t)
		opts, args := dockerRunPod(t, r, "", addr)
		opts = append(opts, "--mount", "type=bind,source="+node+",target=/etc/gpe/node.yaml,readonly")
		runContainer(t, "gpe-deploy-user-"+tag, append(append(opts, image), append(args, "--gpu.simulated-config=/etc/gpe/node.yaml")...)...)
		testkit.WaitFor(t, 30*time.Second, "the workload named "+want, func() bool {
			body, err := e2eutil.Get("http://" + addr + "/metrics")
			return err == nil && strings.Contains(body, `pid="`+pid+`"`) && strings.Contains(body, `user="`+want+`"`)
		})
	})
}

// fullBoundingSet reports whether this process's capability bounding set holds every capability the kernel has.
func fullBoundingSet() (bool, error) {
	last, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return false, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(last)))
	if err != nil {
		return false, err
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			bnd, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && bnd == 1<<(n+1)-1, err
		}
	}
	return false, fmt.Errorf("no CapBnd in /proc/self/status")
}

// passwdName returns the name of uid in a passwd file.
func passwdName(t *testing.T, passwd, uid string) string {
	t.Helper()
	b, err := os.ReadFile(passwd)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) > 2 && f[2] == uid {
			return f[0]
		}
	}
	t.Fatalf("%s names no uid %s", passwd, uid)
	return ""
}
