package terminal

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal/terminaltest"
)

func TestEscape(t *testing.T) {
	type escape struct{ name, in, want string }
	var attacks []escape
	for _, a := range terminaltest.Attacks {
		attacks = append(attacks, escape{a.Name, a.Text, a.Escaped})
	}
	for _, c := range append(attacks, []escape{
		{"plain text is kept", "python3", "python3"},
		{"the empty string", "", ""},
		{"spaces and punctuation", "pod ml/bert-0/trainer (x)", "pod ml/bert-0/trainer (x)"},
		{"non-ASCII graphic text", "训练 H100 ×3 °C … \uFFFD", "训练 H100 ×3 °C … \uFFFD"},
		{"a backslash stays, as systemd writes it", `system-getty\x2dauto.slice`, `system-getty\x2dauto.slice`},
		{"quotes stay", `say "hi" 'there'`, `say "hi" 'there'`},
		// A comm that conceals every row after it until the terminal resets.
		{"SGR conceal", "\x1b[8m", `\x1b[8m`},
		// OSC 0 sets the window title; OSC 52 writes the clipboard. Both end in BEL or ST.
		{"OSC window title", "\x1b]0;pwned\x07", `\x1b]0;pwned\a`},
		{"OSC 52 clipboard", "\x1b]52;c;cm0gLXJmIH4K\x1b\\", `\x1b]52;c;cm0gLXJmIH4K\x1b\`},
		// 15 bytes, the most a comm holds: a newline and a forged row.
		{"a forged row", "a\n0  1  compute", `a\n0  1  compute`},
		{"carriage return and tab", "x\ry\tz", `x\ry\tz`},
		{"NUL and the other C0 controls", "\x00\x01\x1f", `\x00\x01\x1f`},
		{"DEL", "a\x7fb", `a\x7fb`},
		// U+009B is CSI in one character to a terminal that reads C1 controls.
		{"C1 CSI", "\u009b8m", `\u009b8m`},
		{"C1 OSC and ST", "\u009d0;t\u009c", `\u009d0;t\u009c`},
		{"line separator", "a\u2028b", `a\u2028b`},
		{"paragraph separator", "a\u2029b", `a\u2029b`},
		{"a bidirectional override", "gnp.\u202eexe", `gnp.\u202eexe`},
		{"a tag character", "x\U000e0041", `x\U000e0041`},
		{"invalid UTF-8", "a\xffb\xc3", `a\xffb\xc3`},
		{"an encoded surrogate", "\xed\xa0\x80", `\xed\xa0\x80`},
		{"CSI as UTF-8", "\xc2\x9b", `\u009b`},
	}...) {
		t.Run(c.name, func(t *testing.T) {
			got := Escape(c.in)
			if got != c.want {
				t.Errorf("Escape(%q) = %q, want %q", c.in, got, c.want)
			}
			if again := Escape(got); again != got {
				t.Errorf("escaping again changed %q to %q", got, again)
			}
		})
	}
}

// Plain text costs no copy: Escape runs on every cell of every frame.
func TestEscapePlainTextAllocatesNothing(t *testing.T) {
	s := strings.Repeat("pod ml-research/llama-eval-0/eval ", 4)
	if n := testing.AllocsPerRun(100, func() { _ = Escape(s) }); n != 0 {
		t.Errorf("Escape of plain text allocates %v times", n)
	}
}

func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "python3", "\x1b[8m", "a\n0  1  compute", "\u009b", "\u2028", "\xff", `a\b"c`, "\xc3("} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Escape(s)
		if !utf8.ValidString(got) {
			t.Fatalf("Escape(%q) = %q is not valid UTF-8", s, got)
		}
		for _, r := range got {
			if !unicode.IsGraphic(r) {
				t.Fatalf("Escape(%q) = %q keeps %U", s, got, r)
			}
		}
		if Escape(got) != got {
			t.Fatalf("Escape is not idempotent on %q", got)
		}
		// Text that needs nothing is kept whole, and the notation is Go's, but for quotes and backslashes.
		if !strings.ContainsAny(s, `"\`) {
			q := strconv.QuoteToGraphic(s)
			if want := q[1 : len(q)-1]; got != want {
				t.Fatalf("Escape(%q) = %q, want strconv's %q", s, got, want)
			}
		}
	})
}

// JSON keeps every name exactly, and shows a terminal nothing it would act on: what encoding/json leaves raw is a
// \u escape that decodes to the same character.
func TestEscapeJSON(t *testing.T) {
	for _, a := range terminaltest.Attacks {
		if !utf8.ValidString(a.Text) {
			continue // encoding/json writes U+FFFD for it
		}
		b, err := json.Marshal(map[string]string{"name": "é" + a.Text + "😀"})
		if err != nil {
			t.Fatal(err)
		}
		out := EscapeJSON(b)
		terminaltest.Shown(t, string(out), false)
		var back map[string]string
		if err := json.Unmarshal(out, &back); err != nil || back["name"] != "é"+a.Text+"😀" {
			t.Errorf("%s: %s decodes to %q (%v)", a.Name, out, back["name"], err)
		}
	}
	if got := string(EscapeJSON([]byte("{\"a\":\"\U000e0001\"}"))); got != `{"a":"\udb40\udc01"}` {
		t.Errorf("a tag character beyond the BMP: %s", got)
	}
}
