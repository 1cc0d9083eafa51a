// Package terminal makes text from the node safe to print on a person's terminal. A process name, a cgroup
// directory, a runtime's container name or its error text are chosen by whoever runs the workload: printed raw, a
// control sequence in one of them hides the rows after it, sets the window title or writes the clipboard, and a
// newline forges a row. Every line that ps, top and their views print goes through Escape; JSON output and the
// metrics keep the exact bytes, which their encoders escape.
package terminal

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Escape returns s with every character a terminal would act on, rather than show, written as the visible escape a
// Go string literal uses: C0 controls and DEL as \n, \t, \x1b and the like, C1 controls, line and paragraph
// separators, bidirectional overrides and other non-graphic characters as \u009b or \U000e0001, and each byte of
// invalid UTF-8 as \xff. Everything graphic, spaces and backslashes included, is kept as it is, so a name reads as
// it was written; the result is valid UTF-8 of graphic characters only, so its width is what the terminal shows,
// and escaping it again changes nothing.
//
// The notation is strconv.QuoteToGraphic's without the quotes and without escaping `"` and `\`: quoting would
// double the backslashes systemd unit names are full of (system-getty\x2dauto.slice).
func Escape(s string) string {
	i := unsafeAt(s)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i >= 0 {
		b.WriteString(s[:i])
		_, n := utf8.DecodeRuneInString(s[i:])
		// Quoted alone, an invalid byte or a non-graphic character is its escape alone: neither is `"` or `\`.
		q := strconv.QuoteToGraphic(s[i : i+n])
		b.WriteString(q[1 : len(q)-1])
		s = s[i+n:]
		i = unsafeAt(s)
	}
	b.WriteString(s)
	return b.String()
}

// unsafeAt is the index of the first byte Escape changes, -1 when there is none: most text is plain and is
// returned as it is, without a copy. Printable ASCII, most of what it sees, is passed byte by byte; an invalid byte
// decodes as utf8.RuneError, which is graphic, so its width tells it from a real U+FFFD.
func unsafeAt(s string) int {
	for i := 0; i < len(s); {
		if c := s[i]; c >= ' ' && c < 0x7f {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsGraphic(r) || (r == utf8.RuneError && n == 1) {
			return i
		}
		i += n
	}
	return -1
}

// EscapeJSON returns JSON text with every character a terminal would act on rather than show that encoding/json
// leaves raw (DEL, C1 controls, bidirectional overrides, zero-width and other format characters) written as a JSON
// \u escape, which decodes to the same string: JSON printed on a terminal then shows what Escape shows of a name,
// and a program that reads it gets the exact value. encoding/json escapes the C0 controls, U+2028 and U+2029
// itself; b must be valid UTF-8, as encoding/json writes it.
func EscapeJSON(b []byte) []byte {
	i := jsonUnsafeAt(b)
	if i < 0 {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i >= 0 {
		out = append(out, b[:i]...)
		r, n := utf8.DecodeRune(b[i:])
		if r > 0xffff {
			hi, lo := utf16.EncodeRune(r)
			out = appendU(appendU(out, hi), lo)
		} else {
			out = appendU(out, r)
		}
		b = b[i+n:]
		i = jsonUnsafeAt(b)
	}
	return append(out, b...)
}

func appendU(b []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	return append(b, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
}

// jsonUnsafeAt is the index of the first non-ASCII character that is not graphic, -1 when there is none.
func jsonUnsafeAt(b []byte) int {
	for i := 0; i < len(b); {
		if b[i] == 0x7f {
			return i
		}
		if b[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if !unicode.IsGraphic(r) && r != utf8.RuneError {
			return i
		}
		i += n
	}
	return -1
}
