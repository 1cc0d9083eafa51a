package e2eutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// HelmVersion is the helm the tests build from the Go module proxy (GPE_HELM overrides it with a binary), linked
// like helm's own release builds with the Kubernetes version of its client-go (1.37 for v3.22.0), which is its
// default for rendering and for lint's deprecated-API checks.
const (
	HelmVersion     = "v3.22.0"
	HelmKubeVersion = "1.37"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// Helm returns a helm binary: $GPE_HELM, else HelmVersion built once from the Go module proxy into the user's cache
// directory ($GPE_TOOLS_CACHE overrides it) and reused by later runs.
func Helm(t testing.TB) string {
	t.Helper()
	helmOnce.Do(func() {
		if p := os.Getenv("GPE_HELM"); p != "" {
			helmPath = p
			return
		}
		cache := os.Getenv("GPE_TOOLS_CACHE")
		if cache == "" {
			dir, err := os.UserCacheDir()
			if err != nil {
				helmErr = fmt.Errorf("no cache directory for helm (set GPE_HELM or GPE_TOOLS_CACHE): %v", err)
				return
			}
			cache = filepath.Join(dir, "gpu-pod-exporter")
		}
		bin := filepath.Join(cache, "helm-"+HelmVersion+"-k8s"+HelmKubeVersion, "helm")
		if _, err := os.Stat(bin); err == nil {
			helmPath = bin
			return
		}
		fmt.Fprintf(os.Stderr, "e2eutil: building helm %s from the Go module proxy into %s "+
			"(once; about 3 minutes on 2 cores; set GPE_HELM to use your own helm)\n", HelmVersion, bin)
		start := time.Now()
		if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
			helmErr = err
			return
		}
		tmp, err := os.MkdirTemp(filepath.Dir(bin), "build-")
		if err != nil {
			helmErr = err
			return
		}
		defer os.RemoveAll(tmp)
		major, minor, _ := strings.Cut(HelmKubeVersion, ".")
		ldflags := "-s -w"
		for _, pkg := range []string{"helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"} {
			ldflags += fmt.Sprintf(" -X %s.k8sVersionMajor=%s -X %s.k8sVersionMinor=%s", pkg, major, pkg, minor)
		}
		cmd := exec.Command("go", "install", "-trimpath", "-ldflags="+ldflags, "helm.sh/helm/v3/cmd/helm@"+HelmVersion)
		// Outside our module: no -mod flag from the caller's GOFLAGS, its own go.sum checked against the sum database.
		cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=", "GOWORK=off")
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			helmErr = fmt.Errorf("building helm %s (go install; needs the Go module proxy): %v\n%s", HelmVersion, err, out)
			return
		}
		if err := os.Rename(filepath.Join(tmp, "helm"), bin); err != nil {
			helmErr = err
			return
		}
		fmt.Fprintf(os.Stderr, "e2eutil: built helm %s in %s\n", HelmVersion, time.Since(start).Round(time.Second))
		helmPath = bin
	})
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmPath
}

// GlibcRootfs writes a root filesystem of the host's glibc (Debian's libc6 package files), passwd and group
// entries, and /tmp: a stand-in for gcr.io/distroless/base-debian12 with no shell.
func GlibcRootfs(t testing.TB, root string) string {
	t.Helper()
	out, err := exec.Command("dpkg-query", "-L", "libc6").Output()
	if err != nil {
		t.Fatalf("dpkg-query -L libc6: %v", err)
	}
	for _, f := range strings.Fields(string(out)) {
		if !regexp.MustCompile(`^/(usr/)?lib(64|/x86_64-linux-gnu)/[^/]+\.so[.0-9]*$`).MatchString(f) {
			continue
		}
		dst := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", f, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v\n%s", f, err, out)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "lib64/ld-linux-x86-64.so.2")); err != nil {
		os.MkdirAll(filepath.Join(root, "lib64"), 0o755)
		if err := os.Symlink("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", filepath.Join(root, "lib64/ld-linux-x86-64.so.2")); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
			"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
		"etc/group": "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	return root
}
