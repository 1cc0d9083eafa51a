package nvidiasmi

import (
	"bytes"
	"reflect"
	"strings"
)

// Most of `nvidia-smi -q -x` is never read: the supported clock tables alone are four fifths of a GPU's output.
// skipUnread cuts every element that the schema (schema.go) does not name out of the document before it is
// decoded, so that encoding/xml tokenizes only what becomes the Snapshot. It cuts nothing that could change what the
// decoder reads: only whole elements of a document whose tags all nest, with comments, CDATA sections and
// processing instructions passed through as they are. It runs in linear time: nvidia-smi output is trusted no more
// than any other input.

// readElements are the element names that the schema reads, at any depth, and the children of its name-value lists:
// an element by another name is never read, nor is anything inside it.
var readElements = schemaElements(reflect.TypeFor[xmlLog](), namedElements()...)

func schemaElements(t reflect.Type, more ...string) map[string]bool {
	names := map[string]bool{}
	for _, name := range more {
		names[name] = true
	}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			tag, opts, _ := strings.Cut(f.Tag.Get("xml"), ",")
			if opts != "" && opts != "omitempty" { // attr, chardata, innerxml, comment, any: no element name
				continue
			}
			for name := range strings.SplitSeq(tag, ">") {
				if name != "" {
					names[name] = true
				}
			}
			walk(f.Type)
		}
	}
	walk(t)
	return names
}

// skipUnread returns b without the elements inside the root element that the schema does not read. It reads b once,
// tag by tag, and cuts only when every tag it saw is closed in order: otherwise it returns b as it is, and the decoder
// says what is wrong. It returns b itself when there is nothing to cut.
func skipUnread(b []byte) []byte {
	type open struct {
		name  []byte
		start int
	}
	var stack []open
	var cuts [][2]int // ranges of b to leave out, in order
	cutting := -1     // the stack depth of the element being cut; -1: none
	for i := 0; ; {
		lt := bytes.IndexByte(b[i:], '<')
		if lt < 0 {
			break
		}
		i += lt
		rest := b[i+1:]
		switch {
		case bytes.HasPrefix(rest, []byte("!--")):
			i = passThrough(b, i, "-->")
			continue
		case bytes.HasPrefix(rest, []byte("![CDATA[")):
			i = passThrough(b, i, "]]>")
			continue
		case bytes.HasPrefix(rest, []byte("?")):
			i = passThrough(b, i, "?>")
			continue
		case bytes.HasPrefix(rest, []byte("!")): // <!DOCTYPE …>, before the root
			i = passThrough(b, i, ">")
			continue
		}
		end := tagEnd(b, i)
		if end < 0 {
			return b
		}
		if rest[0] == '/' { // an end tag: it must close the innermost open element
			name := rest[1 : 1+nameEnd(rest[1:])]
			if len(stack) == 0 || !bytes.Equal(stack[len(stack)-1].name, name) {
				return b
			}
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if cutting == len(stack) {
				cuts = append(cuts, [2]int{top.start, end})
				cutting = -1
			}
			i = end
			continue
		}
		name := rest[:nameEnd(rest)]
		if len(name) == 0 {
			return b
		}
		unread := len(stack) > 0 && cutting < 0 && !readElements[string(name)]
		if b[end-2] == '/' { // <name/>
			if unread {
				cuts = append(cuts, [2]int{i, end})
			}
		} else {
			if unread {
				cutting = len(stack)
			}
			stack = append(stack, open{name: name, start: i})
		}
		i = end
	}
	if len(stack) > 0 || len(cuts) == 0 {
		return b
	}
	kept := len(b)
	for _, c := range cuts {
		kept -= c[1] - c[0]
	}
	out := make([]byte, 0, kept)
	from := 0
	for _, c := range cuts {
		out = append(out, b[from:c[0]]...)
		from = c[1]
	}
	return append(out, b[from:]...)
}

// passThrough returns the index just after the first terminator at or after b[i:], or len(b).
func passThrough(b []byte, i int, terminator string) int {
	if j := bytes.Index(b[i:], []byte(terminator)); j >= 0 {
		return i + j + len(terminator)
	}
	return len(b)
}

// tagEnd returns the index just after the '>' that ends the tag starting at b[i], skipping quoted attribute values,
// or -1 when the tag does not end.
func tagEnd(b []byte, i int) int {
	gt := bytes.IndexByte(b[i:], '>')
	if gt < 0 {
		return -1
	}
	if bytes.IndexByte(b[i:i+gt], '"') < 0 && bytes.IndexByte(b[i:i+gt], '\'') < 0 {
		return i + gt + 1 // no attribute value: nvidia-smi's tags but <gpu id="…">
	}
	var quote byte
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '>':
			return j + 1
		}
	}
	return -1
}

// nameEnd returns the length of the tag name at the start of s.
func nameEnd(s []byte) int {
	for i, c := range s {
		switch c {
		case ' ', '\t', '\n', '\r', '>', '/', '<', '=', '"', '\'':
			return i
		}
	}
	return len(s)
}
