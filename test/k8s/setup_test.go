//go:build k8s

package k8s

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// workDir holds the runtimes' and the cluster's state; scripts/e2e/teardown-runtimes.sh removes it, ending every
// process whose command line names it (the Kubernetes daemons too).
func workDir() string {
	if w := os.Getenv("GPE_K8S_E2E_WORK"); w != "" {
		return w
	}
	return "/tmp/gpe-e2e-k8s"
}

// script runs scripts/e2e/NAME with E2E_WORK set and returns its stdout; its stderr goes to ours.
func script(t *testing.T, timeout time.Duration, name string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(e2eutil.RepoRoot(), "scripts/e2e", name))
	cmd.Env = append(append(os.Environ(), "E2E_WORK="+workDir()), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/e2e/%s: %v", name, err)
	}
	return string(out)
}

// k8sBinaries builds (once; cached) the Kubernetes binaries and returns their directory.
func k8sBinaries(t *testing.T) string {
	t.Helper()
	return builtTools(t, "GPE_K8S_BIN", "build-k8s.sh", 40*time.Minute)
}

// builtTools is the directory that the variable env names, else the one the build script scripts/e2e/NAME prints
// on its last line after building what it caches.
func builtTools(t *testing.T, env, name string, timeout time.Duration) string {
	t.Helper()
	if d := os.Getenv(env); d != "" {
		return d
	}
	out := strings.TrimSpace(script(t, timeout, name))
	return out[strings.LastIndexByte(out, '\n')+1:]
}

// startRuntimes starts containerd (and the other runtimes) with setup-runtimes.sh and returns its env file.
func startRuntimes(t *testing.T) map[string]string {
	t.Helper()
	script(t, 15*time.Minute, "setup-runtimes.sh")
	b, err := os.ReadFile(filepath.Join(workDir(), "env"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env
}

// exporterImage is the image the chart installs: the Dockerfile's runtime stage built by the test's dockerd as in
// test/deploy's TestImage (a glibc base made from the host's libc6, the binary built on the host), then moved into
// containerd's k8s.io namespace, where the kubelet finds it. There is no registry.
const exporterImage = "gpe.local/gpu-pod-exporter:k8s-e2e"

func buildImage(t *testing.T, runtimes map[string]string) {
	t.Helper()
	start := time.Now()
	dir := t.TempDir()
	docker := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("docker", append([]string{"-H", "unix://" + runtimes["GPE_E2E_DOCKER_SOCK"]}, args...)...)
		if _, err := os.Stat("/usr/bin/docker"); err == nil {
			cmd.Path = "/usr/bin/docker"
		}
		cmd.Dir = e2eutil.RepoRoot()
		cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	importDir := func(ref, root string) {
		tarball := root + ".tar"
		if out, err := exec.Command("tar", "--numeric-owner", "-C", root, "-cf", tarball, ".").CombinedOutput(); err != nil {
			t.Fatalf("tar: %v\n%s", err, out)
		}
		docker("import", tarball, ref)
	}
	base, binImage := "gpe.local/glibc-base:k8s-e2e", "gpe.local/gpe-binary:k8s-e2e"
	importDir(base, e2eutil.GlibcRootfs(t, filepath.Join(dir, "base")))
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, "bin/out/gpu-pod-exporter"), "./cmd/gpu-pod-exporter")
	build.Dir = e2eutil.RepoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	importDir(binImage, filepath.Join(dir, "bin"))
	docker("build", "--progress=plain", "--target", "runtime", "--build-arg", "RUNTIME_IMAGE="+base,
		"--build-arg", "BINARY_FROM="+binImage, "-t", exporterImage, ".")
	archive := filepath.Join(dir, "image.tar")
	docker("save", "-o", archive, exporterImage)
	if out, err := exec.Command("ctr", "--address", runtimes["GPE_E2E_CONTAINERD_SOCK"], "-n", "k8s.io",
		"images", "import", archive).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	t.Logf("image %s built and imported into containerd in %s", exporterImage, time.Since(start).Round(100*time.Millisecond))
}

// --- helm's post-renderer -------------------------------------------------------------------------------------------

// postRenderEnv makes the test binary act as helm's --post-renderer (see TestMain): it reads the rendered
// manifests on stdin, and writes them patched as the patch (JSON) in this variable says.
const postRenderEnv = "GPE_K8S_POST_RENDER"

// patch is what the post-renderer changes in the chart's DaemonSet: only where this machine differs from a GPU node,
// and only what the chart has no value for, the way a user would with a post-renderer (kustomize):
//   - the probes ask 127.0.0.1: the pod is on the host's network, and the tests target loopback only;
//   - HostNetwork: there is no CNI here, so every pod is on the host's network;
//   - NodeDir: the simulated node file's directory, mounted read-only at /etc/gpe (a real node has a GPU instead).
type patch struct {
	HostNetwork bool   `json:"hostNetwork,omitempty"`
	NodeDir     string `json:"nodeDir,omitempty"`
}

func postRender(in io.Reader, out io.Writer, p patch) error {
	b, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	var docs []string
	for _, doc := range strings.Split("\n"+string(b), "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			return err
		}
		if obj == nil {
			continue
		}
		if obj["kind"] == "DaemonSet" {
			spec := dig(obj, "spec", "template", "spec")
			if p.HostNetwork {
				spec["hostNetwork"] = true
			}
			if p.NodeDir != "" {
				spec["volumes"] = append(list(spec["volumes"]), nodeVolume(p.NodeDir))
			}
			for _, c := range list(spec["containers"]) {
				c := c.(map[string]any)
				if p.NodeDir != "" {
					c["volumeMounts"] = append(list(c["volumeMounts"]), nodeMount)
				}
				for _, probe := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
					if p, ok := c[probe].(map[string]any); ok {
						if get, ok := p["httpGet"].(map[string]any); ok {
							get["host"] = "127.0.0.1"
						}
					}
				}
			}
		}
		y, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		docs = append(docs, string(y))
	}
	_, err = io.WriteString(out, "---\n"+strings.Join(docs, "---\n"))
	return err
}

func nodeVolume(dir string) map[string]any {
	return map[string]any{"name": "simulated-node", "hostPath": map[string]any{"path": dir, "type": "Directory"}}
}

var nodeMount = map[string]any{"name": "simulated-node", "mountPath": "/etc/gpe", "readOnly": true}

func dig(obj map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, _ := obj[k].(map[string]any)
		if next == nil {
			next = map[string]any{}
			obj[k] = next
		}
		obj = next
	}
	return obj
}

func list(v any) []any { l, _ := v.([]any); return l }

// helmInstall installs the chart as docs/install.md says, with the values this node needs. Values the chart has
// are set as values; what it has no value for is patched by the post-renderer.
func helmInstall(t *testing.T, c *cluster, exporterPort, healthPort int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(e2eutil.RepoRoot(), "deploy/helm/gpu-pod-exporter")
	var defaults map[string]any
	if b, err := os.ReadFile(filepath.Join(chart, "values.yaml")); err != nil {
		t.Fatal(err)
	} else if err := yaml.Unmarshal(b, &defaults); err != nil {
		t.Fatal(err)
	}
	has := func(key string) bool { _, ok := defaults[key]; return ok }

	repo, tag, _ := strings.Cut(exporterImage, ":")
	podResources := filepath.Join(c.kubelet, "pod-resources")
	sock := c.runtimes["GPE_E2E_CONTAINERD_SOCK"]
	nodeDir := filepath.Join(c.dir, "node")
	values := map[string]any{
		"image":   map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"},
		"runtime": map[string]any{"socketDirectory": filepath.Dir(sock), "socket": filepath.Base(sock)},
		"kubelet": map[string]any{"podResources": map[string]any{
			"directory": podResources, "endpoint": "unix://" + podResources + "/kubelet.sock"}},
		// The app label selects an autoscaled Deployment's pods in PromQL (label_app); dcgm-exporter's names are
		// what OpenCost reads.
		"podLabelsAsMetricLabels": []string{"app"},
		"compat":                  map[string]any{"dcgm": map[string]any{"enabled": true}},
		// No prometheus-operator CRDs here.
		"serviceMonitor": map[string]any{"enabled": false},
		"prometheusRule": map[string]any{"enabled": false},
		"extraArgs": []string{"--gpu.simulated-config=/etc/gpe/node.yaml",
			"--kubelet.gpu-resources=nvidia.com/gpu,nvidia.com/gpu.shared", "--kubelet.refresh-interval=1s"},
	}
	// The exporter's port is on the host's network: a free one.
	if svc, _ := defaults["service"].(map[string]any); svc != nil && svc["port"] != nil {
		values["service"] = map[string]any{"port": exporterPort}
	} else {
		values["port"] = exporterPort
	}
	// runc is the node's runtime: no NVIDIA runtime class here.
	if has("runtimeClassName") {
		values["runtimeClassName"] = ""
	} else {
		values["nvidia"] = map[string]any{"runtimeClassName": ""}
	}
	if has("healthPort") {
		values["healthPort"] = healthPort
	}
	var p patch
	if has("hostNetwork") {
		values["hostNetwork"] = true
	} else {
		p.HostNetwork = true
	}
	if has("extraVolumes") && has("extraVolumeMounts") {
		values["extraVolumes"] = []any{nodeVolume(nodeDir)}
		values["extraVolumeMounts"] = []any{nodeMount}
	} else {
		p.NodeDir = nodeDir
	}
	y, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	valuesFile := filepath.Join(c.dir, "values.yaml")
	write(t, valuesFile, string(y))
	pj, _ := json.Marshal(p)
	args := []string{"install", release, chart, "--kubeconfig", filepath.Join(c.dir, "pki/admin.kubeconfig"),
		"--namespace", exporterNS, "--post-renderer", self, "--values", valuesFile}
	cmd := exec.Command(e2eutil.Helm(t), args...)
	cmd.Env = append(os.Environ(), postRenderEnv+"="+string(pj))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("helm install with values:\n%spost-renderer patch (beyond the probes' host): %s\n%s", y, pj, firstLines(string(out), 6))
}

func firstLines(s string, n int) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	for i := 0; i < n && sc.Scan(); i++ {
		b.WriteString(sc.Text() + "\n")
	}
	return b.String()
}

// --- containers' host PIDs -----------------------------------------------------------------------------------------

// taskPIDs maps each running container's ID to its main process's host PID (ctr tasks ls).
func taskPIDs(t *testing.T, c *cluster) map[string]int {
	t.Helper()
	pids, err := containerPIDs(c)
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// containerPIDs is taskPIDs for a caller that is not the test's goroutine.
func containerPIDs(c *cluster) (map[string]int, error) {
	out, err := exec.Command("ctr", "--address", c.runtimes["GPE_E2E_CONTAINERD_SOCK"], "-n", "k8s.io", "tasks", "ls").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ctr tasks ls: %v\n%s", err, out)
	}
	pids := map[string]int{}
	for _, line := range strings.Split(string(out), "\n")[1:] {
		var id, status string
		var pid int
		if n, _ := fmt.Sscan(line, &id, &pid, &status); n == 3 && status == "RUNNING" {
			pids[id] = pid
		}
	}
	return pids, nil
}

// dump is v as indented JSON, for failure messages.
func dump(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}
