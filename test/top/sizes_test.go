//go:build e2e

package top

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/tmuxterm"
)

// At every size from 60×15 to 200×50, the real terminal shows top's title on its first line, its key help on its
// last, the process table's header and at least one row, nothing wrapped; the GPUs and signals that do not fit
// say how many were cut; the pod's name is the last part of an owner cut. Grouped, the same.
func TestTopFitsEverySize(t *testing.T) {
	term := tmuxterm.Start(t, 80, 24, topInShell("--demo")...)
	term.WaitForText("q quit")
	for _, group := range []bool{false, true} {
		// The grouped table's header says PROCS: a grouped size passes on a grouped frame, not on a stale ungrouped one.
		header := regexp.MustCompile(`^GPU +PID `)
		if group {
			term.Keys("w")
			header = regexp.MustCompile(`^GPU +PROCS `)
		}
		for _, w := range []int{60, 80, 120, 200} {
			for _, h := range []int{15, 24, 50} {
				t.Run(fmt.Sprintf("%dx%d group=%v", w, h, group), func(t *testing.T) {
					term := term.On(t)
					term.Tmux("resize-window", "-t", "top", "-x", fmt.Sprint(w), "-y", fmt.Sprint(h))
					lines := term.WaitFor(fmt.Sprintf("a %d×%d screen", w, h), func(lines []string) bool {
						at := -1
						for i, l := range lines {
							if header.MatchString(l) {
								at = i
							}
						}
						return len(lines) == h && strings.HasPrefix(lines[0], "gpu-pod-exporter top ") &&
							strings.HasSuffix(lines[h-1], "q quit") && at > 0 && at+1 < h-1 &&
							regexp.MustCompile(`^\d`).MatchString(lines[at+1])
					})
					screen := strings.Join(lines, "\n")
					if h < 24 && !strings.Contains(screen, "more GPUs") {
						t.Errorf("the GPUs cut without a word:\n%s", screen)
					}
					if w >= 120 && !group && !strings.Contains(screen, "pod ml-training/bert-finetune-7c9d8b6f4-x2kqp/trainer") && h > 15 {
						t.Errorf("at %d columns a pod's owner is cut:\n%s", w, screen)
					}
					// Cut, the pod's name is cut last: its namespace and container are down to a letter already.
					if !group && h > 15 && strings.Contains(screen, "bert-finetune") && !strings.Contains(screen, "bert-finetune-7c9d8b6f4-x2kqp") &&
						!regexp.MustCompile(` m…/bert-finetune-7c[^/ ]*…/t… *\n`).MatchString(screen) {
						t.Errorf("the pod's name is cut before its namespace and container:\n%s", screen)
					}
				})
			}
		}
	}
	term.Tmux("resize-window", "-t", "top", "-x", "80", "-y", "24")
	quit(term)
}

// docs/top.png is the demo node's top in a real terminal, as it is now.
func TestScreenshotOfTheDemoNode(t *testing.T) {
	term := tmuxterm.Start(t, 100, 32, topInShell("--demo")...)
	lines := term.WaitForText("q quit", "○ idle allocation: search/rag-index-0/indexer holds GPU 7")
	if len(pidColumn(lines)) != 15 {
		t.Errorf("not every row shows:\n%s", strings.Join(lines, "\n"))
	}
	clock := regexp.MustCompile(`^(gpu-pod-exporter top  )\d\d:\d\d:\d\d`)
	term.Screenshot("../../docs/top.png", func(s string) string { return clock.ReplaceAllString(s, "${1}hh:mm:ss") })
	quit(term)
}
