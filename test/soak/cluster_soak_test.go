//go:build soak

package soak

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// hostileAnswer writes a Prometheus API answer of about size bytes to w, its bulk in what pad writes.
type hostileAnswer struct {
	what string
	size int64
	pad  func(w io.Writer, size int64)
	// samples is set where the bulk is samples the reader keeps, not a field it skips.
	samples bool
}

// fill writes size bytes of s repeated.
func fill(w io.Writer, s string, size int64) {
	chunk := []byte(strings.Repeat(s, 64<<10/len(s)))
	for ; size > 0; size -= int64(len(chunk)) {
		if _, err := w.Write(chunk[:min(int64(len(chunk)), size)]); err != nil {
			return
		}
	}
}

func skippedString(w io.Writer, size int64) {
	io.WriteString(w, `{"status":"success","data":{"resultType":"vector","stats":"`)
	fill(w, "x", size)
	io.WriteString(w, `","result":[]}}`)
}

func skippedValues(w io.Writer, size int64) {
	io.WriteString(w, `{"status":"success","data":{"resultType":"vector","stats":[`)
	fill(w, "1,", size)
	io.WriteString(w, `1],"result":[]}}`)
}

// processSamples are samples as the process memory query answers them, every one another process.
func processSamples(w io.Writer, size int64) {
	io.WriteString(w, `{"status":"success","data":{"resultType":"vector","result":[`)
	for i := 0; size > 0; i++ {
		n, err := fmt.Fprintf(w, `{"metric":{"__name__":"gpu_process_memory_used_bytes","instance":"gpu-node-%04d",`+
			`"job":"gpu-pod-exporter","gpu":"%d","uuid":"GPU-%08x-0000-4000-8000-%012x","pid":"%d","process_name":"python3",`+
			`"process_type":"compute","namespace":"team-%02d","pod":"job-%06d-0","container":"worker"},"value":[1765000000,"1073741824"]},`,
			i/32, i%8, i/32, i%8, 5_000_000+i, i%20, i)
		if err != nil {
			return
		}
		size -= int64(n)
	}
	io.WriteString(w, `{"metric":{},"value":[1765000000,"0"]}]}}`)
}

// TestSoakHostilePrometheusAnswers runs `ps --prometheus` against a server whose every answer is padded to 100 MB
// or 500 MB in a field the reader skips, or made of 100 MB of samples it would keep. A reading's answers are
// bounded together (48 MiB) and each value the decoder holds at once (1 MiB), so the reading fails with one line,
// its peak RSS well under the 150 MiB that 1,000 nodes take (padding in a skipped field took 1.11 GB for 100 MB
// and 5.07 GB for 500 MB before); the samples case is the most a reading can hold, the budget's worth of rows.
func TestSoakHostilePrometheusAnswers(t *testing.T) {
	binary, err := e2eutil.BuildBinary(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const mb = 1 << 20
	for _, a := range []hostileAnswer{
		{what: "100 MB in a skipped string", size: 100 * mb, pad: skippedString},
		{what: "500 MB in a skipped string", size: 500 * mb, pad: skippedString},
		{what: "100 MB of small values in a skipped array", size: 100 * mb, pad: skippedValues},
		{what: "100 MB of process samples", size: 100 * mb, pad: processSamples, samples: true},
	} {
		t.Run(a.what, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				// Samples go to the query that keeps a row of each, the others answer nothing; padding goes to all.
				if r.ParseForm(); a.samples && !strings.Contains(r.Form.Get("query"), "gpu_process_memory_used_bytes") {
					io.WriteString(w, `{"status":"success","data":{"resultType":"vector","result":[]}}`)
					return
				}
				a.pad(w, a.size)
			}))
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, "ps", "--prometheus="+srv.URL, "-o", "json", "--prometheus.timeout=4m")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			runErr := cmd.Run()
			peak := float64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) / 1024 // KiB
			msg := strings.TrimSpace(stderr.String())
			t.Logf("%s: exit %v after %v, peak RSS %.0f MiB; %.300s", a.what, runErr, time.Since(start).Round(time.Millisecond), peak, msg)
			if runErr == nil || strings.Count(msg, "\n") > 0 || !strings.Contains(msg, "longer than 1 MiB") && !strings.Contains(msg, "larger than 48 MiB in all") {
				t.Errorf("exit %v, stderr %q; want a failure in one line that names the bound", runErr, msg)
			}
			limit := 150.0
			if a.samples {
				limit = 150 + 100 // the budget's worth of rows, 1.5 times 1,000 nodes' answers: 225 MiB measured
			}
			if peak > limit {
				t.Errorf("peak RSS %.0f MiB, want at most %.0f", peak, limit)
			}
		})
	}
}
