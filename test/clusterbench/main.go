// Command clusterbench measures `ps --prometheus` and `top --prometheus` on a generated fleet: for each size it
// writes nodes of 8 H100s with 4 pods each in the simulated node format, takes the real exporter's exposition of
// each (relabelled with the node's instance and job, and an up series, as Prometheus would store them), writes
// them as OpenMetrics, backfills a real Prometheus TSDB with `promtool tsdb create-blocks-from openmetrics`, starts
// Prometheus on it, and runs the real binary against it: ps (wall time, CPU, peak RSS, and Prometheus' CPU for the
// reading) and top, piped, whose readings must come at its interval. It prints one Markdown table. `make
// bench-cluster` runs it; it is not part of `make test` (1,000 nodes take minutes), and its numbers depend on the
// machine and its load.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, which is 100 on every Linux architecture Go supports.
const clockTicks = 100

func main() {
	binary := flag.String("binary", "./gpu-pod-exporter", "the binary to measure")
	sizes := flag.String("nodes", "10,100,1000", "fleet sizes, comma-separated")
	runs := flag.Int("runs", 5, "ps runs per size")
	refreshes := flag.Int("refreshes", 8, "top readings per size")
	interval := flag.Duration("interval", 2*time.Second, "top's --interval")
	keep := flag.Bool("keep", false, "keep the work directory (the OpenMetrics text and the TSDB)")
	flag.Parse()
	for _, tool := range []string{"prometheus", "promtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			fail(fmt.Errorf("%s is not installed (Debian package prometheus)", tool))
		}
	}
	work, err := os.MkdirTemp("", "gpe-clusterbench-")
	if err != nil {
		fail(err)
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "work directory:", work)
	} else {
		defer os.RemoveAll(work)
	}
	fmt.Println("| nodes | GPUs | processes | series | generate s | OpenMetrics MiB | backfill s | ps wall s (median, max) | ps CPU s | ps peak RSS MiB | Prometheus CPU s per ps | ps -o json MiB | top reading gaps s (min, median, max; mean) | top CPU s per reading | Prometheus CPU s per top reading | top peak RSS MiB |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|")
	for _, n := range ints(*sizes) {
		dir := filepath.Join(work, fmt.Sprint(n))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fail(err)
		}
		measureFleet(*binary, dir, n, *runs, *refreshes, *interval)
		if !*keep {
			os.RemoveAll(dir)
		}
	}
}

func measureFleet(binary, dir string, nodes, runs, refreshes int, interval time.Duration) {
	at := time.Now().Truncate(time.Second)
	om := filepath.Join(dir, "fleet.om")
	start := time.Now()
	if err := generate(binary, dir, nodes, at, om); err != nil {
		fail(fmt.Errorf("generating %d nodes: %w", nodes, err))
	}
	generated := time.Since(start)
	st, err := os.Stat(om)
	if err != nil {
		fail(err)
	}
	start = time.Now()
	data := filepath.Join(dir, "data")
	if out, err := exec.Command("promtool", "tsdb", "create-blocks-from", "openmetrics", om, data).CombinedOutput(); err != nil {
		fail(fmt.Errorf("promtool: %v\n%s", err, tail(out)))
	}
	backfilled := time.Since(start)
	os.Remove(om)

	prom, pid, stop := startPrometheus(dir, data)
	defer stop()
	series := queryNumber(prom, `count({__name__=~".+"})`, at)
	if got := queryNumber(prom, "count(gpu_info)", at); got != float64(nodes*gpusPerNode) {
		fail(fmt.Errorf("%d nodes: Prometheus has %v GPUs, want %d", nodes, got, nodes*gpusPerNode))
	}

	common := []string{"--prometheus=http://" + prom, "--prometheus.time=" + strconv.FormatInt(at.Unix(), 10)}
	var walls []time.Duration
	var cpu, promCPU time.Duration
	var rss int64
	var jsonBytes int64
	for range runs {
		before := processCPU(pid)
		rows := 0
		r := runMeasured(binary, append([]string{"ps", "-o", "json"}, common...), func(line string) {
			if strings.HasPrefix(line, `    "node": `) {
				rows++
			}
		})
		promCPU += processCPU(pid) - before
		walls = append(walls, r.wall)
		cpu += r.cpu
		rss = max(rss, r.maxRSS)
		jsonBytes = r.stdoutBytes
		if want := nodes * gpusPerNode * processesPerGPU; r.code != 0 || warned(r.stderr) || rows != want {
			fail(fmt.Errorf("%d nodes: ps exit %d, %d rows (want %d): %s", nodes, r.code, rows, want, r.stderr))
		}
	}
	slices.Sort(walls)

	// top, piped: the time each reading's first line arrives.
	var arrivals []time.Time
	before := processCPU(pid)
	top := runMeasured(binary, append([]string{"top", "--interval=" + interval.String(), "-n", fmt.Sprint(refreshes)}, common...),
		func(line string) {
			if strings.HasPrefix(line, "gpu-pod-exporter top ") {
				arrivals = append(arrivals, time.Now())
			}
		})
	topPromCPU := processCPU(pid) - before
	if top.code != 0 || len(arrivals) != refreshes {
		fail(fmt.Errorf("%d nodes: top exit %d, %d readings: %s", nodes, top.code, len(arrivals), top.stderr))
	}
	var gaps []float64
	for i := 1; i < len(arrivals); i++ {
		gaps = append(gaps, arrivals[i].Sub(arrivals[i-1]).Seconds())
	}
	mean := arrivals[len(arrivals)-1].Sub(arrivals[0]).Seconds() / float64(len(gaps))
	slices.Sort(gaps)

	fmt.Printf("| %d | %d | %d | %.0f | %.1f | %.0f | %.1f | %.2f, %.2f | %.2f | %.0f | %.2f | %.1f | %.2f, %.2f, %.2f; %.2f | %.2f | %.2f | %.0f |\n",
		nodes, nodes*gpusPerNode, nodes*gpusPerNode*processesPerGPU, series, generated.Seconds(), float64(st.Size())/(1<<20),
		backfilled.Seconds(), walls[len(walls)/2].Seconds(), walls[len(walls)-1].Seconds(), cpu.Seconds()/float64(runs),
		float64(rss)/1024, promCPU.Seconds()/float64(runs), float64(jsonBytes)/(1<<20),
		gaps[0], gaps[len(gaps)/2], gaps[len(gaps)-1], mean, top.cpu.Seconds()/float64(refreshes),
		topPromCPU.Seconds()/float64(refreshes), float64(top.maxRSS)/1024)
}

type result struct {
	wall, cpu   time.Duration
	maxRSS      int64 // KiB
	code        int
	stderr      string
	stdoutBytes int64
}

// warned reports whether ps' stderr holds more than its notes on the reading ("# simulated GPU data", a GPU's
// health): a warning or an error.
func warned(stderr string) bool {
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if l != "" && !strings.HasPrefix(l, "# ") {
			return true
		}
	}
	return false
}

// runMeasured runs the binary, reading its output line by line (each to line, when set), and returns its wall
// time, CPU time and peak RSS from the kernel's accounting.
func runMeasured(binary string, args []string, line func(string)) result {
	cmd := exec.Command(binary, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fail(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	var r result
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		r.stdoutBytes += int64(len(sc.Bytes()) + 1)
		if line != nil {
			line(sc.Text())
		}
	}
	io.Copy(io.Discard, out)
	cmd.Wait()
	r.wall = time.Since(start)
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	r.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	r.maxRSS = ru.Maxrss
	r.code = cmd.ProcessState.ExitCode()
	r.stderr = stderr.String()
	return r
}

func startPrometheus(dir, data string) (addr string, pid int, stop func()) {
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte("global: {}\n"), 0o644); err != nil {
		fail(err)
	}
	addr, err := freeAddr()
	if err != nil {
		fail(err)
	}
	cmd := exec.Command("prometheus", "--config.file="+cfg, "--storage.tsdb.path="+data, "--web.listen-address="+addr,
		"--storage.tsdb.retention.time=30d")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	stop = func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }
	if err := waitHTTP("http://"+addr+"/-/ready", 120*time.Second); err != nil {
		stop()
		fail(fmt.Errorf("prometheus: %v\n%s", err, tail(log.Bytes())))
	}
	return addr, cmd.Process.Pid, stop
}

// queryNumber runs an instant query whose answer is one number.
func queryNumber(prom, expr string, at time.Time) float64 {
	resp, err := http.PostForm("http://"+prom+"/api/v1/query", url.Values{"query": {expr}, "time": {strconv.FormatInt(at.Unix(), 10)}})
	if err != nil {
		fail(err)
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Data.Result) != 1 {
		fail(fmt.Errorf("%s: %v %+v", expr, err, r))
	}
	v, _ := strconv.ParseFloat(r.Data.Result[0].Value[1].(string), 64)
	return v
}

// processCPU is a process's utime + stime, from /proc/<pid>/stat.
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		fail(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

func waitHTTP(u string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		resp, err := http.Get(u)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %v", u, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fail(fmt.Errorf("%q is not a positive number", f))
		}
		out = append(out, n)
	}
	return out
}

func tail(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(len(lines)-20, 0):], "\n")
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "clusterbench:", err)
	os.Exit(1)
}
