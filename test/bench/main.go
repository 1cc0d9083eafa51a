// Command bench measures the real gpu-pod-exporter binary on generated nodes of any size: it writes a fake procfs
// and a simulated node (or an nvidia-smi fixture with a fake nvidia-smi that only cats it, or the sysfs and fds of
// eight MI300X for the drm source, or the tests' stub libnvidia-ml for the NVML source), starts the binary,
// scrapes it the way Prometheus does (gzip, Prometheus' Accept header), sequentially and with N concurrent
// scrapers, and prints one Markdown table: p50, p99, exporter CPU per scrape (utime+stime of the exporter and its
// children, from /proc/<pid>/stat), peak RSS (VmHWM), anonymous RSS after the run (RssAnon: the heap, stacks and
// runtime, without the binary's own pages) and body size. `make bench` runs it; it is not part of
// `make test`, and its numbers depend on the machine and its load.
package main

import (
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Prometheus 3's default scrape_protocols, as it sends them.
const acceptHeader = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5," +
	"application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3," +
	"text/plain;version=0.0.4;q=0.2,*/*;q=0.1"

// clockTicks is USER_HZ, which is 100 on every Linux architecture Go supports.
const clockTicks = 100

func main() {
	binary := flag.String("binary", "./gpu-pod-exporter", "the exporter binary to measure")
	sizes := flag.String("sizes", "1,8,64,512,2048", "process counts, comma-separated")
	cases := flag.String("cases", "simulated,nvidia-smi,procfs,demo", "what to measure: simulated (in-process source), nvidia-smi (fake that cats a fixture), procfs (the simulated source listing real processes, read through /proc), drm (eight MI300X read by the drm source from a fake sysfs and procfs; needs root), nvml (the NVML source on the tests' stub libnvidia-ml, eight H100s; needs gcc), demo (idle --demo)")
	drmOthers := flag.Int("drm-others", 256, "processes of the drm case that use no GPU, whose open files the drm source looks through too")
	concurrency := flag.String("concurrency", "8,20", "concurrent scrapers, comma-separated (each after the sequential run)")
	fixture := flag.String("fixture", "internal/gpu/nvidiasmi/testdata/500farm__4-geforce-rtx-3090.xml", "nvidia-smi fixture for the nvidia-smi case")
	seconds := flag.Float64("seconds", 3, "rough length of each measurement")
	smiSizes := flag.String("smi-sizes", "4,64", "process counts of the nvidia-smi case")
	procSizes := flag.String("procfs-sizes", "64,2048", "process counts of the procfs case (real sleep processes)")
	gpuCount := flag.Int("gpus", 0, "GPUs of the simulated case (0: 4, and 8 from 512 processes)")
	health := flag.Bool("health", true, "give each simulated GPU an H100's health, NVLink and profiling readings (off: a node file that exporters before them can read)")
	flag.Parse()

	work, err := os.MkdirTemp("", "gpe-bench-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(work)

	fmt.Printf("| source | processes | GPUs | scrapers | scrapes | errors | p50 ms | p99 ms | CPU ms/scrape | peak RSS MiB | anon RSS MiB | body KiB (gzip) | body KiB |\n")
	fmt.Printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	want := splitSet(*cases)
	if want["simulated"] {
		for _, n := range ints(*sizes) {
			gpus := 4
			if n >= 512 {
				gpus = 8
			}
			if *gpuCount > 0 {
				gpus = *gpuCount
			}
			measureNode(work, *binary, "simulated", gpus, n, "", *health, ints(*concurrency), *seconds)
		}
	}
	if want["nvidia-smi"] {
		for _, n := range ints(*smiSizes) {
			measureNode(work, *binary, "nvidia-smi", 4, n, *fixture, false, ints(*concurrency), *seconds)
		}
	}
	if want["procfs"] {
		for _, n := range ints(*procSizes) {
			measureRealProcesses(work, *binary, n, ints(*concurrency), *seconds)
		}
	}
	if want["drm"] {
		for _, n := range ints(*sizes) {
			dir := filepath.Join(work, fmt.Sprintf("drm-%d", n))
			nd, err := newDRMNode(dir, n, *drmOthers)
			if err != nil {
				fail(err)
			}
			measure(nd, *binary, "drm", "drm", ints(*concurrency), *seconds)
		}
	}
	if want["nvml"] {
		for _, n := range ints(*sizes) {
			nd, err := newNVMLNode(filepath.Join(work, fmt.Sprintf("nvml-%d", n)), 8, n)
			if err != nil {
				fail(err)
			}
			measure(nd, *binary, "nvml", "nvml", ints(*concurrency), *seconds)
		}
	}
	if want["demo"] {
		measureDemo(*binary)
	}
}

// measureRealProcesses is the simulated case on real processes: the bench's fake procfs is cheaper to read than the
// kernel's, so this is what attribution costs on a node. The processes are sleeps in the bench's own cgroup, so
// they are one workload per GPU rather than the fake node's pods.
func measureRealProcesses(work, binary string, count int, concurrency []int, seconds float64) {
	var sleeps []*exec.Cmd
	defer func() {
		for _, c := range sleeps {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	var pids []int
	for range count {
		c := exec.Command("sleep", "3600")
		if err := c.Start(); err != nil {
			fail(fmt.Errorf("starting %d processes: %w", count, err))
		}
		sleeps = append(sleeps, c)
		pids = append(pids, c.Process.Pid)
	}
	n, err := newRealNode(filepath.Join(work, fmt.Sprintf("procfs-%d", count)), 8, pids)
	if err != nil {
		fail(err)
	}
	measure(n, binary, "procfs", "simulated", concurrency, seconds)
}

func measureNode(work, binary, source string, gpus, pids int, fixture string, health bool, concurrency []int, seconds float64) {
	dir := filepath.Join(work, fmt.Sprintf("%s-%d", source, pids))
	n, err := newNode(dir, gpus, pids, fixture, health)
	if err != nil {
		fail(err)
	}
	measure(n, binary, source, source, concurrency, seconds)
}

// measure runs the binary on node n with the given GPU source and prints a row per concurrency, named name.
func measure(n *node, binary, name, source string, concurrency []int, seconds float64) {
	dir := n.dir
	args := []string{"--path.procfs=" + n.procfs, "--runtime.endpoint=unix://" + filepath.Join(dir, "no-cri.sock"),
		"--docker.host=unix://" + filepath.Join(dir, "no-docker.sock"), "--podman.host=unix://" + filepath.Join(dir, "no-podman.sock")}
	switch source {
	case "simulated":
		args = append(args, "--gpu.simulated-config="+n.simulated)
	case "drm":
		args = append(args, "--gpu.source=drm", "--path.sysfs="+n.sysfs)
	case "nvml":
		args = append(args, "--gpu.source=nvml")
	default:
		args = append(args, "--gpu.source=nvidia-smi", "--nvidia-smi.path="+n.smi)
	}
	e := start(binary, n.env, args...)
	defer e.stop()
	for range 5 { // warm up: runtime lookups, caches, heap
		if _, err := e.scrape(); err != nil {
			fail(err)
		}
	}
	if err := e.check(n); err != nil {
		fail(fmt.Errorf("%s node of %d processes: %w", name, n.pids, err))
	}
	// How many scrapes fit in the time asked, from one timed scrape.
	t0 := time.Now()
	if _, err := e.scrape(); err != nil {
		fail(err)
	}
	count := max(10, min(1000, int(seconds/time.Since(t0).Seconds())))
	for _, c := range append([]int{1}, concurrency...) {
		r := e.load(c, max(c*3, count))
		r.print(name, n.pids, n.gpus, c, e)
	}
}

func measureDemo(binary string) {
	e := start(binary, nil, "--demo")
	defer e.stop()
	for range 20 {
		if _, err := e.scrape(); err != nil {
			fail(err)
		}
	}
	time.Sleep(2 * time.Second)
	fmt.Printf("\nIdle --demo after 20 scrapes: RSS %.1f MiB (anonymous %.1f MiB, the binary's mapped file %.1f MiB), peak RSS %.1f MiB\n",
		e.status("VmRSS")/1024, e.status("RssAnon")/1024, e.status("RssFile")/1024, e.status("VmHWM")/1024)
}

// exporter is one running binary.
type exporter struct {
	cmd    *exec.Cmd
	url    string
	client *http.Client
	gzip   int // body size of the last scrape, as sent
}

// start runs the binary with args, in the bench's environment and env.
func start(binary string, env []string, args ...string) *exporter {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(binary, append(args, "--web.listen-address="+addr, "--log.level=error")...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	e := &exporter{cmd: cmd, url: "http://" + addr + "/metrics",
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := e.scrape(); err == nil {
			return e
		} else if time.Now().After(deadline) {
			e.stop()
			fail(fmt.Errorf("exporter did not answer: %w", err))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *exporter) stop() {
	_ = e.cmd.Process.Signal(os.Interrupt)
	_ = e.cmd.Wait()
}

// scrape fetches /metrics as Prometheus does and returns how long it took.
func (e *exporter) scrape() (time.Duration, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, e.url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", acceptHeader)
	req.Header.Set("Accept-Encoding", "gzip")
	t0 := time.Now()
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("HTTP %s", resp.Status)
	}
	e.gzip = len(body)
	return d, nil
}

// check says whether the exporter serves the node it is measured on: its GPUs, and a memory series for each of its
// processes, so that a case that lost its processes is not measured as a cheap one.
func (e *exporter) check(n *node) error {
	body, err := e.plain()
	if err != nil {
		return err
	}
	gpus, procs := 0, 0
	for _, line := range strings.Split(string(body), "\n") {
		switch {
		case strings.HasPrefix(line, "gpu_info{"):
			gpus++
		case strings.HasPrefix(line, "gpu_process_memory_used_bytes{"):
			procs++
		}
	}
	if gpus != n.gpus || procs != n.pids {
		return fmt.Errorf("the exporter serves %d GPUs and %d processes with memory, not %d and %d", gpus, procs, n.gpus, n.pids)
	}
	return nil
}

// plain fetches /metrics as Prometheus does and returns the body uncompressed.
func (e *exporter) plain() ([]byte, error) {
	req, err := http.NewRequest(http.MethodGet, e.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", acceptHeader)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return nil, err
		}
		r = zr
	}
	return io.ReadAll(r)
}

func (e *exporter) plainSize() int {
	body, err := e.plain()
	if err != nil {
		return 0
	}
	return len(body)
}

type result struct {
	scrapes, errors int
	latencies       []time.Duration
	cpu             float64 // seconds
	firstErr        error
}

// load runs total scrapes with c concurrent scrapers and measures the exporter's CPU over them.
func (e *exporter) load(c, total int) result {
	var mu sync.Mutex
	var r result
	cpu0 := e.cpu()
	var wg sync.WaitGroup
	per := (total + c - 1) / c
	for range c {
		wg.Go(func() {
			for range per {
				d, err := e.scrape()
				mu.Lock()
				r.scrapes++
				if err != nil {
					r.errors++
					if r.firstErr == nil {
						r.firstErr = err
					}
				} else {
					r.latencies = append(r.latencies, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.cpu = e.cpu() - cpu0
	return r
}

func (r result) print(source string, pids, gpus, c int, e *exporter) {
	slices.Sort(r.latencies)
	q := func(p float64) float64 {
		if len(r.latencies) == 0 {
			return 0
		}
		return float64(r.latencies[min(len(r.latencies)-1, int(p*float64(len(r.latencies))))].Microseconds()) / 1000
	}
	fmt.Printf("| %s | %d | %d | %d | %d | %d | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f |\n", source, pids, gpus, c,
		r.scrapes, r.errors, q(0.5), q(0.99), r.cpu*1000/float64(r.scrapes), e.status("VmHWM")/1024,
		e.status("RssAnon")/1024, float64(e.gzip)/1024, float64(e.plainSize())/1024)
	if r.firstErr != nil {
		fmt.Fprintf(os.Stderr, "  first error: %v\n", r.firstErr)
	}
}

// cpu is the CPU time, in seconds, of the exporter and its children that it waited for (nvidia-smi).
func (e *exporter) cpu() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", e.cmd.Process.Pid))
	if err != nil {
		fail(err)
	}
	// The fields after the command name, which may hold spaces: state is field 3, utime..cstime 14..17.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ticks float64
	for _, i := range []int{14, 15, 16, 17} {
		v, err := strconv.ParseFloat(f[i-3], 64)
		if err != nil {
			fail(err)
		}
		ticks += v
	}
	return ticks / clockTicks
}

// status returns a /proc/<pid>/status field in KiB.
func (e *exporter) status(field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.cmd.Process.Pid))
	if err != nil {
		fail(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb
		}
	}
	fail(errors.New("no " + field + " in /proc/<pid>/status"))
	return 0
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			fail(fmt.Errorf("%q is not a positive number", f))
		}
		out = append(out, n)
	}
	return out
}

func splitSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		m[strings.TrimSpace(f)] = true
	}
	return m
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}
