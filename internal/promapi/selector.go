package promapi

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Matcher is one label matcher of a selector: a label name, an operator (=, !=, =~, !~) and a value.
type Matcher struct {
	Name, Op, Value string
}

// Selector is a list of label matchers as PromQL writes them between braces: cluster="prod",instance=~"gpu-.*".
// Every query that reads the cluster carries it, so that a view can be narrowed to a cluster, a node pool or one
// node.
type Selector []Matcher

// ParseSelector reads label matchers, with or without the braces around them. Label names are PromQL's plain names
// (letters, digits and underscores, not starting with a digit), without the reserved "__" prefix; values are
// double-quoted strings with PromQL's (Go's) escapes, or backquoted raw strings; a regular expression must compile
// as Prometheus compiles it (RE2, anchored at both ends). An empty selector selects everything.
func ParseSelector(s string) (Selector, error) {
	p := &selectorParser{s: strings.TrimSpace(s)}
	if strings.HasPrefix(p.s, "{") {
		if !strings.HasSuffix(p.s, "}") {
			return nil, fmt.Errorf("%q opens a brace it does not close", s)
		}
		p.s = strings.TrimSpace(p.s[1 : len(p.s)-1])
	}
	var sel Selector
	for {
		p.space()
		if p.done() {
			return sel, nil
		}
		m, err := p.matcher()
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		sel = append(sel, m)
		p.space()
		if p.done() {
			return sel, nil
		}
		if !p.take(",") {
			return nil, fmt.Errorf("%q: want a comma between matchers at %q", s, p.rest())
		}
	}
}

// String writes the matchers as PromQL, without braces: each value quoted, so that the text can be put into any
// query between braces.
func (sel Selector) String() string {
	parts := make([]string, len(sel))
	for i, m := range sel {
		parts[i] = m.Name + m.Op + strconv.Quote(m.Value)
	}
	return strings.Join(parts, ",")
}

// With returns the matchers of sel followed by more (as PromQL text, e.g. `type="mps"`), between braces: the
// selector of one query. It is "" when there are none, so that `metric` + With() stays a plain metric name.
func (sel Selector) With(more ...string) string {
	parts := append([]string{}, more...)
	if s := sel.String(); s != "" {
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return ""
	}
	return "{" + strings.Join(parts, ",") + "}"
}

type selectorParser struct {
	s   string
	pos int
}

func (p *selectorParser) done() bool   { return p.pos >= len(p.s) }
func (p *selectorParser) rest() string { return p.s[p.pos:] }

func (p *selectorParser) space() {
	for !p.done() && strings.ContainsRune(" \t\n\r", rune(p.s[p.pos])) {
		p.pos++
	}
}

func (p *selectorParser) take(tok string) bool {
	if strings.HasPrefix(p.rest(), tok) {
		p.pos += len(tok)
		return true
	}
	return false
}

var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*`)

func (p *selectorParser) matcher() (Matcher, error) {
	var m Matcher
	m.Name = labelName.FindString(p.rest())
	if m.Name == "" {
		return m, fmt.Errorf("want a label name at %q", p.rest())
	}
	if strings.HasPrefix(m.Name, "__") {
		return m, fmt.Errorf("label %s: names starting with __ are Prometheus' own, not a target's", m.Name)
	}
	p.pos += len(m.Name)
	p.space()
	for _, op := range []string{"=~", "!~", "!=", "="} { // the two-character operators first
		if p.take(op) {
			m.Op = op
			break
		}
	}
	if m.Op == "" {
		return m, fmt.Errorf("want =, !=, =~ or !~ after %s at %q", m.Name, p.rest())
	}
	p.space()
	value, err := p.value()
	if err != nil {
		return m, fmt.Errorf("the value of %s: %w", m.Name, err)
	}
	m.Value = value
	if m.Op == "=~" || m.Op == "!~" {
		if _, err := regexp.Compile("^(?:" + value + ")$"); err != nil {
			return m, fmt.Errorf("the regular expression of %s: %w", m.Name, err)
		}
	}
	return m, nil
}

// value reads a double-quoted string (Go's escapes, which PromQL's are) or a backquoted raw string.
func (p *selectorParser) value() (string, error) {
	rest := p.rest()
	if rest == "" {
		return "", fmt.Errorf("missing")
	}
	switch rest[0] {
	case '`':
		end := strings.IndexByte(rest[1:], '`')
		if end < 0 {
			return "", fmt.Errorf("%s is not closed", rest)
		}
		p.pos += end + 2
		return rest[1 : end+1], nil
	case '"':
		for i := 1; i < len(rest); i++ {
			switch rest[i] {
			case '\\':
				i++
			case '"':
				v, err := strconv.Unquote(rest[:i+1])
				if err != nil {
					return "", fmt.Errorf("%s: %w", rest[:i+1], err)
				}
				p.pos += i + 1
				return v, nil
			}
		}
		return "", fmt.Errorf("%s is not closed", rest)
	}
	return "", fmt.Errorf("want a double-quoted or backquoted string at %q", rest)
}
