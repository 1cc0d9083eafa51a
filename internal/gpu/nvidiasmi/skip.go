package nvidiasmi

import (
	"bytes"
	"reflect"
	"strings"
)

// Most of `nvidia-smi -q -x` is never read: the supported clock tables alone are four fifths of a GPU's output.
// skipUnread cuts every element that the schema (schema.go) does not name out of the document before it is
// decoded, so that encoding/xml tokenizes only what becomes the Snapshot. It cuts nothing that could change what the
// decoder reads: an element is cut only whole, from its start tag to its own end tag with no element of the same
// name inside, and comments, CDATA sections and processing instructions are passed through as they are. Input it
// cannot follow is left to the decoder to judge.

// readElements are the element names that the schema reads, at any depth: an element by another name is never
// read, nor is anything inside it.
var readElements = schemaElements(reflect.TypeFor[xmlLog]())

func schemaElements(t reflect.Type) map[string]bool {
	names := map[string]bool{}
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

// skipUnread returns b without the elements inside the root element that the schema does not read. It returns b
// itself when there is nothing to cut.
func skipUnread(b []byte) []byte {
	var out []byte
	copied := 0 // b[:copied] is decided: in out, or cut
	rootSeen := false
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
		case len(rest) == 0 || rest[0] == '!' || rest[0] == '/':
			i++
			continue
		}
		name := rest[:nameEnd(rest)]
		if !rootSeen || readElements[string(name)] {
			rootSeen = true
			i++
			continue
		}
		end := elementEnd(b, i, name)
		if end < 0 {
			i++
			continue
		}
		out = append(out, b[copied:i]...)
		copied, i = end, end
	}
	if out == nil {
		return b
	}
	return append(out, b[copied:]...)
}

// passThrough returns the index just after the first terminator at or after b[i:], or len(b).
func passThrough(b []byte, i int, terminator string) int {
	if j := bytes.Index(b[i:], []byte(terminator)); j >= 0 {
		return i + j + len(terminator)
	}
	return len(b)
}

// nameEnd returns the length of the tag name at the start of s.
func nameEnd(s []byte) int {
	for i, c := range s {
		switch c {
		case ' ', '\t', '\n', '\r', '>', '/':
			return i
		}
	}
	return len(s)
}

// elementEnd returns the index just after the end of the element whose start tag begins at b[start], or -1 when it
// cannot tell: no end tag, or an element of the same name inside it.
func elementEnd(b []byte, start int, name []byte) int {
	gt := bytes.IndexByte(b[start:], '>')
	if gt < 0 || len(name) == 0 || bytes.ContainsAny(b[start:start+gt], `"'`) {
		return -1 // no end, or attributes, whose values may hold '>': nvidia-smi gives no unread element any
	}
	if b[start+gt-1] == '/' { // <name/>
		return start + gt + 1
	}
	body := start + gt + 1
	closing := append(append([]byte("</"), name...), '>')
	j := bytes.Index(b[body:], closing)
	if j < 0 {
		return -1
	}
	inner := b[body : body+j]
	open := append([]byte("<"), name...)
	for k := 0; ; {
		m := bytes.Index(inner[k:], open)
		if m < 0 {
			break
		}
		k += m + len(open)
		if k == len(inner) || nameEnd(inner[k:]) == 0 {
			return -1 // the same element nested: leave it to the decoder
		}
	}
	return body + j + len(closing)
}
