package view

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Filter keeps the processes, signals and nodes that match every one of its terms. A term is a text that any text
// shown of a process matches (its user, name, PID, GPU, owner, node or namespace, case-insensitive, in part), or a
// field and a value: user:alice, gpu:3 (GPU 3 and its MIG devices; gpu:0,1 either), ns:ml (the namespace, whole),
// node:gpu-a (in part), pid:4242, owner:bert (in part). The zero Filter keeps everything.
type Filter struct {
	terms []term
}

type term struct {
	field  string   // "" for any text
	values []string // any of them
}

// The fields a term can name, with the short names a person types.
var fields = map[string]string{
	"user": "user", "gpu": "gpu", "ns": "namespace", "namespace": "namespace", "node": "node", "pid": "pid",
	"owner": "owner",
}

// ParseFilter reads a filter as a person types it: terms separated by spaces. A term whose prefix is not a field
// (an owner's "pod uid" or a URL's "http:") is plain text.
func ParseFilter(s string) Filter {
	var f Filter
	for _, word := range strings.Fields(s) {
		f = f.And(word)
	}
	return f
}

// And returns the filter with one more term, parsed as ParseFilter parses a word.
func (f Filter) And(word string) Filter {
	t := term{values: []string{word}}
	if name, value, ok := strings.Cut(word, ":"); ok {
		if field, known := fields[strings.ToLower(name)]; known && value != "" {
			t = term{field: field, values: strings.Split(value, ",")}
		}
	}
	f.terms = append(append([]term(nil), f.terms...), t)
	return f
}

// Field returns the filter with a term of field (user, gpu, namespace, node, pid, owner) whose value is any of
// values; none adds nothing.
func (f Filter) Field(field string, values ...string) Filter {
	var kept []string
	for _, v := range values {
		if v != "" {
			kept = append(kept, v)
		}
	}
	if len(kept) == 0 {
		return f
	}
	f.terms = append(append([]term(nil), f.terms...), term{field: field, values: kept})
	return f
}

// With returns the filter with g's terms too.
func (f Filter) With(g Filter) Filter {
	f.terms = append(append([]term(nil), f.terms...), g.terms...)
	return f
}

// Empty reports whether the filter keeps everything.
func (f Filter) Empty() bool { return len(f.terms) == 0 }

// Process reports whether a process passes the filter.
func (f Filter) Process(p *Process) bool {
	for _, t := range f.terms {
		if !t.process(p) {
			return false
		}
	}
	return true
}

func (t term) process(p *Process) bool {
	for _, v := range t.values {
		if t.processValue(p, v) {
			return true
		}
	}
	return false
}

func (t term) processValue(p *Process, v string) bool {
	switch t.field {
	case "user":
		return strings.EqualFold(p.Identity.User, v)
	case "gpu":
		return gpuIs(p.GPUColumn(), v)
	case "namespace":
		return strings.EqualFold(p.Identity.Namespace, v)
	case "node":
		return containsFold(p.Node, v)
	case "pid":
		return strconv.FormatUint(uint64(p.PID), 10) == v
	case "owner":
		return containsFold(p.Owner().String(), v)
	}
	return containsFold(p.Identity.User, v) || containsFold(p.Name, v) || containsFold(p.GPUColumn(), v) ||
		strings.Contains(strconv.FormatUint(uint64(p.PID), 10), v) || containsFold(p.Owner().String(), v) ||
		containsFold(p.Node, v)
}

// gpuIs reports whether a GPU column ("3", "2:1/0") is GPU v, or is the MIG device v.
func gpuIs(column, v string) bool {
	index, _, _ := strings.Cut(column, ":")
	return column == v || index == v
}

// Node reports whether a node passes on its own name: the filter's node terms, and any plain text, match it.
// Terms of other fields are left to the node's processes (a node that runs a matching process is kept too).
func (f Filter) Node(name string) bool {
	named := false
	for _, t := range f.terms {
		switch t.field {
		case "node", "":
			ok := false
			for _, v := range t.values {
				ok = ok || containsFold(name, v)
			}
			if !ok {
				return false
			}
			named = true
		default:
			return false
		}
	}
	return named || f.Empty()
}

// Signal reports whether a signal passes the filter: on its node, its GPU, its text (for a pod's signal, the pod's
// namespace too).
func (f Filter) Signal(s *Signal) bool {
	for _, t := range f.terms {
		ok := false
		for _, v := range t.values {
			switch t.field {
			case "node":
				ok = ok || containsFold(s.Node, v)
			case "gpu":
				ok = ok || s.GPU != "" && gpuIs(s.GPU, v)
			case "namespace":
				ok = ok || s.Kind != GPUHealth && s.Kind != NodeProblem && strings.EqualFold(s.Namespace, v)
			case "owner":
				ok = ok || s.Kind != GPUHealth && s.Kind != NodeProblem && containsFold(s.Text, v)
			case "":
				ok = ok || containsFold(s.String(), v)
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// containsFold reports whether sub is within s, case-insensitively, without a copy of either.
func containsFold(s, sub string) bool {
	if sub == "" {
		return true
	}
	n := len(sub)
	for i := 0; i+n <= len(s); {
		if strings.EqualFold(s[i:i+n], sub) {
			return true
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return false
}
