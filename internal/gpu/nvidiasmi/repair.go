package nvidiasmi

import (
	"bytes"
	"strconv"
	"strings"
	"unicode/utf8"
)

// repair makes nvidia-smi's output well-formed enough for encoding/xml without changing any well-formed part of it.
// nvidia-smi writes process names unescaped and unchecked, so a single odd process on the node would otherwise
// fail every scrape:
//   - bytes that are not valid UTF-8 (seen when nvidia-smi runs concurrently: <process_name>\xff…) and characters
//     that XML forbids become U+FFFD;
//   - a bare '&' that starts no entity encoding/xml knows becomes "&amp;";
//   - a '<' inside <process_name>…</process_name> becomes "&lt;".
func repair(b []byte) []byte {
	// Nearly all of a real output is printable ASCII without '&': it is taken as it is, and only the rest is
	// looked at rune by rune.
	clean := 0
	for clean < len(b) && plainASCII(b[clean]) {
		clean++
	}
	if clean == len(b) {
		return escapeProcessNames(b)
	}
	out := make([]byte, 0, len(b)+64)
	out = append(out, b[:clean]...)
	for i := clean; i < len(b); {
		if plainASCII(b[i]) {
			out = append(out, b[i])
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size <= 1, !xmlChar(r):
			out = utf8.AppendRune(out, utf8.RuneError)
		case r == '&' && !entityAt(b[i:]):
			out = append(out, "&amp;"...)
		default:
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return escapeProcessNames(out)
}

// plainASCII reports whether c is an ASCII character that repair keeps as it is.
func plainASCII(c byte) bool {
	return c >= 0x20 && c < 0x80 && c != '&' || c == '\t' || c == '\n' || c == '\r'
}

func xmlChar(r rune) bool {
	return r == 0x09 || r == 0x0A || r == 0x0D ||
		r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}

// entityAt reports whether b starts with an entity or character reference that encoding/xml accepts.
func entityAt(b []byte) bool {
	if len(b) > 12 {
		b = b[:12]
	}
	end := bytes.IndexByte(b, ';')
	if end < 2 {
		return false
	}
	name := string(b[1:end])
	switch name {
	case "amp", "lt", "gt", "quot", "apos":
		return true
	}
	if strings.HasPrefix(name, "#x") {
		_, err := strconv.ParseUint(name[2:], 16, 32)
		return err == nil && len(name) > 2
	}
	if strings.HasPrefix(name, "#") {
		_, err := strconv.ParseUint(name[1:], 10, 32)
		return err == nil && len(name) > 1
	}
	return false
}

// escapeProcessNames escapes '<' in the text of every <process_name> that is closed before the next process
// starts. It runs in linear time: nvidia-smi output is trusted no more than any other input.
func escapeProcessNames(b []byte) []byte {
	open, closing, procEnd := []byte("<process_name>"), []byte("</process_name>"), []byte("</process_info>")
	// next returns the index of the first sep at or after from, len(b) when there is none. *cached remembers the
	// last answer, which stays right while from does not pass it, so that no byte is searched twice.
	next := func(sep []byte, from int, cached *int) int {
		if *cached >= from {
			return *cached
		}
		if i := bytes.Index(b[from:], sep); i >= 0 {
			*cached = from + i
		} else {
			*cached = len(b)
		}
		return *cached
	}
	openAt, closeAt, procEndAt := -1, -1, -1
	var out []byte
	copied, pos := 0, 0 // b[:copied] is in out; b[:pos] has been looked at
	for {
		o := next(open, pos, &openAt)
		if o == len(b) {
			break
		}
		start := o + len(open)
		c := next(closing, start, &closeAt)
		if c == len(b) {
			break
		}
		pos = start
		if next(open, start, &openAt) < c || next(procEnd, start, &procEndAt) < c || bytes.IndexByte(b[start:c], '<') < 0 {
			continue
		}
		out = append(out, b[copied:start]...)
		for _, ch := range b[start:c] {
			if ch == '<' {
				out = append(out, "&lt;"...)
			} else {
				out = append(out, ch)
			}
		}
		copied, pos = c, c
	}
	if copied == 0 {
		return b
	}
	return append(out, b[copied:]...)
}
