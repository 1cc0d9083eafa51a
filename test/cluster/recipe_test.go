//go:build e2e

package cluster

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/tmuxterm"
)

// The three-node demo cluster of docs/top.md, run as it is written there, in a real terminal: three demo nodes
// of their own, each with its GPU faults, through a real Prometheus. Its screen is docs/top-cluster.png.
func TestTheDocsDemoCluster(t *testing.T) {
	doc, err := os.ReadFile("../../docs/top.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(doc)[strings.Index(string(doc), "## A cluster to try"):]
	start := strings.Index(section, "```sh\n") + len("```sh\n")
	script := section[start : start+strings.Index(section[start:], "\n```\n")]

	// gpu-pod-exporter on the PATH, and a scratch directory the test removes.
	bin := t.TempDir()
	if err := os.Symlink(binary, filepath.Join(bin, "gpu-pod-exporter")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("TMPDIR", t.TempDir())

	term := tmuxterm.Start(t, 120, 36, "bash", "-c", script)
	// The exporters and Prometheus the script starts are in the window's process group.
	pane, err := strconv.Atoi(term.Format("#{pane_pid}"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-pane, syscall.SIGTERM) })

	lines := term.WaitForText("3 nodes  24 GPUs  45 processes", "(simulated)")
	for _, want := range []string{
		`^✗ node-a +8 +6 +\d+% +194/606G +2 +1 up · 3 GPUs ✗$`,
		`^✗ node-b +8 +6 .* up · 3 GPUs ✗$`,
		`^✗ node-c +8 +6 .* up · 3 GPUs ✗$`,
		// Each node's GPU that needs a reset, first; each node's own.
		`^✗ GPU 6 of node-a: needs GPU reset, row remap pending, XID 48, 63 · GPU \d of node-b: needs GPU reset`,
		`^! unrequested use: data-science/jupyter-bob-0/notebook on GPU 3 of node-a$`,
		`^! unrequested use: data-science/jupyter-bob-\d/notebook on GPU \d of node-b$`,
	} {
		if !matchesLine(lines, want) {
			t.Errorf("no line like %s in\n%s", want, strings.Join(lines, "\n"))
		}
	}
	if strings.Contains(strings.Join(lines, "\n"), "scraped twice") {
		t.Errorf("three demo nodes are taken for one:\n%s", strings.Join(lines, "\n"))
	}
	clock := regexp.MustCompile(`^(gpu-pod-exporter top  )\d\d:\d\d:\d\d`)
	term.Screenshot("../../docs/top-cluster.png", func(s string) string { return clock.ReplaceAllString(s, "${1}hh:mm:ss") })
	term.Keys("q")
	testkit.WaitFor(t, tmuxterm.Wait, "top to quit", func() bool { return term.Format("#{pane_dead}") == "1" || !strings.Contains(term.Screen(), "q quit") })
}
