package promapi

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseSelector(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Selector
		text string
	}{
		{"", nil, ""},
		{"{}", nil, ""},
		{` cluster="prod" `, Selector{{"cluster", "=", "prod"}}, `cluster="prod"`},
		{`{cluster="prod",instance=~"gpu-.*"}`, Selector{{"cluster", "=", "prod"}, {"instance", "=~", "gpu-.*"}}, `cluster="prod",instance=~"gpu-.*"`},
		{"cluster != `a\\b` , zone!~\"eu-.*\",", Selector{{"cluster", "!=", `a\b`}, {"zone", "!~", "eu-.*"}}, `cluster!="a\\b",zone!~"eu-.*"`},
		{`pool="a\"b\u00e9\n"`, Selector{{"pool", "=", "a\"bé\n"}}, `pool="a\"bé\n"`},
	} {
		got, err := ParseSelector(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: got %#v, want %#v", c.in, got, c.want)
		}
		if got.String() != c.text {
			t.Errorf("%q: written %s, want %s", c.in, got.String(), c.text)
		}
	}
}

func TestParseSelectorRefuses(t *testing.T) {
	for _, c := range []struct{ in, why string }{
		{`cluster`, "want =, !=, =~ or !~"},
		{`cluster=prod`, "want a double-quoted or backquoted string"},
		{`cluster='prod'`, "want a double-quoted or backquoted string"},
		{`cluster="prod`, "is not closed"},
		{`{cluster="prod"`, "does not close"},
		{`cluster="a" zone="b"`, "want a comma"},
		{`1x="a"`, "want a label name"},
		{`__name__="up"`, "Prometheus' own"},
		{`instance=~"gpu-("`, "regular expression"},
		{`a="\q"`, "invalid syntax"},
		{`a=` + "`x", "is not closed"},
		{`a=`, "missing"},
	} {
		_, err := ParseSelector(c.in)
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%q: error %v, want one that says %q", c.in, err, c.why)
		}
	}
}

func TestSelectorWith(t *testing.T) {
	sel := Selector{{"cluster", "=", "prod"}}
	if got := sel.With(`type="mps"`); got != `{type="mps",cluster="prod"}` {
		t.Errorf("With: %s", got)
	}
	if got := Selector(nil).With(); got != "" {
		t.Errorf("empty With: %q", got)
	}
	if got := Selector(nil).With(`a="b"`); got != `{a="b"}` {
		t.Errorf("With on none: %q", got)
	}
}

// What parses is written back as text that parses to the same matchers: the selector put into every query is the
// user's, whatever they typed.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{``, `{}`, `a="b"`, `{a=~"x|y",b!="c\"",c!~` + "`raw\\`" + `}`, `a="\u00e9\x41\101"`, `a="\xff"`, `a = "b" , `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			return
		}
		again, err := ParseSelector(sel.String())
		if err != nil {
			t.Fatalf("%q parsed, but its text %q does not: %v", s, sel.String(), err)
		}
		if !reflect.DeepEqual(sel, again) && !(len(sel) == 0 && len(again) == 0) {
			t.Fatalf("%q: %#v, written %q, read back %#v", s, sel, sel.String(), again)
		}
		for _, m := range sel {
			if strings.HasPrefix(m.Name, "__") {
				t.Fatalf("%q: reserved name %s accepted", s, m.Name)
			}
		}
	})
}
