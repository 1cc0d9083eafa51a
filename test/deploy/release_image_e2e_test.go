//go:build e2e

package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// TestReleaseImage builds the multi-arch image from the snapshot's binaries with scripts/release.sh image, as the
// release workflow does, into a registry on loopback (crane registry serve): there is no other registry here, so the
// base is a glibc image of each architecture made from Debian's libc6 (amd64) and libc6-arm64-cross (arm64) in place
// of distroless. Then it checks the OCI image index and each image's configuration, and dockerd pulls the index,
// gets the amd64 image and runs it.
func TestReleaseImage(t *testing.T) {
	dist := releaseDist(t)
	dockerHost(t)
	crane := tool(t, "crane")
	v := distMeta.Version

	regAddr := e2eutil.FreeAddr(t)
	reg := e2eutil.Start(t, exec.Command(crane, "registry", "serve", "--address", regAddr))
	e2eutil.WaitListening(t, reg, regAddr, 30*time.Second)
	mustCrane := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(crane, args...).Output()
		if err != nil {
			msg := ""
			if ee, ok := err.(*exec.ExitError); ok {
				msg = string(ee.Stderr)
			}
			t.Fatalf("crane %s: %v\n%s", strings.Join(args, " "), err, msg)
		}
		return strings.TrimSpace(string(out))
	}

	// The base: glibc, passwd entries and /tmp, no shell, for each architecture, under one index.
	base := regAddr + "/glibc-base"
	dir := t.TempDir()
	for arch, root := range map[string]string{
		"amd64": e2eutil.GlibcRootfs(t, filepath.Join(dir, "amd64")),
		"arm64": arm64GlibcRootfs(t, filepath.Join(dir, "arm64")),
	} {
		layer := root + ".tar"
		if out, err := exec.Command("tar", "--numeric-owner", "--owner=0", "--group=0", "-C", root, "-cf", layer, ".").CombinedOutput(); err != nil {
			t.Fatalf("tar: %v\n%s", err, out)
		}
		mustCrane("append", "--oci-empty-base", "--new_layer", layer, "--new_tag", base+":"+arch)
		mustCrane("mutate", base+":"+arch, "--set-platform", "linux/"+arch, "--tag", base+":"+arch)
	}
	mustCrane("index", "append", "--manifest", base+":amd64", "--manifest", base+":arm64", "--tag", base+":test")

	repo := regAddr + "/gpu-pod-exporter"
	start := time.Now()
	cmd := exec.Command("bash", "scripts/release.sh", "image", repo, base+":test")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("scripts/release.sh image: %v\n%s", err, msg)
	}
	digest := strings.TrimSpace(string(out))
	t.Logf("image %s@%s built in %s", repo, digest, time.Since(start).Round(100*time.Millisecond))

	// One OCI image index over both architectures, also written as an OCI image layout.
	var index struct {
		MediaType string
		Manifests []struct {
			Digest   string
			Platform struct{ OS, Architecture string }
		}
	}
	if err := json.Unmarshal([]byte(mustCrane("manifest", repo+":"+v)), &index); err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, m := range index.Manifests {
		platforms = append(platforms, m.Platform.OS+"/"+m.Platform.Architecture)
	}
	slices.Sort(platforms)
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) || !strings.Contains(index.MediaType, "index") {
		t.Errorf("%s:%s is %s over %v, want an image index over linux/amd64 and linux/arm64", repo, v, index.MediaType, platforms)
	}
	if got := mustCrane("digest", repo+":"+v); got != digest {
		t.Errorf("scripts/release.sh printed %s, the index is %s", digest, got)
	}
	layout, err := os.ReadFile(filepath.Join(dist, "image", "index.json"))
	if err != nil || !strings.Contains(string(layout), strings.TrimPrefix(digest, "sha256:")) {
		t.Errorf("dist/image is not an OCI layout holding the index %s: %v\n%s", digest, err, layout)
	}

	// Each image's configuration: the architecture, the Dockerfile's runtime settings, the OCI labels.
	for _, arch := range []string{"amd64", "arm64"} {
		var cfg struct {
			Architecture string
			Config       struct {
				User         string
				Entrypoint   []string
				Cmd          []string
				ExposedPorts map[string]any
				Labels       map[string]string
			}
		}
		if err := json.Unmarshal([]byte(mustCrane("config", repo+":"+v+"-"+arch)), &cfg); err != nil {
			t.Fatal(err)
		}
		c := cfg.Config
		if cfg.Architecture != arch || c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/usr/bin/gpu-pod-exporter"}) ||
			len(c.Cmd) != 0 || c.ExposedPorts["9402/tcp"] == nil {
			t.Errorf("%s image: architecture %s, user %q, entrypoint %q, cmd %q, ports %v", arch, cfg.Architecture, c.User, c.Entrypoint, c.Cmd, c.ExposedPorts)
		}
		for k, want := range map[string]string{
			"org.opencontainers.image.source":   "https://github.com/gpu-pod-exporter/gpu-pod-exporter",
			"org.opencontainers.image.version":  v,
			"org.opencontainers.image.revision": distMeta.Commit,
			"org.opencontainers.image.licenses": "Apache-2.0",
		} {
			if c.Labels[k] != want {
				t.Errorf("%s image label %s = %q, want %q", arch, k, c.Labels[k], want)
			}
		}
	}

	// dockerd pulls the index and gets the amd64 image; it runs like the Dockerfile's image.
	image := repo + ":" + v
	mustDocker(t, "pull", "-q", image)
	t.Cleanup(func() { docker(t, "rmi", "-f", image) })
	if got := mustDocker(t, "image", "inspect", "-f", "{{.Architecture}} {{.Config.User}}", image); got != "amd64 65532:65532" {
		t.Errorf("pulled image: %s, want amd64 65532:65532", got)
	}
	checkVersionOutput(t, mustDocker(t, "run", "--rm", image, "--version"), v)
	checkNoShell(t, image)
	addr := e2eutil.FreeAddr(t)
	name := fmt.Sprintf("gpe-release-demo-%d", os.Getpid())
	runContainer(t, name, "--network", "host", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		image, "--demo", "--web.listen-address="+addr)
	scrapeWithin(t, addr, 30*time.Second)
	checkDemoScrape(t, addr)
}

// arm64GlibcRootfs writes the arm64 counterpart of e2eutil.GlibcRootfs from Debian's libc6-arm64-cross.
func arm64GlibcRootfs(t *testing.T, root string) string {
	t.Helper()
	const sysroot = "/usr/aarch64-linux-gnu/lib"
	libs, err := filepath.Glob(filepath.Join(sysroot, "*.so*"))
	if err != nil || len(libs) == 0 {
		t.Fatalf("no arm64 glibc in %s: apt-get install libc6-arm64-cross (%v)", sysroot, err)
	}
	lib := filepath.Join(root, "lib/aarch64-linux-gnu")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range libs {
		if !regexp.MustCompile(`\.so[.0-9]*$`).MatchString(f) {
			continue
		}
		if out, err := exec.Command("cp", "-a", f, lib).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v\n%s", err, out)
		}
	}
	if err := os.Symlink("aarch64-linux-gnu/ld-linux-aarch64.so.1", filepath.Join(root, "lib/ld-linux-aarch64.so.1")); err != nil {
		t.Fatal(err)
	}
	// The rest of the base (passwd and group entries, /tmp) as e2eutil.GlibcRootfs writes it.
	amd64 := e2eutil.GlibcRootfs(t, filepath.Join(t.TempDir(), "amd64"))
	if out, err := exec.Command("cp", "-a", filepath.Join(amd64, "etc"), filepath.Join(amd64, "tmp"), root).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	return root
}
