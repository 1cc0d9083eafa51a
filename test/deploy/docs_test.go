package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// userDocs are the Markdown files users read: the README, the guides under docs/, and the files the README links.
func userDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot(t), "docs", "*.md"))
	if err != nil || len(docs) < 5 {
		t.Fatalf("docs/*.md: %v %v", docs, err)
	}
	out := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md"}
	for _, d := range docs {
		out = append(out, "docs/"+filepath.Base(d))
	}
	return out
}

// markdownLink is an inline link or image: its target path (empty for a link within the same file) and anchor.
var markdownLink = regexp.MustCompile(`\]\(([^)#\s]*)(#[^)\s]*)?\)`)

// proseLines returns a Markdown file's lines outside fenced code blocks.
func proseLines(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives a Markdown file's headings: lower case, punctuation other than
// '-' and '_' dropped, spaces as '-', and "-1", "-2", ... for repeats.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(text) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// TestDocsLinks: every relative link of every user document points at a file or directory that exists, and every
// anchor at a heading of its file; every deployment artifact is linked from the install guide.
func TestDocsLinks(t *testing.T) {
	root := repoRoot(t)
	linked := map[string]bool{}
	anchorsOf := map[string]map[string]bool{}
	for _, doc := range userDocs(t) {
		text := string(readRepoFile(t, doc))
		for _, line := range proseLines(text) {
			for _, m := range markdownLink.FindAllStringSubmatch(line, -1) {
				target, anchor := m[1], strings.TrimPrefix(m[2], "#")
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				p := filepath.Join(root, doc)
				if target != "" {
					p = filepath.Clean(filepath.Join(root, filepath.Dir(doc), target))
				}
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s links to %s, which does not exist", doc, target)
					continue
				}
				rel, _ := filepath.Rel(root, p)
				if doc == "docs/install.md" {
					linked[rel] = true
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(p, ".md") {
					t.Errorf("%s links to %s#%s: an anchor in a file that is not Markdown", doc, target, anchor)
					continue
				}
				if anchorsOf[rel] == nil {
					anchorsOf[rel] = headingAnchors(string(readRepoFile(t, rel)))
				}
				if !anchorsOf[rel][anchor] {
					t.Errorf("%s links to %s#%s, a heading %s does not have", doc, rel, anchor, rel)
				}
			}
		}
	}
	for _, artifact := range []string{
		"Dockerfile", "deploy/helm/gpu-pod-exporter/values.yaml", "deploy/kubernetes/gpu-pod-exporter.yaml",
		"deploy/kubernetes/prometheus-operator.yaml", "deploy/systemd/gpu-pod-exporter.service",
		"deploy/grafana/gpu-pod-exporter.json", "deploy/grafana/gpu-accounting.json", "deploy/cloudwatch/cwagent-config.json",
		"deploy/cloudwatch/prometheus-eks.yaml", "deploy/cloudwatch/prometheus-ec2.yaml", "deploy/prometheus/rules.yml",
	} {
		if !linked[artifact] {
			t.Errorf("docs/install.md does not link %s", artifact)
		}
	}
	presets, _ := filepath.Glob(filepath.Join(root, presetsDir, "*.yaml"))
	for _, p := range presets {
		if rel, _ := filepath.Rel(root, p); !linked[rel] {
			t.Errorf("docs/install.md does not link the preset %s", rel)
		}
	}
}

// TestHeadingAnchors pins the anchor rule that TestDocsLinks relies on to GitHub's, on headings of these docs.
func TestHeadingAnchors(t *testing.T) {
	a := headingAnchors("# Installing gpu-pod-exporter\n## Debian/Ubuntu and RHEL packages\n```\n# not a heading\n```\n" +
		"## `--compat=dcgm`\n## Privileges, and why each is needed\n### MIG\n### MIG\n")
	for _, want := range []string{"installing-gpu-pod-exporter", "debianubuntu-and-rhel-packages", "--compatdcgm",
		"privileges-and-why-each-is-needed", "mig", "mig-1"} {
		if !a[want] {
			t.Errorf("no anchor %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a comment in a code block became a heading")
	}
}

// TestREADMEFirstScreen: the README is one screen that opens with what it is, the comparison with the exporters
// it is measured against, and the quick start with its prerequisites, before the install; its command lines are
// the two the project promises (the demo and the test suite), and its figures are docs/performance.md's.
func TestREADMEFirstScreen(t *testing.T) {
	readme := string(readRepoFile(t, "README.md"))
	lines := strings.Split(readme, "\n")
	if len(lines) > 60 {
		t.Errorf("README.md has %d lines: keep it to one screen and move the rest to docs/", len(lines))
	}
	line := func(substr string) int {
		i := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, substr) })
		if i < 0 {
			t.Errorf("README.md lacks %q", substr)
		}
		return i
	}
	table := line("| | gpu-pod-exporter | [dcgm-exporter]")
	for _, peer := range []string{"[nvidia_gpu_exporter]", "[nvitop]"} {
		if table >= 0 && !strings.Contains(lines[table], peer) {
			t.Errorf("the comparison table does not compare with %s", peer)
		}
	}
	quick, demo, install := line("## Quick start"), line(readmeDemo[0]), line("## Install")
	prereq := line("Needs Go 1.")
	perfRow := line("| Memory on the node |")
	if t.Failed() {
		t.FailNow()
	}
	if !(table < quick && quick < prereq && prereq < demo && demo < install && install < 40) {
		t.Errorf("README.md order: table at line %d, quick start %d, prerequisites %d, demo %d, install %d; want them in "+
			"that order on the first screen", table, quick, prereq, demo, install)
	}
	if !strings.Contains(lines[prereq], "no GPU") {
		t.Errorf("the prerequisites do not say that --demo needs no GPU: %s", lines[prereq])
	}
	goMod := string(readRepoFile(t, "go.mod"))
	if m := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(goMod); m == nil || !strings.Contains(lines[prereq], "Go "+m[1]+" ") {
		t.Errorf("the prerequisites do not name go.mod's Go version %v: %s", m, lines[prereq])
	}
	if commands := readmeCommands(readme); !slices.Equal(commands, readmeDemo) {
		t.Errorf("README.md's command lines %q, want the demo and its top: %q", commands, readmeDemo)
	}
	line("`make test`")
	// Every figure of ours in the table is one docs/performance.md reports.
	perf := string(readRepoFile(t, "docs/performance.md"))
	ours := strings.Split(lines[perfRow], "|")[2]
	figures := regexp.MustCompile(`(\d+(?:\.\d+)?) MiB`).FindAllStringSubmatch(ours, -1)
	if len(figures) == 0 {
		t.Errorf("no measured figure in %q", ours)
	}
	for _, f := range figures {
		if !strings.Contains(perf, f[1]) {
			t.Errorf("README.md's %s MiB is not a figure of docs/performance.md", f[1])
		}
	}
}

// readmeDemo are the README's commands: the demo and its top, which need no C compiler (test/deploy runs them as
// written, and the README's prerequisites say why CGO_ENABLED=0).
var readmeDemo = []string{
	"CGO_ENABLED=0 go run ./cmd/gpu-pod-exporter --demo",
	"CGO_ENABLED=0 go run ./cmd/gpu-pod-exporter top --demo",
}

// readmeCommands are the command lines of the README's shell blocks, without their comments.
func readmeCommands(readme string) []string {
	var commands []string
	in := false
	for _, l := range strings.Split(readme, "\n") {
		switch {
		case strings.HasPrefix(l, "```"):
			in = l == "```sh"
		case in:
			commands = append(commands, strings.TrimSpace(strings.SplitN(l, "#", 2)[0]))
		}
	}
	return commands
}

// TestReleaseVersionNamedAlike: the changelog's newest version is the chart's version and appVersion (the default
// image tag), and the version the install guide and README name; the guide says what is published.
func TestReleaseVersionNamedAlike(t *testing.T) {
	changelog := string(readRepoFile(t, "CHANGELOG.md"))
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\]`).FindStringSubmatch(changelog)
	if m == nil {
		t.Fatal("CHANGELOG.md has no version section ## [X.Y.Z]")
	}
	v := m[1]
	chart := string(readRepoFile(t, chartDir+"/Chart.yaml"))
	for _, want := range []string{"\nversion: " + v + "\n", "\nappVersion: \"" + v + "\"\n"} {
		if !strings.Contains(chart, want) {
			t.Errorf("Chart.yaml lacks %q: the chart and the changelog name different versions", strings.TrimSpace(want))
		}
	}
	install := string(readRepoFile(t, "docs/install.md"))
	for _, want := range []string{"VERSION=" + v + " ", imageRepo + ":" + v, "--version " + v + " ", "tag `v" + v + "`"} {
		if !strings.Contains(install, want) {
			t.Errorf("docs/install.md does not name %q", want)
		}
	}
	for _, other := range regexp.MustCompile(`(?:VERSION=|`+regexp.QuoteMeta(imageRepo)+`:|--version )(\d+\.\d+\.\d+)`).FindAllStringSubmatch(install, -1) {
		if other[1] != v {
			t.Errorf("docs/install.md names version %s, the changelog %s", other[1], v)
		}
	}
	if !strings.Contains(install, "## What is published") || !strings.Contains(string(readRepoFile(t, "README.md")), "docs/install.md#what-is-published") {
		t.Error("docs/install.md has no \"What is published\" section that README.md links")
	}
}

// TestPerformanceDocForUsers: docs/performance.md says what the figures mean for a user before it gives them, gives
// them with the machine and date in a section of their own, says how they were measured, and reads as a guide, not
// a work log: no issue numbers of this project, no commit hashes.
func TestPerformanceDocForUsers(t *testing.T) {
	perf := string(readRepoFile(t, "docs/performance.md"))
	order := []string{"## What it means for you", "## Figures", "Machine:", "| source | processes |", "## Method"}
	last := -1
	for _, h := range order {
		i := strings.Index(perf, h)
		if i < 0 || i < last {
			t.Errorf("docs/performance.md lacks %q, or has it out of the order %q", h, order)
		}
		last = i
	}
	if !regexp.MustCompile(`Measured 20\d\d-\d\d-\d\d`).MatchString(perf) {
		t.Error("docs/performance.md's figures have no date")
	}
	for _, bad := range []*regexp.Regexp{regexp.MustCompile(`(?i)\bissue \d+`), regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)} {
		if m := bad.FindString(perf); m != "" {
			t.Errorf("docs/performance.md reads like a work log: %q", m)
		}
	}
}

// TestInstallVerifyChecklist: the install guide's checklist covers each way an install that helm calls a success
// can still fail (its queries run against a real Prometheus in TestDashboardQueries).
func TestInstallVerifyChecklist(t *testing.T) {
	install := string(readRepoFile(t, "docs/install.md"))
	i, j := strings.Index(install, "## Verify the install"), strings.Index(install, "## Kubernetes without Helm")
	if i < 0 || j < i {
		t.Fatal("docs/install.md has no Verify the install section before Kubernetes without Helm")
	}
	section := install[i:j]
	for what, want := range map[string]string{
		"scheduled pods against GPU nodes": "get ds", "the DaemonSet's count": "DESIRED",
		"readiness": "/readyz", "the GPU source": "gpu_pod_exporter_source_up",
		"ps on the node": "gpu-pod-exporter ps", "against nvidia-smi": "`nvidia-smi`",
		"non-empty pod names": `pod=""`, "resolver errors": `gpu_pod_exporter_resolver_requests_total{result="error"}`,
	} {
		if !strings.Contains(section, want) {
			t.Errorf("Verify the install does not check %s (%q)", what, want)
		}
	}
	// Each symptom of the troubleshooting section has its entry.
	for _, heading := range []string{"### No GPU source in the pod", "### 0 pods scheduled", "### Pod names are missing",
		"### hidepid", "### Driver and library mismatch"} {
		if !strings.Contains(install, "\n"+heading+"\n") {
			t.Errorf("docs/install.md's troubleshooting has no %q", heading)
		}
	}
}

// TestTroubleshootingQuotesTheExporter: the log lines the troubleshooting section tells users to look for are the
// exporter's own words, so that a reworded message fails here instead of leaving the guide wrong.
func TestTroubleshootingQuotesTheExporter(t *testing.T) {
	install := string(readRepoFile(t, "docs/install.md"))
	var code strings.Builder
	for _, dir := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(repoRoot(t), dir), func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				b, err := os.ReadFile(p)
				code.Write(b)
				return err
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, msg := range []string{
		"no GPU source: ", "NVML library libnvidia-ml.so.1 not found", "nvidia-smi source: ",
		"the NVIDIA kernel driver is not loaded", "no permission to open /dev/nvidia*",
		"libnvidia-ml.so.1 does not match the loaded kernel driver", "procfs is mounted with ",
		"reboot the node, or reload the nvidia kernel module with no GPU process running",
		"Driver/library version mismatch",
	} {
		if !strings.Contains(install, msg) {
			t.Errorf("the troubleshooting section no longer quotes %q", msg)
		}
		if !strings.Contains(code.String(), msg) {
			t.Errorf("the troubleshooting section quotes %q, which the exporter no longer says", msg)
		}
	}
}

// TestFAQ: "Do I still need dcgm-exporter?" is answered, from the field list in docs/compat.md, and every metric the
// FAQ names is one the reference documents.
func TestFAQ(t *testing.T) {
	faq := string(readRepoFile(t, "docs/faq.md"))
	i := strings.Index(faq, "## Do I still need dcgm-exporter?")
	if i < 0 {
		t.Fatal("docs/faq.md does not answer \"Do I still need dcgm-exporter?\"")
	}
	answer := faq[i:]
	if j := strings.Index(answer[3:], "\n## "); j >= 0 {
		answer = answer[:j+3]
	}
	if !strings.Contains(answer, "](compat.md") {
		t.Error("the dcgm-exporter answer does not point to docs/compat.md's field list")
	}
	ref := string(readRepoFile(t, "docs/reference.md"))
	for _, m := range regexp.MustCompile("`(gpu_[a-z_]+)`").FindAllStringSubmatch(faq, -1) {
		if !strings.Contains(ref, "`"+m[1]+"`") {
			t.Errorf("docs/faq.md names %s, which docs/reference.md does not document", m[1])
		}
	}
}
