// Package terminaltest is what the tests of terminal output share: text an attacker can put in a process name, and
// a check that output carries none of it to the terminal raw. Only tests import it.
package terminaltest

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// Attack is text that acts on a terminal printed raw, each short enough for a process name (15 bytes, the most
// /proc/<pid>/comm holds), with what its escape shows.
type Attack struct {
	Name    string
	Text    string
	Escaped string
}

// Attacks are the ways a name attacks a terminal: one of each.
var Attacks = []Attack{
	{"SGR conceal hides the rows after it", "\x1b[8m", `\x1b[8m`},
	{"OSC 0 sets the window title", "\x1b]0;pwned\x07", `\x1b]0;pwned\a`},
	{"a newline forges a row", "a\n0  1  compute", `a\n0  1  compute`},
	{"C1 CSI, one character", "\u009b8m", `\u009b8m`},
	{"DEL", "x\x7fy", `x\x7fy`},
	{"line separator", "x\u2028y", `x\u2028y`},
	{"paragraph separator", "x\u2029y", `x\u2029y`},
	{"invalid UTF-8", "x\xff\xfey", `x\xff\xfey`},
	{"right-to-left override reverses what follows", "x\u202ey", `x\u202ey`},
	{"zero-width space hides a difference", "x\u200by", `x\u200by`},
	// The isolates in two names, so that each name shown escaped fits top's PROCESS column.
	{"left-to-right and right-to-left isolates reorder what follows", "x\u2066\u2067y", `x\u2066\u2067y`},
	{"first-strong isolate and its pop reorder what follows", "x\u2068\u2069y", `x\u2068\u2069y`},
	{"a byte order mark and direction marks hide a difference", "x\ufeff\u200e\u200fy", `x\ufeff\u200e\u200fy`},
}

// Shown fails the test if out holds anything a terminal would act on rather than show: a control character other
// than the newlines between lines, DEL, a C1 control, a line or paragraph separator, or invalid UTF-8. styled
// allows the SGR sequences (ESC [ … m) of the output's own colours.
func Shown(t testing.TB, out string, styled bool) {
	t.Helper()
	for i := 0; i < len(out); {
		if styled && strings.HasPrefix(out[i:], "\x1b[") {
			end := strings.IndexFunc(out[i+2:], func(r rune) bool { return r != ';' && (r < '0' || r > '9') })
			if end >= 0 && out[i+2+end] == 'm' {
				i += 2 + end + 1
				continue
			}
		}
		r, n := utf8.DecodeRuneInString(out[i:])
		if (r == utf8.RuneError && n == 1) || (r != '\n' && !unicode.IsGraphic(r)) {
			t.Errorf("output holds %q at byte %d: %q", out[i:i+n], i, out[max(i-20, 0):min(i+20, len(out))])
			return
		}
		i += n
	}
}
