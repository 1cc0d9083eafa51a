//go:build k8s

package k8s

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// checkPrivileges checks the exporter's pod as the kubelet started it against docs/install.md's "Privileges": host
// PIDs, uid 0 with no capability at all, no privilege gain, the RuntimeDefault seccomp filter, a read-only root,
// exactly the documented hostPath mounts and all of them read-only, no API token and no RBAC objects. hostNetwork
// and the simulated node's directory are this test's (no CNI, no GPU here), added by its post-renderer.
func checkPrivileges(t *testing.T, c *cluster, pod *corev1.Pod) {
	t.Helper()
	spec := pod.Spec
	if !spec.HostPID || spec.HostIPC {
		t.Errorf("hostPID %v, hostIPC %v; want host PIDs only", spec.HostPID, spec.HostIPC)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the pod mounts an API token")
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 {
		t.Fatalf("%d containers, %d init containers; want the exporter alone", len(spec.Containers), len(spec.InitContainers))
	}
	sc := spec.Containers[0].SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
		len(sc.Capabilities.Add) != 0 || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext %s", dump(sc))
	}
	runtimeDir := filepath.Dir(c.runtimes["GPE_E2E_CONTAINERD_SOCK"])
	podResources := filepath.Join(c.kubelet, "pod-resources")
	nodeDir := filepath.Join(c.dir, "node")
	wantHostPaths := map[string]bool{runtimeDir: true, podResources: true, nodeDir: true}
	for _, v := range spec.Volumes {
		if v.HostPath == nil || !wantHostPaths[v.HostPath.Path] {
			t.Errorf("volume %s", dump(v))
		}
	}
	for _, m := range spec.Containers[0].VolumeMounts {
		if !m.ReadOnly {
			t.Errorf("volume mount %s is writable", m.MountPath)
		}
	}
	if len(spec.Volumes) != len(wantHostPaths) {
		t.Errorf("%d volumes, want %d: %s", len(spec.Volumes), len(wantHostPaths), dump(spec.Volumes))
	}

	// The process, from the host.
	_, id, _ := strings.Cut(pod.Status.ContainerStatuses[0].ContainerID, "://")
	pid := taskPIDs(t, c)[id]
	if pid == 0 {
		t.Fatalf("no containerd task for the exporter's container %s", id)
	}
	status := procStatus(t, pid)
	for field, want := range map[string]string{
		"Uid": "0 0 0 0", "Gid": "0 0 0 0", "NoNewPrivs": "1", "Seccomp": "2",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
	} {
		if got := status[field]; got != want {
			t.Errorf("exporter pid %d: /proc status %s = %q, want %q", pid, field, got, want)
		}
	}
	for ns, wantHost := range map[string]bool{"pid": true, "net": true, "ipc": false, "mnt": false} {
		self, _ := os.Readlink("/proc/self/ns/" + ns)
		its, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + ns)
		if err != nil {
			t.Fatal(err)
		}
		if (its == self) != wantHost {
			t.Errorf("exporter's %s namespace %s, the host's %s; want shared=%v", ns, its, self, wantHost)
		}
	}
	mountinfo, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mounts := map[string]string{} // mount point: options
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if f := strings.Fields(line); len(f) > 5 {
			mounts[f[4]] = f[5]
		}
	}
	for _, mp := range []string{"/", runtimeDir, podResources, "/etc/gpe"} {
		if opts, ok := mounts[mp]; !ok || !regexp.MustCompile(`(^|,)ro(,|$)`).MatchString(opts) {
			t.Errorf("exporter's mount %s: options %q, want read-only", mp, opts)
		}
	}
	for mp := range mounts {
		if strings.Contains(mp, "serviceaccount") {
			t.Errorf("exporter has %s mounted", mp)
		}
	}

	// The release's objects: no RBAC.
	out, err := exec.Command(e2eutil.Helm(t), "get", "manifest", release, "--namespace", exporterNS,
		"--kubeconfig", filepath.Join(c.dir, "pki/admin.kubeconfig")).CombinedOutput()
	if err != nil {
		t.Fatalf("helm get manifest: %v\n%s", err, out)
	}
	for _, kind := range regexp.MustCompile(`(?m)^kind: (\S+)`).FindAllStringSubmatch(string(out), -1) {
		if strings.Contains(kind[1], "Role") {
			t.Errorf("the release creates a %s", kind[1])
		}
	}
}

// procStatus reads /proc/<pid>/status, each value's fields joined by one space.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return m
}
