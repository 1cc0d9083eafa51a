package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
)

// A fleet node: 8 H100s with 4 pods each, time-sliced, every pod allocated its GPU; on every tenth node one pod
// uses a GPU it was not allocated, and on every tenth node (another one) a pod holds a GPU idle.
const (
	gpusPerNode      = 8
	processesPerGPU  = 4
	namespacesInUse  = 20
	firstPID         = 5_000_000 // above the kernel's largest pid_max: no process of this host lends its name
	sampleSpacing    = 15 * time.Second
	samplesPerSeries = 3
)

func nodeName(i int) string { return fmt.Sprintf("gpu-node-%04d", i) }

func gpuUUID(node, g int) string { return fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", node, g) }

// nodeFile writes node i's simulated node file.
func nodeFile(i int) string {
	var b bytes.Buffer
	b.WriteString("driver_version: \"580.95.05\"\ncuda_version: \"13.0\"\ngpus:\n")
	var allocs []string
	for g := range gpusPerNode {
		uuid := gpuUUID(i, g)
		fmt.Fprintf(&b, `  - uuid: %s
    name: NVIDIA H100 80GB HBM3
    memory_total_bytes: 85520809984
    utilization_ratio: %.2f
    memory_utilization_ratio: 0.3
    temperature_celsius: %d
    power_usage_watts: %d
    power_limit_watts: 700
    energy_joules: 100000000
    performance_state: 0
    clocks_hertz: {sm: 1980000000, memory: 2619000000}
    ecc_errors: {corrected: 0, uncorrected: 0}
    processes:
`, uuid, 0.1+0.1*float64(g), 40+g, 200+40*g)
		for p := range processesPerGPU {
			n := (i*gpusPerNode+g)*processesPerGPU + p
			ns := fmt.Sprintf("team-%02d", n%namespacesInUse)
			pod := fmt.Sprintf("job-%06d-0", n)
			fmt.Fprintf(&b, `      - pid: %d
        name: python3
        type: compute
        used_memory_bytes: %d
        sm_utilization_ratio: %.2f
        identity: {namespace: %s, pod: %s, container: worker, pod_uid: %08x-0000-4000-8000-%012x, container_id: %064x}
`, firstPID+n, (1+p)<<30, 0.05*float64(1+p), ns, pod, n, n, n)
			unrequested := i%10 == 3 && g == 0 && p == 0
			if !unrequested {
				allocs = append(allocs, fmt.Sprintf("  - {namespace: %s, pod: %s, container: worker, device_ids: [\"%s::%d\"]}", ns, pod, uuid, p))
			}
		}
	}
	if i%10 == 7 {
		allocs = append(allocs, fmt.Sprintf("  - {namespace: team-idle, pod: notebook-%04d-0, container: notebook, device_ids: [\"%s::%d\"]}",
			i, gpuUUID(i, gpusPerNode-1), processesPerGPU))
	}
	b.WriteString("allocations:\n" + strings.Join(allocs, "\n") + "\n")
	return b.String()
}

// fleetWriter turns each node's exposition into OpenMetrics samples of that node (its instance and job labels,
// samplesPerSeries samples ending at the fleet's time), collected per family in files, so that the fleet's text has
// each family once, as OpenMetrics requires.
type fleetWriter struct {
	dir      string
	at       time.Time
	order    []string
	families map[string]*familyFile
}

type familyFile struct {
	f *os.File
	w *bufio.Writer
}

func newFleetWriter(dir string, at time.Time) *fleetWriter {
	return &fleetWriter{dir: dir, at: at, families: map[string]*familyFile{}}
}

// add writes one node's families, and its up.
func (fw *fleetWriter) add(node string, families map[string]*dto.MetricFamily) error {
	up := &dto.MetricFamily{Name: proto.String("up"), Type: dto.MetricType_GAUGE.Enum(),
		Help: proto.String("Whether the target was scraped."), Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: proto.Float64(1)}}}}
	families["up"] = up
	names := make([]string, 0, len(families))
	for name := range families {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		mf := families[name]
		ff := fw.families[name]
		if ff == nil {
			f, err := os.Create(filepath.Join(fw.dir, fmt.Sprintf("family-%04d.om", len(fw.order))))
			if err != nil {
				return err
			}
			ff = &familyFile{f: f, w: bufio.NewWriterSize(f, 64<<10)}
			fw.families[name] = ff
			fw.order = append(fw.order, name)
		}
		// Each series samplesPerSeries times, oldest first: one family of the node per point in time, so that a
		// histogram's or summary's samples of one time stay together.
		var out bytes.Buffer
		for k := samplesPerSeries - 1; k >= 0; k-- {
			ts := fw.at.Add(-time.Duration(k) * sampleSpacing).UnixMilli()
			copyMF := &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type, Unit: mf.Unit}
			for _, m := range mf.Metric {
				m2 := proto.Clone(m).(*dto.Metric)
				m2.Label = append(m2.Label, &dto.LabelPair{Name: proto.String("instance"), Value: proto.String(node)},
					&dto.LabelPair{Name: proto.String("job"), Value: proto.String("gpu-pod-exporter")})
				m2.TimestampMs = proto.Int64(ts)
				copyMF.Metric = append(copyMF.Metric, m2)
			}
			if _, err := expfmt.MetricFamilyToOpenMetrics(&out, copyMF); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		// The family's metadata once, from its first chunk.
		text := out.Bytes()
		if st, _ := ff.f.Stat(); st.Size() > 0 || ff.w.Buffered() > 0 {
			text = dropComments(text)
		} else {
			text = firstMetadata(text)
		}
		if _, err := ff.w.Write(text); err != nil {
			return err
		}
	}
	return nil
}

// dropComments leaves out the # HELP, # TYPE and # UNIT lines.
func dropComments(b []byte) []byte {
	var out bytes.Buffer
	for line := range bytes.Lines(b) {
		if !bytes.HasPrefix(line, []byte("# ")) {
			out.Write(line)
		}
	}
	return out.Bytes()
}

// firstMetadata keeps the metadata of the first of the repeated families only.
func firstMetadata(b []byte) []byte {
	var out bytes.Buffer
	seenSample := false
	for line := range bytes.Lines(b) {
		comment := bytes.HasPrefix(line, []byte("# "))
		if comment && seenSample {
			continue
		}
		seenSample = seenSample || !comment
		out.Write(line)
	}
	return out.Bytes()
}

// finish writes every family's text, then # EOF, into path.
func (fw *fleetWriter) finish(path string) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	w := bufio.NewWriterSize(out, 1<<20)
	for _, name := range fw.order {
		ff := fw.families[name]
		if err := ff.w.Flush(); err != nil {
			return err
		}
		if _, err := ff.f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.Copy(w, ff.f); err != nil {
			return err
		}
		ff.f.Close()
		os.Remove(ff.f.Name())
	}
	if _, err := w.WriteString("# EOF\n"); err != nil {
		return err
	}
	return w.Flush()
}

// generate writes the OpenMetrics text of nodes nodes into path: one exporter runs on a node file that is
// rewritten for each node in turn, and is scraped once the node is its reading.
func generate(binary, dir string, nodes int, at time.Time, path string) error {
	file := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(file, []byte(nodeFile(0)), 0o644); err != nil {
		return err
	}
	addr, stop, err := startExporter(binary, file)
	if err != nil {
		return err
	}
	defer stop()
	fw := newFleetWriter(dir, at)
	mtime := time.Unix(1_700_000_000, 0)
	for i := range nodes {
		if err := os.WriteFile(file, []byte(nodeFile(i)), 0o644); err != nil {
			return err
		}
		// A distinct modification time for each node, whatever the clock's resolution: the source re-reads the
		// file when it changes.
		mtime = mtime.Add(time.Second)
		if err := os.Chtimes(file, mtime, mtime); err != nil {
			return err
		}
		families, err := scrapeNode(addr, gpuUUID(i, 0))
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		if err := fw.add(nodeName(i), families); err != nil {
			return err
		}
	}
	return fw.finish(path)
}

// scrapeNode scrapes until the exposition is the node's (its first GPU's UUID is in it).
func scrapeNode(addr, uuid string) (map[string]*dto.MetricFamily, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if bytes.Contains(body, []byte(uuid)) {
			parser := expfmt.NewTextParser(model.UTF8Validation)
			return parser.TextToMetricFamilies(bytes.NewReader(body))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the exporter does not read the node's file")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func startExporter(binary, file string) (addr string, stop func(), err error) {
	addr, err = freeAddr()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(binary, "--gpu.simulated-config="+file, "--web.listen-address="+addr, "--log.level=warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	if err := waitHTTP("http://"+addr+"/metrics", 20*time.Second); err != nil {
		stop()
		return "", nil, err
	}
	return addr, stop, nil
}
