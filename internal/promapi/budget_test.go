package promapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// padding is how a hostile answer pads a field the client skips.
type padding int

const (
	oneString   padding = iota // data.pad is one string
	smallValues                // data.pad is an array of small numbers
	whiteSpace                 // white space before data.pad's value
)

// padded is an answer with n bytes of padding, generated as it is read.
func padded(n int64, how padding) io.Reader {
	head, tail := `{"status":"success","data":{"resultType":"vector","pad":`, `,"result":[]}}`
	p := map[padding]struct{ open, fill, end string }{
		oneString: {`"`, "x", `"`}, smallValues: {`[`, "1,", `1]`}, whiteSpace: {"", " ", "1"},
	}[how]
	return io.MultiReader(strings.NewReader(head+p.open), &repeat{s: p.fill, left: n}, strings.NewReader(p.end+tail))
}

// repeat reads s again and again, left bytes in all.
type repeat struct {
	s    string
	left int64
}

func (r *repeat) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && r.left > 0 {
		c := copy(p[n:min(len(p), n+int(r.left))], r.s)
		n += c
		r.left -= int64(c)
	}
	return n, nil
}

// A hostile or broken answer costs a bounded amount of memory whatever it holds: padding in a field the client
// skips fails at maxValueBytes, as one string, many small values or white space (which the decoder holds with the
// value after it), having allocated a few MiB rather than the padding several times over (100 MB of padding took
// 1.11 GB of RSS before).
func TestHostileAnswerCostsBoundedMemory(t *testing.T) {
	for _, tc := range []struct {
		what string
		how  padding
		want error
	}{
		{"100 MB in one skipped string", oneString, errValueTooLarge},
		{"100 MB of small values in a skipped array", smallValues, errValueTooLarge},
		{"100 MB of white space", whiteSpace, errValueTooLarge},
	} {
		t.Run(tc.what, func(t *testing.T) {
			budget := NewBudget(DefaultReadingBytes)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := decode(&boundedReader{r: padded(100<<20, tc.how), budget: budget}, func(Sample) error { return nil })
			runtime.ReadMemStats(&after)
			if !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%s: %v after %d MiB read, %.1f MiB allocated", tc.what, err, (budget.size-budget.left.Load())>>20,
				float64(allocated)/(1<<20))
			if allocated > 8*maxValueBytes {
				t.Errorf("%d MiB allocated, want at most %d", allocated>>20, 8*maxValueBytes>>20)
			}
		})
	}
}

// The queries of a reading, which run at once, share one budget: four answers of 30 KiB each pass a budget of
// 64 KiB together, though each is under it; alone, each reads through.
func TestReadingBudgetIsSharedByItsQueries(t *testing.T) {
	sample := `{"metric":{"instance":"gpu-a","pid":"1"},"value":[1,"1"]},`
	body := `{"status":"success","data":{"resultType":"vector","result":[` + strings.Repeat(sample, 30<<10/len(sample)) +
		`{"metric":{},"value":[1,"1"]}]}}`
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", jsonType)
		io.WriteString(w, body[:len(body)/2])
		w.(http.Flusher).Flush()
		<-release // every query has read half its answer before any reads the rest
		io.WriteString(w, body[len(body)/2:])
	}))
	t.Cleanup(srv.Close)
	c, _ := New(srv.URL, http.DefaultClient)
	read := func(ctx context.Context, queries int) []error {
		errs := make([]error, queries)
		var wg sync.WaitGroup
		for i := range queries {
			wg.Go(func() { _, errs[i] = c.Query(ctx, fmt.Sprint("q", i), time.Time{}, func(Sample) error { return nil }) })
		}
		time.Sleep(100 * time.Millisecond) // the halves are read: no sleep decides the result, it only orders the halves
		close(release)
		wg.Wait()
		release = make(chan struct{})
		return errs
	}
	errs := read(WithBudget(context.Background(), NewBudget(64<<10)), 4)
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if !strings.Contains(err.Error(), "larger than 64 KiB in all") {
				t.Errorf("error %v, want the reading's budget named", err)
			}
		}
	}
	if failed == 0 {
		t.Errorf("4 answers of 30 KiB read within a shared budget of 64 KiB")
	}
	c.SetMaxResponseBytes(64 << 10)
	for i, err := range read(context.Background(), 4) {
		if err != nil {
			t.Errorf("query %d with a budget of its own: %v", i, err)
		}
	}
}

// A sample is bounded as a value is, and nesting too; the warnings kept are bounded, the others counted.
func TestAnswerValuesAreBounded(t *testing.T) {
	labels := strings.Repeat(`"l":"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv",`, 2*maxValueBytes/50)
	for what, body := range map[string]string{
		"a sample of 2 MiB": `{"status":"success","data":{"resultType":"vector","result":[{"metric":{` + labels +
			`"a":"b"},"value":[1,"1"]}]}}`,
		"nesting 64 deep": `{"status":"success","data":{"resultType":"vector","x":` + strings.Repeat("[", 64) +
			strings.Repeat("]", 64) + `,"result":[]}}`,
		"a number of 2 MiB": `{"status":"success","x":` + strings.Repeat("1", 2*maxValueBytes) + `}`,
	} {
		_, err := decode(&boundedReader{r: strings.NewReader(body), budget: NewBudget(DefaultReadingBytes)}, func(Sample) error { return nil })
		if !errors.Is(err, errValueTooLarge) {
			t.Errorf("%s: error %v, want it refused", what, err)
		}
	}
	ws := `"` + strings.Repeat(`w",  "`, 1000) + `w"`
	got, err := decode(&boundedReader{r: strings.NewReader(`{"status":"success","warnings":[` + ws + `],` +
		`"data":{"resultType":"vector","result":[]}}`), budget: NewBudget(DefaultReadingBytes)}, func(Sample) error { return nil })
	if err != nil || len(got) != maxWarnings+1 || got[maxWarnings] != "warning: 901 more warnings in this answer" {
		t.Errorf("1,001 warnings: %d kept, last %q, error %v", len(got), got[len(got)-1], err)
	}
}

// Under its bounds, the bounded reader changes nothing: an answer read through it gives the samples, warnings and
// error that it gives read directly, whatever the answer (nesting past maxDepth aside, which it refuses).
func FuzzBoundedReaderChangesNothingUnderItsBounds(f *testing.F) {
	for _, s := range []string{
		`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"b"},"value":[1.5,"2"]}]},"warnings":["w"]}`,
		`{"status":"success","data":{"result":[{"value":[1,"NaN"],"metric":{"x\"y":"\\"}}],"pad":[[{}]],"resultType":"vector"},"infos":[]}`,
		`{"data":{"res\u0075lt":[]}, "status":"error","errorType":"bad_data","error":"x"}`,
		`{"warnings":null,"status":"success","data":{"resultType":"vector","result":[]}}`,
		`[]`, `{"status":1}`, `{"data":{"result":{}}}`, ` { "data" : { "result" : [ { } ] } } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		collect := func(r io.Reader) (string, error) {
			var out strings.Builder
			ws, err := decode(r, func(s Sample) error {
				fmt.Fprintf(&out, "%v %v %v;", s.Metric, s.Value, s.Time)
				return nil
			})
			fmt.Fprint(&out, ws)
			return out.String(), err
		}
		plain, plainErr := collect(strings.NewReader(string(b)))
		bounded, boundedErr := collect(&boundedReader{r: strings.NewReader(string(b)), budget: NewBudget(DefaultReadingBytes)})
		if errors.Is(boundedErr, errValueTooLarge) && strings.Contains(boundedErr.Error(), "nested deeper") {
			return
		}
		if plain != bounded || (plainErr == nil) != (boundedErr == nil) {
			t.Fatalf("%q: directly %q, %v; bounded %q, %v", b, plain, plainErr, bounded, boundedErr)
		}
	})
}
