package deploy

import (
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const runbooks = "https://github.com/gpu-pod-exporter/gpu-pod-exporter/blob/main/docs/runbooks.md#"

// Every health alert of deploy/prometheus/rules.yml links a section of docs/runbooks.md that exists and is about it
// (the section's heading is the alert's name), and every section of the runbooks belongs to an alert.
func TestHealthAlertsLinkTheirRunbooks(t *testing.T) {
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, "deploy/prometheus/rules.yml"), &rules); err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{} // GitHub's anchor of each "## " heading → the heading
	for _, m := range regexp.MustCompile(`(?m)^## (.+)$`).FindAllStringSubmatch(string(readRepoFile(t, "docs/runbooks.md")), -1) {
		sections[githubAnchor(m[1])] = m[1]
	}
	linked := map[string]bool{}
	for _, g := range rules.Groups {
		if g.Name != "gpu-pod-exporter.health" {
			continue
		}
		for _, r := range g.Rules {
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, runbooks)
			switch {
			case !ok:
				t.Errorf("alert %s: runbook_url %q is not a section of docs/runbooks.md (%s…)", r.Alert, url, runbooks)
			case sections[anchor] == "":
				t.Errorf("alert %s: runbook_url %q names no heading of docs/runbooks.md", r.Alert, url)
			case sections[anchor] != r.Alert:
				t.Errorf("alert %s links the runbook section %q", r.Alert, sections[anchor])
			}
			linked[anchor] = true
		}
	}
	if len(linked) < 9 {
		t.Fatalf("found %d health alerts with runbooks, want at least 9: the group is not read", len(linked))
	}
	for anchor, heading := range sections {
		if !linked[anchor] {
			t.Errorf("docs/runbooks.md has the section %q, which no alert links", heading)
		}
	}
}

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case, spaces to hyphens, punctuation other
// than hyphens and underscores dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
