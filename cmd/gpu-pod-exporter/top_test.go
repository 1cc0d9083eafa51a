package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// Log lines pass through, except while top's view owns the terminal: then they wait, bounded, until it is restored.
func TestHeldLog(t *testing.T) {
	var out bytes.Buffer
	h := &heldLog{out: &out, limit: 10}
	fmt.Fprint(h, "before\n")
	h.hold()
	fmt.Fprint(h, "during 1\n")
	fmt.Fprint(h, "during 2\n")
	if out.String() != "before\n" {
		t.Errorf("held lines reached the terminal: %q", out.String())
	}
	h.release()
	fmt.Fprint(h, "after\n")
	if want := "before\nduring 1\nd(8 more bytes of log left out)\nafter\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
	if strings.Count(out.String(), "during") != 1 {
		t.Error("the limit was not kept")
	}
}

// A one-shot command's warnings carry the node's text (a runtime's error, a cgroup path): escaped, each stays one
// line that acts on nothing.
func TestHumanLogIsEscaped(t *testing.T) {
	var out bytes.Buffer
	logger := slog.New(&humanHandler{w: &out}).With("runtime", "containerd\x1b[8m")
	logger.Warn("cannot ask the runtime\u2028forged", "err", errors.New("rpc error: \x1b]0;pwned\x07\nforged"))
	want := `gpu-pod-exporter: warning: cannot ask the runtime\u2028forged (runtime containerd\x1b[8m, err rpc error: \x1b]0;pwned\a\nforged)` + "\n"
	if out.String() != want {
		t.Errorf("got  %q\nwant %q", out.String(), want)
	}
}
