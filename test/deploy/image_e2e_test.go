//go:build e2e

package deploy

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// TestImage builds the Dockerfile's runtime stage under a real dockerd and runs it. There is no registry here, so
// the runtime base is a glibc image made from the host's own libc6 files (what distroless base provides: glibc,
// passwd entries, no shell), and the binary stage is an image holding the exporter built on the host by the
// Dockerfile's own build command (its RUN line, with its build arguments); BuildKit then builds only the stages the
// runtime stage needs.
func TestImage(t *testing.T) {
	dockerHost(t)
	tag := fmt.Sprintf("e2e-%d", os.Getpid())
	base := "gpe.local/glibc-base:" + tag
	binImage := "gpe.local/gpe-binary:" + tag
	image := "gpe.local/gpu-pod-exporter:" + tag
	t.Cleanup(func() { docker(t, "rmi", "-f", image, binImage, base) })

	start := time.Now()
	dir := t.TempDir()
	importImage(t, base, e2eutil.GlibcRootfs(t, filepath.Join(dir, "base")))
	binDir := filepath.Join(dir, "bin")
	revision := strings.TrimSpace(string(run(t, "git", "rev-parse", "HEAD")))
	buildArgs := map[string]string{"VERSION": "9.8.7-test", "REVISION": revision, "BRANCH": "test", "BUILD_DATE": "20261130-12:34:56"}
	build := exec.Command("sh", "-c", dockerfileBuildCommand(t, filepath.Join(binDir, "out")))
	build.Dir = repoRoot(t)
	build.Env = os.Environ()
	for k, v := range buildArgs {
		build.Env = append(build.Env, k+"="+v)
	}
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's go build: %v\n%s", err, out)
	}
	importImage(t, binImage, binDir)
	dockerBuild := []string{"build", "--progress=plain", "--target", "runtime",
		"--build-arg", "RUNTIME_IMAGE=" + base, "--build-arg", "BINARY_FROM=" + binImage, "-t", image}
	for k, v := range buildArgs {
		dockerBuild = append(dockerBuild, "--build-arg", k+"="+v)
	}
	out := mustDocker(t, append(dockerBuild, ".")...)
	if strings.Contains(out, "golang") {
		t.Errorf("the build touched the Go builder image although BINARY_FROM was set:\n%s", out)
	}
	t.Logf("image built in %s", time.Since(start).Round(100*time.Millisecond))

	// The image's configuration.
	var cfg []struct {
		Config struct {
			User         string
			Entrypoint   []string
			ExposedPorts map[string]any
			Labels       map[string]string
		}
	}
	if err := json.Unmarshal([]byte(mustDocker(t, "image", "inspect", image)), &cfg); err != nil || len(cfg) != 1 {
		t.Fatalf("docker image inspect: %v", err)
	}
	c := cfg[0].Config
	for k, want := range map[string]string{
		"org.opencontainers.image.source":   "https://github.com/gpu-pod-exporter/gpu-pod-exporter",
		"org.opencontainers.image.version":  "9.8.7-test",
		"org.opencontainers.image.revision": revision,
		"org.opencontainers.image.licenses": "Apache-2.0",
	} {
		if c.Labels[k] != want {
			t.Errorf("image label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	version := mustDocker(t, "run", "--rm", image, "--version")
	for _, want := range []string{"version 9.8.7-test (branch: test, revision: " + revision + ")", "build user:       docker",
		"build date:       20261130-12:34:56"} {
		if !strings.Contains(version, want) {
			t.Errorf("--version of the Dockerfile's build lacks %q:\n%s", want, version)
		}
	}
	if c.User != "65532:65532" {
		t.Errorf("image user %q, want non-root 65532:65532", c.User)
	}
	if strings.Join(c.Entrypoint, " ") != "/usr/bin/gpu-pod-exporter" {
		t.Errorf("entrypoint %q", c.Entrypoint)
	}
	if _, ok := c.ExposedPorts["9402/tcp"]; !ok {
		t.Errorf("exposed ports %v, want 9402/tcp", c.ExposedPorts)
	}
	checkNoShell(t, image)

	t.Run("demo", func(t *testing.T) {
		// The most restricted way to run it: read-only, no capabilities, no privilege gain, non-root (the image's user).
		addr := e2eutil.FreeAddr(t)
		name := "gpe-deploy-demo-" + tag
		runContainer(t, name, "--network", "host", "--read-only", "--cap-drop", "ALL",
			"--security-opt", "no-new-privileges", image, "--demo", "--web.listen-address="+addr)
		body := scrapeWithin(t, addr, 30*time.Second)
		for _, want := range []string{`simulated="true"`, `gpu_workload_memory_used_bytes{`, `pod="bert-finetune-7c9d8b6f4-x2kqp"`} {
			if !strings.Contains(body, want) {
				t.Errorf("the demo's metrics lack %s", want)
			}
		}
		status := procStatus(t, name)
		for field, want := range map[string]string{"Uid": "65532", "Gid": "65532", "CapEff": "0000000000000000", "NoNewPrivs": "1"} {
			if got := status[field]; got != want {
				t.Errorf("/proc/<pid>/status %s = %q, want %q", field, got, want)
			}
		}
	})

	// The privileges of the Helm chart, proven necessary and sufficient: a workload container's process, attributed
	// by the containerised exporter through the host's PIDs and the runtime socket mounted read-only, with every
	// capability dropped. As in the chart and docs/install.md, the socket's directory is mounted (not recursively:
	// it also holds the private dockerd's data root), not the socket file, which a restarted runtime replaces.
	sock := dockerHost(t)
	workload := "gpe-deploy-workload-" + tag
	runContainer(t, workload, runtimesEnv["GPE_E2E_IMAGE"], "/bin/sleep", "3600")
	pid := mustDocker(t, "inspect", "-f", "{{.State.Pid}}", workload)
	id := mustDocker(t, "inspect", "-f", "{{.Id}}", workload)
	node := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(node, []byte(fmt.Sprintf(`driver_version: "580.95.05"
cuda_version: "13.0"
gpus:
  - uuid: GPU-00000000-0000-0000-0000-000000000001
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
    processes:
      - pid: %s
        type: compute
        used_memory_bytes: 1073741824
`, pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--network", "host", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"-v", node + ":/etc/gpe/node.yaml:ro",
		"--mount", "type=bind,source=" + filepath.Dir(sock) + ",target=/host/run,readonly,bind-nonrecursive"}
	args := []string{"--gpu.simulated-config=/etc/gpe/node.yaml", "--docker.host=unix:///host/run/" + filepath.Base(sock)}
	series := regexp.MustCompile(`gpu_process_memory_used_bytes\{[^}]*pid="` + pid + `"[^}]*\}`)
	attributed := func(t *testing.T, addr string) string {
		t.Helper()
		var line string
		testkit.WaitFor(t, 30*time.Second, "the workload's process series", func() bool {
			body, err := e2eutil.Get("http://" + addr + "/metrics")
			line = series.FindString(body)
			return err == nil && line != ""
		})
		if !strings.Contains(line, `container_id="`+id+`"`) {
			t.Errorf("the cgroup did not give the container ID: %s", line)
		}
		return line
	}

	for _, tc := range []struct {
		name  string
		extra []string // docker run options
		args  []string // exporter flags
	}{
		{"hostPID", []string{"--pid", "host"}, nil},
		{"host-proc", []string{"-v", "/proc:/host/proc:ro"}, []string{"--path.procfs=/host/proc"}},
	} {
		t.Run("root-without-capabilities/"+tc.name, func(t *testing.T) {
			addr := e2eutil.FreeAddr(t)
			name := fmt.Sprintf("gpe-deploy-%s-%s", strings.ToLower(tc.name), tag)
			opts := append(append(append([]string{}, common...), tc.extra...), "--user", "0:0", image)
			runContainer(t, name, append(append(append(opts, args...), tc.args...),
				"--web.listen-address="+addr)...)
			line := attributed(t, addr)
			if !strings.Contains(line, `container="`+workload+`"`) {
				t.Errorf("the runtime did not name the container through the read-only socket: %s", line)
			}
			if got := procStatus(t, name)["CapEff"]; got != "0000000000000000" {
				t.Errorf("CapEff = %s, want no capability", got)
			}
		})
	}

	t.Run("chart-pod-specs", func(t *testing.T) { testChartPodSpecs(t, image, tag) })

	// Why the chart runs as uid 0: without it the runtime's socket (root:docker 0660 here, root:root 0660 for
	// containerd) cannot be connected to, and containers keep only their cgroup-derived labels.
	t.Run("non-root-cannot-name", func(t *testing.T) {
		addr := e2eutil.FreeAddr(t)
		name := "gpe-deploy-nonroot-" + tag
		runContainer(t, name, append(append(append(append([]string{}, common...), "--pid", "host", image), args...),
			"--web.listen-address="+addr)...)
		line := attributed(t, addr)
		if !strings.Contains(line, `container=""`) {
			t.Errorf("a non-root exporter named the container, so root would not be needed: %s", line)
		}
		testkit.WaitFor(t, 30*time.Second, "a failed docker lookup to be counted", func() bool {
			body, _ := e2eutil.Get("http://" + addr + "/metrics")
			return regexp.MustCompile(`gpu_pod_exporter_resolver_requests_total\{[^}]*result="error"[^}]*\} [1-9]`).MatchString(body)
		})
	})
}

// dockerfileBuildCommand is the Dockerfile's RUN line that builds the exporter, writing to out instead of /out.
func dockerfileBuildCommand(t *testing.T, out string) string {
	t.Helper()
	var cmd []string
	in := false
	for _, line := range strings.Split(string(readRepoFile(t, "Dockerfile")), "\n") {
		if strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build") {
			in = true
			line = strings.TrimPrefix(line, "RUN ")
		}
		if !in {
			continue
		}
		cmd = append(cmd, strings.TrimSuffix(strings.TrimSpace(line), "\\"))
		if !strings.HasSuffix(line, "\\") {
			break
		}
	}
	if len(cmd) == 0 {
		t.Fatal("the Dockerfile has no RUN ... go build")
	}
	c := strings.Join(cmd, " ")
	if !strings.Contains(c, "/out/gpu-pod-exporter") {
		t.Fatalf("the Dockerfile's build does not write /out/gpu-pod-exporter: %s", c)
	}
	return strings.ReplaceAll(c, "/out/", out+"/")
}

// importImage makes an image of a directory with docker import.
func importImage(t *testing.T, ref, dir string) {
	t.Helper()
	tarball := dir + ".tar"
	if out, err := exec.Command("tar", "--numeric-owner", "-C", dir, "-cf", tarball, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	mustDocker(t, "import", tarball, ref)
}

// checkNoShell lists the image's files: no shell or busybox, so nothing in the image can run a command line.
func checkNoShell(t *testing.T, image string) {
	t.Helper()
	id := mustDocker(t, "create", image)
	defer docker(t, "rm", "-f", id)
	out := filepath.Join(t.TempDir(), "fs.tar")
	mustDocker(t, "export", "-o", out, id)
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	files := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files++
		switch filepath.Base(h.Name) {
		case "sh", "bash", "dash", "ash", "busybox", "zsh":
			t.Errorf("the image holds a shell: %s", h.Name)
		}
	}
	if files == 0 {
		t.Error("the image's filesystem is empty")
	}
	if out, err := docker(t, "run", "--rm", "--entrypoint", "/bin/sh", image, "-c", "true"); err == nil {
		t.Errorf("/bin/sh ran in the image:\n%s", out)
	}
}

// runContainer starts a detached container that is removed when the test ends (its logs shown if it failed).
func runContainer(t *testing.T, name string, args ...string) {
	t.Helper()
	docker(t, "rm", "-f", name)
	mustDocker(t, append([]string{"run", "-d", "--name", name}, args...)...)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := docker(t, "logs", "--tail", "30", name)
			t.Logf("container %s logs:\n%s", name, logs)
		}
		docker(t, "rm", "-f", name)
	})
}

func scrapeWithin(t *testing.T, addr string, timeout time.Duration) string {
	t.Helper()
	var body string
	testkit.WaitFor(t, timeout, "the exporter on "+addr, func() bool {
		var err error
		body, err = e2eutil.Get("http://" + addr + "/metrics")
		return err == nil
	})
	return body
}

// procStatus reads /proc/<pid>/status of a container's main process, from the host.
func procStatus(t *testing.T, container string) map[string]string {
	t.Helper()
	pid := mustDocker(t, "inspect", "-f", "{{.State.Pid}}", container)
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, ok := strings.Cut(string(line), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) > 0 {
			m[k] = f[0] // Uid and Gid: the real ID; all four are checked equal below
		}
		if (k == "Uid" || k == "Gid") && len(f) == 4 && (f[0] != f[1] || f[1] != f[2] || f[2] != f[3]) {
			m[k] = strings.Join(f, ",")
		}
	}
	return m
}
