package promapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
)

// What an answer may cost. The decoder holds one JSON value at a time, never a whole body; these bound what one
// value, and all the answers of a reading, may take, so that a hostile or broken server (a field the client skips
// padded to gigabytes, a sample of a million labels) costs a bounded amount of memory whatever it sends:
//   - a reading's answers together: DefaultReadingBytes, every byte counted, skipped ones included, across the
//     queries that run at once (Budget);
//   - one string or number, and one array or object (a sample, a field the client skips): maxValueBytes;
//   - nesting: maxDepth.
const (
	// DefaultReadingBytes is half as much again as the queries of a reading of 1,000 eight-GPU nodes answer (31 MB
	// for top's), which keeps a reading's memory within 150 MiB and half as much again, whatever the server sends:
	// 225 MiB at most when every byte is a process row to keep, about 30 MiB when it is padding.
	DefaultReadingBytes = 48 << 20
	maxValueBytes       = 1 << 20
	maxDepth            = 32
	// maxWarnings bounds the warnings and infos kept of one answer; the rest are counted in one more line.
	maxWarnings = 100
)

// Budget is the answer bytes that the queries of one reading may read in all; it is safe for concurrent use.
type Budget struct {
	size int64
	left atomic.Int64
}

// NewBudget returns a budget of n bytes.
func NewBudget(n int64) *Budget {
	b := &Budget{size: n}
	b.left.Store(n)
	return b
}

type budgetKey struct{}

// WithBudget returns a context whose queries read from b: a reading gives its queries one budget. A query whose
// context has none gets one of its own, of the client's size.
func WithBudget(ctx context.Context, b *Budget) context.Context {
	return context.WithValue(ctx, budgetKey{}, b)
}

func budgetOf(ctx context.Context) *Budget {
	b, _ := ctx.Value(budgetKey{}).(*Budget)
	return b
}

// errTooLarge is an answer past its reading's budget; errValueTooLarge one whose value or nesting is past its bound.
var (
	errTooLarge      = errors.New("answer too large")
	errValueTooLarge = errors.New("a value of the answer is too large")
)

// boundedReader counts what it reads against a budget, and follows the JSON it passes to the decoder closely enough
// (strings, escapes, nesting, the keys of the envelope) to fail before the decoder holds it: a string or number
// longer than maxValueBytes, an array or object longer than that, or nesting deeper than maxDepth. The envelope's
// own containers are exempt: the answer, its data, data's result (whose samples are each bounded) and the warnings
// and infos (whose strings are each bounded, and which the decoder reads one at a time). So a field the client skips,
// read whole by the decoder, is bounded as a sample is.
type boundedReader struct {
	r      io.Reader
	budget *Budget

	offset   int64 // bytes read before the current chunk
	depth    int
	inString bool
	escaped  bool
	run      int64 // bytes of the current string or other scalar
	// The outermost container being bounded: its depth once open (0: none) and where it began.
	boundDepth int
	boundStart int64
	// The envelope's keys: the string that just closed, when short and at depth 1 or 2 (a key when ':' follows),
	// and the key of depth 1 and 2 whose value is being read.
	str     [8]byte
	strLen  int
	strKey  bool // str may be a key: short, without escapes, at depth 1 or 2
	pending string
	keys    [3]string
	err     error // once failed, always failed
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	left := b.budget.left.Load()
	if left <= 0 {
		b.err = errTooLarge
		return 0, b.err
	}
	n, err := b.r.Read(p[:min(int64(len(p)), left)])
	if b.budget.left.Add(-int64(n)) < 0 {
		b.err = errTooLarge
		return 0, b.err
	}
	if scanErr := b.scan(p[:n]); scanErr != nil {
		b.err = scanErr
		return 0, b.err
	}
	b.offset += int64(n)
	return n, err
}

// scan follows chunk, the next bytes of the answer.
func (b *boundedReader) scan(chunk []byte) error {
	for i := 0; i < len(chunk); {
		if b.inString {
			i = b.scanString(chunk, i)
			if b.run > maxValueBytes {
				return fmt.Errorf("%w: a string longer than %s", errValueTooLarge, sizeText(maxValueBytes))
			}
			continue
		}
		switch c := chunk[i]; c {
		case '"':
			b.inString, b.run, b.strLen, b.strKey = true, 0, 0, b.depth == 1 || b.depth == 2
			b.pending = ""
		case ':':
			if b.depth >= 0 && b.depth < len(b.keys) {
				b.keys[b.depth] = b.pending
			}
			b.run = 0
		case '{', '[':
			if b.boundDepth == 0 && !b.envelope(c) {
				b.boundDepth, b.boundStart = b.depth+1, b.offset+int64(i)
			}
			if b.depth++; b.depth > maxDepth {
				return fmt.Errorf("%w: nested deeper than %d", errValueTooLarge, maxDepth)
			}
			b.run = 0
		case '}', ']':
			if b.depth == b.boundDepth {
				b.boundDepth = 0
			}
			if b.depth >= 0 && b.depth < len(b.keys) {
				b.keys[b.depth] = ""
			}
			b.depth--
			b.run = 0
		case ',':
			b.run = 0
		default: // a number, a literal, or white space, which the decoder holds with the value after it
			if b.run++; b.run > maxValueBytes {
				return fmt.Errorf("%w: a number, literal or run of white space longer than %s", errValueTooLarge, sizeText(maxValueBytes))
			}
		}
		i++
	}
	if b.boundDepth > 0 && b.offset+int64(len(chunk))-b.boundStart > maxValueBytes {
		return fmt.Errorf("%w: an array or object longer than %s", errValueTooLarge, sizeText(maxValueBytes))
	}
	return nil
}

// scanString follows a string from chunk[i] to its end or the chunk's, and returns where it stopped.
func (b *boundedReader) scanString(chunk []byte, i int) int {
	if b.escaped {
		b.escaped, b.run, b.strKey = false, b.run+1, false
		return i + 1
	}
	rest := chunk[i:]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		end = len(rest)
	}
	if esc := bytes.IndexByte(rest[:end], '\\'); esc >= 0 {
		end = esc
		b.escaped, b.strKey = true, false
	}
	if b.strKey {
		if b.strLen+end <= len(b.str) {
			b.strLen += copy(b.str[b.strLen:], rest[:end])
		} else {
			b.strKey = false
		}
	}
	b.run += int64(end)
	switch {
	case b.escaped:
		b.run++
		return i + end + 1
	case end < len(rest):
		b.inString = false
		if b.strKey {
			b.pending = string(b.str[:b.strLen])
		}
		return i + end + 1
	}
	return len(chunk)
}

// envelope reports whether a container opening now (c, at the current depth) is one of the answer's envelope:
// the answer itself, its data object, data's result array, and the warnings and infos arrays.
func (b *boundedReader) envelope(c byte) bool {
	switch b.depth {
	case 0:
		return c == '{'
	case 1:
		k := b.keys[1]
		return c == '{' && k == "data" || c == '[' && (k == "warnings" || k == "infos")
	case 2:
		return c == '[' && b.keys[1] == "data" && b.keys[2] == "result"
	}
	return false
}

// sizeText is a budget as a message says it: "48 MiB", or "4 KiB" below a MiB.
func sizeText(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
