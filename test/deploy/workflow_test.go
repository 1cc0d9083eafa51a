package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWorkflowsActionlint checks the GitHub Actions workflows with actionlint (syntax, expressions, action inputs,
// and the shell of run steps when shellcheck is installed), and that it catches a broken one.
func TestWorkflowsActionlint(t *testing.T) {
	workflows, err := filepath.Glob(filepath.Join(repoRoot(t), ".github/workflows/*.yml"))
	if err != nil || len(workflows) == 0 {
		t.Fatalf("no workflows: %v", err)
	}
	actionlint := tool(t, "actionlint")
	if out, err := runErr(t, actionlint, append([]string{"-no-color"}, workflows...)...); err != nil {
		t.Errorf("actionlint: %v\n%s", err, out)
	}
	// A misspelt context and an unknown input are reported.
	release := string(readRepoFile(t, ".github/workflows/release.yml"))
	broken := strings.Replace(release, "${{ github.ref }}", "${{ github.reff }}", 1)
	broken = strings.Replace(broken, "fetch-depth: 0", "fetch-dept: 0", 1)
	if broken == release {
		t.Fatal("release.yml no longer has the lines this test breaks")
	}
	dir := filepath.Join(t.TempDir(), ".github/workflows")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "release.yml"), []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(t, actionlint, "-no-color", filepath.Join(dir, "release.yml"))
	if err == nil || !strings.Contains(string(out), "reff") || !strings.Contains(string(out), "fetch-dept") {
		t.Errorf("actionlint did not report the broken workflow (%v):\n%s", err, out)
	}
}

// TestReleaseConfigNames: one image name and one repository everywhere, and the release's inputs exist.
func TestReleaseConfigNames(t *testing.T) {
	for _, f := range []string{"deploy/helm/gpu-pod-exporter/values.yaml", "deploy/kubernetes/gpu-pod-exporter.yaml",
		"docs/install.md", "README.md", "scripts/release.sh", "CHANGELOG.md"} {
		if !strings.Contains(string(readRepoFile(t, f)), imageRepo) {
			t.Errorf("%s does not name the image %s", f, imageRepo)
		}
	}
	// Any other ghcr.io image of ours is a second name.
	for _, f := range []string{"deploy/helm/gpu-pod-exporter/values.yaml", "deploy/kubernetes/gpu-pod-exporter.yaml",
		"docs/install.md", "README.md", "Dockerfile", ".github/workflows/release.yml", "scripts/release.sh"} {
		for _, line := range strings.Split(string(readRepoFile(t, f)), "\n") {
			if i := strings.Index(line, "ghcr.io/"); i >= 0 {
				rest := line[i:]
				if !strings.HasPrefix(rest, imageRepo) && !strings.HasPrefix(rest, "ghcr.io/gpu-pod-exporter/charts") &&
					!strings.HasPrefix(rest, "ghcr.io/${{ github.repository_owner }}") && !strings.HasPrefix(rest, "ghcr.io --") &&
					!strings.HasPrefix(rest, "ghcr.io\"") && !strings.HasPrefix(rest, "ghcr.io ") {
					t.Errorf("%s names another image: %s", f, strings.TrimSpace(line))
				}
			}
		}
	}
	for _, f := range []string{"LICENSE", "CHANGELOG.md", "packaging/gpu-pod-exporter.default", "packaging/postinstall.sh",
		"packaging/preremove.sh", "packaging/postremove.sh", "deploy/systemd/gpu-pod-exporter.service"} {
		if _, err := os.Stat(filepath.Join(repoRoot(t), f)); err != nil {
			t.Errorf("the release needs %s: %v", f, err)
		}
	}
	if !strings.Contains(string(readRepoFile(t, "LICENSE")), "Apache License\n                           Version 2.0, January 2004") {
		t.Error("LICENSE is not the Apache License 2.0")
	}
}

// TestGoreleaserCheck validates .goreleaser.yaml with the pinned goreleaser (deprecated keys fail it too), and that
// the check catches a misspelt key.
func TestGoreleaserCheck(t *testing.T) {
	goreleaser := tool(t, "goreleaser")
	if out, err := runErr(t, goreleaser, "check"); err != nil {
		t.Errorf("goreleaser check: %v\n%s", err, out)
	}
	cfg := string(readRepoFile(t, ".goreleaser.yaml"))
	broken := strings.Replace(cfg, "mod_timestamp:", "mod_timestmp:", 1)
	if broken == cfg {
		t.Fatal(".goreleaser.yaml no longer has the key this test breaks")
	}
	p := filepath.Join(t.TempDir(), "goreleaser.yaml")
	if err := os.WriteFile(p, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runErr(t, goreleaser, "check", "--config", p); err == nil || !strings.Contains(string(out), "mod_timestmp") {
		t.Errorf("goreleaser check passed a misspelt key (%v):\n%s", err, out)
	}
}
