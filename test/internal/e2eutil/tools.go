package e2eutil

import (
	"bytes"
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

var (
	toolsMu sync.Mutex
	tools   = map[string]string{}
)

// Tool returns the path of a release or deployment tool (helm, goreleaser, actionlint, crane): built once from the
// Go module proxy by scripts/tools.sh, which pins the versions, into ~/.cache/gpu-pod-exporter, and reused by later
// runs; $GPE_HELM and the like name a binary to use instead.
func Tool(t testing.TB, name string) string {
	t.Helper()
	toolsMu.Lock()
	defer toolsMu.Unlock()
	if p, ok := tools[name]; ok {
		return p
	}
	start := time.Now()
	cmd := exec.Command("bash", filepath.Join(RepoRoot(), "scripts/tools.sh"), name)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr // the build's progress, when there is one
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/tools.sh %s: %v", name, err)
	}
	p := strings.TrimSpace(stdout.String())
	if d := time.Since(start); d > 10*time.Second {
		fmt.Fprintf(os.Stderr, "e2eutil: %s ready in %s\n", name, d.Round(time.Second))
	}
	tools[name] = p
	return p
}

// Helm returns the helm binary the tests share (Tool "helm").
func Helm(t testing.TB) string {
	t.Helper()
	return Tool(t, "helm")
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
