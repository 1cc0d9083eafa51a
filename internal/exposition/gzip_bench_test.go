package exposition

import (
	stdgzip "compress/gzip"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
)

// processBody is about what 2,048 GPU processes' series look like in the text format (2.5 MB).
func processBody() []byte {
	var b strings.Builder
	for _, m := range []string{"memory_used_bytes", "sm_utilization_ratio", "memory_utilization_ratio"} {
		fmt.Fprintf(&b, "# HELP gpu_process_%s Something.\n# TYPE gpu_process_%s gauge\n", m, m)
		for p := range 2048 {
			fmt.Fprintf(&b, `gpu_process_%s{compute_instance="",container="main",container_id="%064x",gpu="%d",gpu_instance="",namespace="team-%d",pid="%d",pod="job-%d-%d",pod_uid="7a3c1f00-0000-4000-8000-%012d",process_name="python3",process_type="compute",slurm_job_id="",systemd_unit="",uuid="GPU-00000000-0000-4000-8000-%012d"} %d`+"\n",
				m, 0xc0ffee0000+p%256, p%8, p%4, 100000+p, p%8, p%32, p%256, p%8, 268435456+p)
		}
	}
	return []byte(b.String())
}

// BenchmarkGzip compares the standard library's gzip with klauspost/compress's on a large body, at the default
// level (promhttp's) and at BestSpeed. Measured here: see docs/performance.md.
func BenchmarkGzip(b *testing.B) {
	body := processBody()
	run := func(b *testing.B, w compressor) {
		var c counter
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			c = 0
			w.Reset(&c)
			_, _ = w.Write(body)
			_ = w.Close()
		}
		b.ReportMetric(float64(c), "gzip-bytes")
	}
	for _, level := range []int{stdgzip.DefaultCompression, stdgzip.BestSpeed} {
		b.Run(fmt.Sprintf("stdlib/level=%d", level), func(b *testing.B) {
			w, _ := stdgzip.NewWriterLevel(nil, level)
			run(b, w)
		})
		b.Run(fmt.Sprintf("klauspost/level=%d", level), func(b *testing.B) {
			w, _ := gzip.NewWriterLevel(nil, level)
			run(b, w)
		})
	}
}

// compressor is what the two gzip writers have in common.
type compressor interface {
	io.WriteCloser
	Reset(io.Writer)
}

type counter int

func (c *counter) Write(p []byte) (int, error) { *c += counter(len(p)); return len(p), nil }
