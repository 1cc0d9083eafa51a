package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// The chart's platform presets (deploy/helm/gpu-pod-exporter/presets): values files for platforms where the
// defaults cannot work, each setting with its public source. There is no GKE, EKS or Bottlerocket here, so each is
// rendered by helm, decoded into the official types, held to what every rendering must satisfy (checkCommon), and
// its pod's arguments are run with the real binary; test/deploy/image_e2e_test.go runs each preset's pod spec in the
// image under dockerd.

const presetsDir = chartDir + "/presets"

// presetChecks are each preset's own checks, by file name; a preset without an entry fails TestHelmPresets.
var presetChecks = map[string]func(t *testing.T, r *rendered){
	"amd-gpu.yaml": func(t *testing.T, r *rendered) {
		checkDRMPreset(t, r, map[string]string{"feature.node.kubernetes.io/amd-gpu": "true"},
			map[string]string{"feature.node.kubernetes.io/amd-vgpu": "true"})
	},
	"intel-gpu.yaml": func(t *testing.T, r *rendered) {
		checkDRMPreset(t, r, map[string]string{"intel.feature.node.kubernetes.io/gpu": "true"})
	},
	"gke.yaml": func(t *testing.T, r *rendered) {
		pod := r.daemonSet.Spec.Template.Spec
		c := exporterContainer(t, r.daemonSet)
		checkHostMounts(t, pod, c, map[string]string{
			"/run/containerd":                "/run/containerd",
			"/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources",
			"/usr/local/nvidia":              "/home/kubernetes/bin/nvidia",
		})
		env := containerEnv(c)
		if env["LD_LIBRARY_PATH"] != "/usr/local/nvidia/lib64" || !strings.HasPrefix(env["PATH"], "/usr/local/nvidia/bin:") {
			t.Errorf("LD_LIBRARY_PATH %q, PATH %q: the driver's lib64 and bin are not where the exporter looks", env["LD_LIBRARY_PATH"], env["PATH"])
		}
		if sc := c.SecurityContext; sc.Privileged == nil || !*sc.Privileged {
			t.Error("not privileged: a pod that requests no GPU gets no /dev/nvidia* on GKE")
		}
		checkGPUNodeAffinity(t, pod)
	},
	"nvidia-volume-mounts.yaml": func(t *testing.T, r *rendered) {
		pod := r.daemonSet.Spec.Template.Spec
		c := exporterContainer(t, r.daemonSet)
		i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "nvidia-device-request" })
		if i < 0 || c.VolumeMounts[i].MountPath != "/var/run/nvidia-container-devices/all" || !c.VolumeMounts[i].ReadOnly {
			t.Errorf("no read-only device request at /var/run/nvidia-container-devices/all: %+v", c.VolumeMounts)
		}
		if sc := c.SecurityContext; sc.Privileged != nil && *sc.Privileged {
			t.Error("privileged: the volume mount is there so that the exporter need not be")
		}
		checkGPUNodeAffinity(t, pod)
	},
	"eks-managed-node-groups.yaml": func(t *testing.T, r *rendered) {
		pod := r.daemonSet.Spec.Template.Spec
		checkGPUNodeAffinity(t, pod) // the defaults are kept
		terms := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		// The labels a managed node group's node has: the kubelet's and EKS's, no GPU label.
		node := func(instanceType string) map[string]string {
			return map[string]string{"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				"node.kubernetes.io/instance-type": instanceType, "eks.amazonaws.com/nodegroup": "gpu",
				"eks.amazonaws.com/capacityType": "ON_DEMAND", "eks.amazonaws.com/nodegroup-image": "ami-0123456789abcdef0"}
		}
		for _, gpu := range []string{"p5.48xlarge", "p4d.24xlarge", "g5.xlarge", "g6e.12xlarge", "g4dn.metal", "g5g.2xlarge"} {
			if !matchesNodeSelectorTerms(terms, node(gpu)) {
				t.Errorf("an EKS managed node group's %s node does not match", gpu)
			}
		}
		for _, cpu := range []string{"m7i.large", "c7g.4xlarge", "inf2.xlarge", "g4ad.xlarge"} {
			if matchesNodeSelectorTerms(terms, node(cpu)) {
				t.Errorf("a %s node (no NVIDIA GPU) matches", cpu)
			}
		}
	},
}

func presetFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), presetsDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no presets in %s: %v", presetsDir, err)
	}
	return files
}

// sourceURL is a cited public source.
var sourceURL = regexp.MustCompile(`https://\S+`)

// TestHelmPresets renders each preset with helm lint and helm template, checks it as every rendering is checked and
// by its own checks, and runs the exporter with its arguments. Every setting of a preset is preceded by a comment
// that cites its source.
func TestHelmPresets(t *testing.T) {
	seen := map[string]bool{}
	for _, path := range presetFiles(t) {
		name := filepath.Base(path)
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			check, ok := presetChecks[name]
			if !ok {
				t.Fatalf("%s has no checks in presetChecks", name)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			checkPresetCitesSources(t, name, b)
			out := run(t, helm(t), "lint", "--strict", chartDir, "--kube-version", kubeVersion, "--values", path)
			if !bytes.Contains(out, []byte("1 chart(s) linted, 0 chart(s) failed")) {
				t.Fatalf("helm lint:\n%s", out)
			}
			r := template(t, "gpe", "gpu-pod-exporter", "--values", path)
			checkCommon(t, r)
			check(t, r)
			checkArgsAccepted(t, exporterContainer(t, r.daemonSet).Args)
		})
	}
	for name := range presetChecks {
		if !seen[name] {
			t.Errorf("presetChecks has %s, which is not in %s", name, presetsDir)
		}
	}
	// Presets that touch different keys combine: EKS node groups on Bottlerocket take two.
	r := template(t, "gpe", "gpu-pod-exporter", "--values", filepath.Join(repoRoot(t), presetsDir, "eks-managed-node-groups.yaml"),
		"--values", filepath.Join(repoRoot(t), presetsDir, "nvidia-volume-mounts.yaml"))
	checkCommon(t, r)
	presetChecks["eks-managed-node-groups.yaml"](t, r)
	presetChecks["nvidia-volume-mounts.yaml"](t, r)
}

// checkPresetCitesSources: every top-level key a preset sets has a cited https:// source, in the comments right
// above it or above the values it sets.
func checkPresetCitesSources(t *testing.T, name string, b []byte) {
	t.Helper()
	var above []string // the comment lines right above the current line
	section, cited := "", false
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "#"):
			above = append(above, trimmed)
			cited = cited || (section != "" && sourceURL.MatchString(trimmed))
			continue
		case trimmed == "":
		case !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "-"):
			section, cited = trimmed, slices.ContainsFunc(above, sourceURL.MatchString)
		case !cited:
			t.Errorf("%s: %s sets %q with no cited source above it", name, section, trimmed)
		}
		above = nil
	}
	if section == "" {
		t.Errorf("%s sets nothing", name)
	}
}

func containerEnv(c *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// TestHelmProcessUser: with processUser.enabled the pod reads the node's passwd file, mounted by itself, and the
// exporter run with the pod's arguments and that file where the mount puts it names the owner of a real process.
func TestHelmProcessUser(t *testing.T) {
	r := template(t, "gpe", "monitoring", "--set", "processUser.enabled=true")
	checkCommon(t, r)
	pod := r.daemonSet.Spec.Template.Spec
	c := exporterContainer(t, r.daemonSet)
	checkHostMounts(t, pod, c, map[string]string{
		"/run/containerd":                "/run/containerd",
		"/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources",
		"/host/etc/passwd":               "/etc/passwd",
	})
	for _, want := range []string{"--collector.process-user", "--path.rootfs=/host"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %v lack %s", c.Args, want)
		}
	}
	if off := template(t, "gpe", "monitoring"); hasArgPrefix(exporterContainer(t, off.daemonSet).Args, "--collector.process-user") {
		t.Error("--collector.process-user by default: user names can be personal data")
	}

	// The container's /host, as the pod's mount makes it: the node's passwd file at etc/passwd.
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(node, []byte(fmt.Sprintf(`gpus:
  - uuid: GPU-00000000-0000-0000-0000-000000000001
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
    processes:
      - {pid: %d, type: compute, used_memory_bytes: 1073741824}
`, os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range c.Args {
		switch {
		case a == "--path.rootfs=/host":
			args = append(args, "--path.rootfs="+root)
		case strings.HasPrefix(a, "--web.listen-address="), strings.HasPrefix(a, "--runtime.endpoint="):
		default:
			args = append(args, a)
		}
	}
	e := e2eutil.StartExporter(t, exporterBinary(t), append(args, "--gpu.simulated-config="+node)...)
	_, families := e2eutil.Scrape(t, e.Addr)
	var users []string
	for _, m := range families["gpu_process_memory_used_bytes"].GetMetric() {
		users = append(users, e2eutil.Label(m, "user"))
	}
	if !slices.Equal(users, []string{me.Username}) {
		t.Errorf("user labels %q, want the test process's owner %q from the node's passwd", users, me.Username)
	}
}

// checkDRMPreset: the AMD and Intel presets run on their vendors' nodes (each set of labels a node may have) and
// still on NVIDIA's, with the two capabilities that reading other processes' DRM files needs and no others.
func checkDRMPreset(t *testing.T, r *rendered, nodes ...map[string]string) {
	t.Helper()
	pod := r.daemonSet.Spec.Template.Spec
	if pod.Affinity == nil || pod.Affinity.NodeAffinity == nil || pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatalf("no required node affinity: %+v", pod.Affinity)
	}
	terms := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	// The two capabilities reach the vendor's nodes alone: no NVIDIA node of any platform is selected.
	for platform, l := range gpuNodeLabels {
		if matchesNodeSelectorTerms(terms, map[string]string{"kubernetes.io/os": "linux", l.key: l.value}) {
			t.Errorf("an NVIDIA node of %s (%s=%s) matches: it would get the capabilities it does not need", platform, l.key, l.value)
		}
	}
	for _, labels := range nodes {
		labels["kubernetes.io/os"] = "linux"
		if !matchesNodeSelectorTerms(terms, labels) {
			t.Errorf("a node labelled %v does not match", labels)
		}
	}
	if matchesNodeSelectorTerms(terms, map[string]string{"kubernetes.io/os": "linux", "feature.node.kubernetes.io/pci-8086.present": "true"}) {
		t.Error("a node with any Intel PCI device (every Intel server) matches")
	}
	c := exporterContainer(t, r.daemonSet)
	if add := c.SecurityContext.Capabilities.Add; !slices.Equal(add, []corev1.Capability{"SYS_PTRACE", "DAC_READ_SEARCH"}) {
		t.Errorf("capabilities added %v, want SYS_PTRACE and DAC_READ_SEARCH", add)
	}
}
