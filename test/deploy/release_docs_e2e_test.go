//go:build e2e

package deploy

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// The install guide's blocks marked "<!-- tested: ... -->" run as written against the snapshot release, with the
// release's download URL replaced by a server on loopback that serves dist/.

const releaseURL = "https://github.com/gpu-pod-exporter/gpu-pod-exporter/releases"

// docsBlock returns the lines of the first code block after the "<!-- tested:" comment that contains marker.
func docsBlock(t *testing.T, marker string) []string {
	t.Helper()
	lines := strings.Split(string(readRepoFile(t, "docs/install.md")), "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "<!-- tested:") || !strings.Contains(l, marker) {
			continue
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			t.Fatalf("docs/install.md: no code block right after %q", l)
		}
		for j := i + 2; j < len(lines); j++ {
			if strings.HasPrefix(lines[j], "```") {
				return lines[i+2 : j]
			}
		}
	}
	t.Fatalf("docs/install.md has no block marked %q", marker)
	return nil
}

func serveDir(t *testing.T, dir string) string {
	t.Helper()
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestDocsArchiveInstall runs "Download the archive and run it" line by line in bash: download, checksum, unpack,
// --version, and --demo (given a free port), then scrapes it.
func TestDocsArchiveInstall(t *testing.T) {
	dist := releaseDist(t)
	url := serveDir(t, dist)
	block := docsBlock(t, "snapshot release")
	addr := e2eutil.FreeAddr(t)
	var script []string
	demo := false
	for _, l := range block {
		l = strings.ReplaceAll(l, releaseURL+"/download/v$VERSION", url)
		l = regexp.MustCompile(`^VERSION=\S+`).ReplaceAllString(l, "VERSION="+distMeta.Version)
		if strings.HasPrefix(l, "./gpu-pod-exporter --demo") {
			// The documented port may be taken on a shared machine.
			l = "exec ./gpu-pod-exporter --demo --web.listen-address=" + addr
			demo = true
		}
		script = append(script, l)
	}
	if !demo || !strings.Contains(strings.Join(script, "\n"), url) {
		t.Fatalf("the block no longer downloads from %s/download/v$VERSION and runs --demo:\n%s", releaseURL, strings.Join(block, "\n"))
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.Join(script, "\n"))
	cmd.Dir = t.TempDir()
	p := e2eutil.Start(t, cmd)
	e2eutil.WaitListening(t, p, addr, 60*time.Second)
	if out := p.Output(); !strings.Contains(out, ": OK") || !strings.Contains(out, "version "+distMeta.Version) {
		t.Errorf("the block's checksum and --version output:\n%s", out)
	}
	checkDemoScrape(t, addr)
}

// TestDocsHelmInstall runs the guide's helm lines against a chart repository on loopback serving the packaged chart
// and index from dist/charts: helm repo add, then the helm install line with no values, run as helm template since
// there is no cluster here, and checks what it would create.
func TestDocsHelmInstall(t *testing.T) {
	dist := releaseDist(t)
	url := serveDir(t, filepath.Join(dist, "charts"))
	home := t.TempDir()
	env := append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"), "KUBECONFIG="+filepath.Join(home, "no-cluster"))
	installed := false
	if !strings.Contains(strings.Join(docsBlock(t, "helm lines"), "\n"), "helm install gpu-pod-exporter gpu-pod-exporter/gpu-pod-exporter") {
		t.Fatal("the block no longer installs gpu-pod-exporter/gpu-pod-exporter")
	}
	for _, l := range docsBlock(t, "helm lines") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "helm" {
			continue // kubectl: the cluster's part
		}
		args := f[1:]
		for i, a := range args {
			args[i] = strings.Replace(a, releaseURL+"/latest/download", url, 1)
		}
		if args[0] == "install" {
			// No cluster here, and helm install --dry-run still asks one for its version: helm template resolves the
			// chart from the repository and renders it with the same arguments.
			args[0] = "template"
			args = append(args, "--kube-version", kubeVersion)
			if strings.Contains(distMeta.Version, "-") {
				// helm skips pre-releases unless asked; a snapshot is one (0.0.1-snapshot.<commit>), a vX.Y.Z release
				// is not.
				args = append(args, "--devel")
			}
			installed = true
		}
		cmd := exec.Command(helm(t), args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", l, err, out)
		}
		if args[0] != "template" {
			continue
		}
		r := decode(t, out, "gpu-pod-exporter")
		checkCommon(t, r)
		checkGPUNodeAffinity(t, r.daemonSet.Spec.Template.Spec)
		c := exporterContainer(t, r.daemonSet)
		if want := imageRepo + ":" + distMeta.Version; c.Image != want {
			t.Errorf("image %s, want the release's %s", c.Image, want)
		}
		if got := r.daemonSet.Labels["helm.sh/chart"]; got != "gpu-pod-exporter-"+distMeta.Version {
			t.Errorf("chart %s, want the release's gpu-pod-exporter-%s", got, distMeta.Version)
		}
	}
	if !installed {
		t.Fatal("the block has no helm install line")
	}
}

// TestDocsLocalChartInstall runs "What is published"'s helm line, which installs the snapshot's packaged chart from
// dist/charts with an image of one's own, as helm template (no cluster here): the chart is the release's, its
// image the one given.
func TestDocsLocalChartInstall(t *testing.T) {
	dist := releaseDist(t)
	line := strings.Join(docsBlock(t, "local chart line"), "\n")
	line = strings.ReplaceAll(line, "\\\n", " ")
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "helm" || f[1] != "install" {
		t.Fatalf("the block is not one helm install line:\n%s", line)
	}
	args := append([]string{"template"}, f[2:]...)
	for i, a := range args {
		if !strings.HasPrefix(a, "dist/") {
			continue
		}
		matches, err := filepath.Glob(filepath.Join(dist, strings.TrimPrefix(a, "dist/")))
		if err != nil || len(matches) != 1 {
			t.Fatalf("%s matches %v in %s, want the one packaged chart (%v)", a, matches, dist, err)
		}
		args[i] = matches[0]
	}
	args = append(args, "--kube-version", kubeVersion)
	out := run(t, helm(t), args...)
	r := decode(t, out, "gpu-pod-exporter")
	checkCommon(t, r)
	if got := r.daemonSet.Labels["helm.sh/chart"]; got != "gpu-pod-exporter-"+distMeta.Version {
		t.Errorf("chart %s, want the snapshot's gpu-pod-exporter-%s", got, distMeta.Version)
	}
	if c := exporterContainer(t, r.daemonSet); c.Image != "registry.example.com/gpu-pod-exporter:0.1.0" {
		t.Errorf("image %s, want the one the line gives", c.Image)
	}
}
