package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsLinks: every relative link of the install guide, the reference and the README points at a file or directory that
// exists, and every deployment artifact is linked from the guide.
func TestDocsLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	linked := map[string]bool{}
	for _, doc := range []string{"docs/install.md", "README.md", "docs/reference.md"} {
		for _, m := range link.FindAllStringSubmatch(string(readRepoFile(t, doc)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			p := filepath.Clean(filepath.Join(repoRoot(t), filepath.Dir(doc), target))
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s links to %s, which does not exist", doc, target)
			}
			if doc == "docs/install.md" {
				rel, _ := filepath.Rel(repoRoot(t), p)
				linked[rel] = true
			}
		}
	}
	for _, artifact := range []string{
		"Dockerfile", "deploy/helm/gpu-pod-exporter/values.yaml", "deploy/kubernetes/gpu-pod-exporter.yaml",
		"deploy/kubernetes/prometheus-operator.yaml", "deploy/systemd/gpu-pod-exporter.service",
		"deploy/grafana/gpu-pod-exporter.json", "deploy/cloudwatch/cwagent-config.json",
		"deploy/cloudwatch/prometheus-eks.yaml", "deploy/cloudwatch/prometheus-ec2.yaml", "deploy/prometheus/rules.yml",
	} {
		if !linked[artifact] {
			t.Errorf("docs/install.md does not link %s", artifact)
		}
	}
}
