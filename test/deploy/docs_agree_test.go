package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Facts that more than one document states, each held to its one source, so that the documents cannot contradict
// each other again.

// TestCostFiguresAgree: the memory and CPU a node of 2,048 GPU processes costs, and the memory idle, are stated by
// docs/performance.md's summary ("What it means for you"), and the README's comparison and the FAQ say the same.
func TestCostFiguresAgree(t *testing.T) {
	perf := string(readRepoFile(t, "docs/performance.md"))
	find := func(what, expr string) string {
		t.Helper()
		m := regexp.MustCompile(expr).FindStringSubmatch(perf)
		if m == nil {
			t.Fatalf("docs/performance.md's summary no longer states %s (%s)", what, expr)
		}
		return m[1]
	}
	idle := find("the memory idle", `About (\d+-\d+) MiB resident idle`)
	busy := find("the memory at 2,048 processes", `(\d+-\d+) MiB on a node with 2,048 GPU processes`)
	cpu := find("the CPU at 2,048 processes", `(\d+-\d+) ms with 2,048`)

	readme := string(readRepoFile(t, "README.md"))
	row := regexp.MustCompile(`(?m)^\| Memory on the node \|([^|]*)\|`).FindStringSubmatch(readme)
	if row == nil || !strings.Contains(row[1], idle+" MiB idle") || !strings.Contains(row[1], busy+" MiB at 2,048 processes") {
		t.Errorf("README.md's memory row %q, want %s MiB idle and %s MiB at 2,048 processes", row, idle, busy)
	}
	faq := string(readRepoFile(t, "docs/faq.md"))
	i := strings.Index(faq, "## What does it cost on a node?")
	if i < 0 {
		t.Fatal(`docs/faq.md does not answer "What does it cost on a node?"`)
	}
	answer := faq[i : i+strings.Index(faq[i+3:], "\n## ")+3]
	for _, want := range []string{idle + " MiB of memory idle", busy + " MiB and " + cpu + " ms\nwith 2,048 processes"} {
		if !strings.Contains(answer, want) {
			t.Errorf("the FAQ's cost answer does not say %q:\n%s", want, answer)
		}
	}
	// No other figure of ours: the chart's request and limit are the only other MiB there.
	for _, m := range regexp.MustCompile(`(\d+(?:-\d+)?) MiB`).FindAllStringSubmatch(answer, -1) {
		if m[1] != idle && m[1] != busy && m[1] != "64" && m[1] != "256" {
			t.Errorf("the FAQ's cost answer says %s MiB, which docs/performance.md's summary does not", m[1])
		}
	}
}

// TestDCGMFieldCountsAgree: dcgm-exporter's default counter file (test/compat's copy, which test/compat serves
// line by line) has fields and a label; every count of them the documents give is that file's.
func TestDCGMFieldCountsAgree(t *testing.T) {
	var fields, labels, profiling int
	for _, line := range strings.Split(string(readRepoFile(t, "test/compat/testdata/default-counters.csv")), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.Split(line, ",")
		switch kind := strings.TrimSpace(parts[1]); {
		case kind == "label":
			labels++
		case strings.HasPrefix(parts[0], "DCGM_FI_PROF_"):
			profiling++
			fields++
		default:
			fields++
		}
	}
	if labels != 1 {
		t.Fatalf("default-counters.csv has %d labels; the documents say it has one", labels)
	}
	count := regexp.MustCompile(`(?:all|the other) (\d+) (?:of dcgm-exporter's default )?fields`)
	for _, doc := range []string{"README.md", "docs/faq.md", "CHANGELOG.md", "docs/compat.md"} {
		text := strings.Join(strings.Fields(string(readRepoFile(t, doc))), " ")
		for _, m := range count.FindAllStringSubmatchIndex(text, -1) {
			n, _ := strconv.Atoi(text[m[2]:m[3]])
			claim := text[m[0]:min(len(text), m[1]+80)]
			switch {
			case strings.HasPrefix(claim, "the other"):
				if n != fields-profiling {
					t.Errorf("%s: %q: the fields besides the %d profiling ones are %d", doc, claim, profiling, fields-profiling)
				}
			case n != fields:
				t.Errorf("%s: %q: dcgm-exporter's default set has %d fields and a label", doc, claim, fields)
			case !strings.Contains(claim, "label"):
				t.Errorf("%s: %q does not say that the set has a label besides its fields", doc, claim)
			}
		}
		if strings.Contains(text, "26 fields") || strings.Contains(text, "26 of dcgm-exporter") {
			t.Errorf("%s counts %d fields and a label as 26 fields", doc, fields)
		}
	}
}

// TestGoVersionNamed: the documents that say which Go builds the project name go.mod's, patch release included:
// go 1.26.8 in go.mod refuses an older 1.26.
func TestGoVersionNamed(t *testing.T) {
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(string(readRepoFile(t, "go.mod")))
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	for doc, prefix := range map[string]string{"README.md": "Needs Go ", "CONTRIBUTING.md": "Go ", "docs/install.md": "Go "} {
		text := string(readRepoFile(t, doc))
		if !strings.Contains(text, prefix+m[1]+" or later") {
			t.Errorf("%s does not say %q", doc, prefix+m[1]+" or later")
		}
		for _, named := range regexp.MustCompile(`\bGo (1\.\d+(?:\.\d+)?)\b`).FindAllStringSubmatch(text, -1) {
			if strings.HasPrefix(m[1], named[1]) && named[1] != m[1] {
				t.Errorf("%s names Go %s, go.mod needs %s", doc, named[1], m[1])
			}
		}
	}
}

// TestDockerBuildLine: the install guide's and the Dockerfile's docker build line are one line, and the version it
// stamps is the Makefile's: the vX.Y.Z tag without its v, "dev" in a clone without tags (git describe fails there).
func TestDockerBuildLine(t *testing.T) {
	install := string(readRepoFile(t, "docs/install.md"))
	i := strings.Index(install, "docker build -t gpu-pod-exporter")
	if i < 0 {
		t.Fatal("docs/install.md has no docker build line")
	}
	line := install[i : i+strings.Index(install[i:], "\n```")]
	var dockerfile []string
	for _, l := range strings.Split(string(readRepoFile(t, "Dockerfile")), "\n") {
		continued := len(dockerfile) > 0 && strings.HasSuffix(dockerfile[len(dockerfile)-1], "\\")
		if strings.HasPrefix(l, "#   docker build") || continued {
			dockerfile = append(dockerfile, strings.TrimPrefix(l, "#"))
		}
	}
	if got := strings.Join(strings.Fields(strings.Join(dockerfile, "\n")), " "); got != strings.Join(strings.Fields(line), " ") {
		t.Errorf("the Dockerfile's build line\n%s\nis not the install guide's\n%s", got, line)
	}
	if !strings.Contains(line, "--build-arg VERSION=$(make -s version) ") {
		t.Fatalf("the build line does not take the version from the Makefile:\n%s", line)
	}
	makefile := filepath.Join(repoRoot(t), "Makefile")
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@example.com"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	version := func() string {
		t.Helper()
		cmd := exec.Command("make", "-s", "-f", makefile, "version")
		cmd.Dir = dir
		for _, v := range os.Environ() {
			if !strings.HasPrefix(v, "VERSION=") { // the Makefile's own, not one set in the environment
				cmd.Env = append(cmd.Env, v)
			}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make version: %v\n%s", err, out)
		}
		return string(out)
	}
	git("init", "-q")
	git("commit", "-q", "--allow-empty", "-m", "a commit")
	if got := version(); got != "dev\n" {
		t.Errorf("in a clone without tags: %q, want dev", got)
	}
	git("tag", "v1.2.3")
	if got := version(); got != "1.2.3\n" {
		t.Errorf("at the tag v1.2.3: %q, want 1.2.3", got)
	}
}

// TestChartNotesSayWhatIsPublished: while the install guide says nothing is published, the chart's notes say that
// the default image is not, and how to use one built from the Dockerfile; with an image of one's own, they do not.
func TestChartNotesSayWhatIsPublished(t *testing.T) {
	install := string(readRepoFile(t, "docs/install.md"))
	unpublished := strings.Contains(install, "## What is published\n\n**Nothing yet.**")
	notes := string(readRepoFile(t, chartDir+"/templates/NOTES.txt"))
	if says := strings.Contains(notes, "is not published yet"); says != unpublished {
		t.Errorf("the install guide says nothing is published: %v; the chart's notes say the image is not: %v", unpublished, says)
	}
}

// TestBottlerocketPresetSaysSELinux: the preset that Bottlerocket takes says what its SELinux does to the runtime
// socket the chart mounts by default, and what can be done about it.
func TestBottlerocketPresetSaysSELinux(t *testing.T) {
	preset := strings.Join(strings.Fields(string(readRepoFile(t, presetsDir+"/nvidia-volume-mounts.yaml"))), " ")
	values := string(readRepoFile(t, chartDir+"/values.yaml"))
	dir := regexp.MustCompile(`(?m)^  socketDirectory: (\S+)$`).FindStringSubmatch(values)
	sock := regexp.MustCompile(`(?m)^  socket: (\S+)$`).FindStringSubmatch(values)
	if dir == nil || sock == nil {
		t.Fatal("values.yaml has no runtime.socketDirectory and runtime.socket")
	}
	for _, want := range []string{"Bottlerocket", "SELinux", "container_t", dir[1] + " with " + sock[1], "permission denied",
		"seLinuxOptions", `runtime.socketDirectory: ""`, `("Pod names are missing")`} {
		if !strings.Contains(preset, want) {
			t.Errorf("the volume-mounts preset does not say %q", want)
		}
	}
	if !strings.Contains(string(readRepoFile(t, "docs/install.md")), "\n### Pod names are missing\n") {
		t.Error(`docs/install.md has no "Pod names are missing" section, which the preset points to`)
	}
}
