package clidoc

import (
	"bytes"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"
)

// Roff leaves no request, escape or hyphen for a man page to misread: a help line that starts with "." or "'", a
// backslash, a flag's dashes.
func TestRoff(t *testing.T) {
	for in, want := range map[string]string{
		"--web.listen-address":   `\-\-web.listen\-address`,
		"a\n.TH x\n'br":          "a\n\\&.TH x\n\\&'br",
		`C:\path`:                `C:\epath`,
		"unix:///run/x.sock":     `unix:/\:/\:/\:run/\:x.sock`,
		"plain words, no marks.": "plain words, no marks.",
	} {
		if got := Roff(in); got != want {
			t.Errorf("Roff(%q) = %q, want %q", in, got, want)
		}
	}
}

// A help text's first sentence ends at its first full stop, not at an abbreviation's.
func TestFirstSentence(t *testing.T) {
	for in, want := range map[string]string{
		"Serve metrics. More.":                "Serve metrics.",
		"Label matchers, e.g. x=y. And more.": "Label matchers, e.g. x=y.",
		"No full stop":                        "No full stop",
	} {
		if got := firstSentence(in); got != want {
			t.Errorf("firstSentence(%q) = %q, want %q", in, got, want)
		}
	}
}

// format is a flag value with a fixed set of values.
type format struct{ v string }

func (f *format) Set(s string) error { f.v = s; return nil }
func (f *format) String() string     { return f.v }
func (f *format) Options() []string  { return []string{"table", "json"} }

// The scripts offer each command, its flags, the values of a flag with a fixed set and a command's words; a shell
// with no script is an error, not an empty script.
func TestWriteCompletion(t *testing.T) {
	app := kingpin.New("prog", "")
	app.Command("serve", "Serve.").Default().Flag("listen", "Where.").String()
	app.Command("ps", "Print.").Flag("output", "Format.").Short('o').SetValue(&format{})
	app.Command("completion", "Completion.")
	for _, shell := range Shells {
		var b bytes.Buffer
		if err := WriteCompletion(&b, shell, app, "serve", map[string][]string{"completion": {"bash", "fish"}}); err != nil {
			t.Fatalf("%s: %v", shell, err)
		}
		for _, want := range []string{"serve", "ps", "output", "listen", "table json", "bash fish"} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("%s: no %q in\n%s", shell, want, b.String())
			}
		}
	}
	if err := WriteCompletion(&bytes.Buffer{}, "tcsh", app, "serve", nil); err == nil {
		t.Error("tcsh: no error")
	}
}
