package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/alecthomas/units"
	"github.com/prometheus/common/config"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/cluster"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/configfile"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/promapi"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/top"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// prometheusEnv gives --prometheus when the flag is not: a variable of this program's own, so that a
// PROMETHEUS_URL set for other tools does not turn a node's ps into the cluster's.
const prometheusEnv = "GPU_POD_EXPORTER_PROMETHEUS_URL"

// prometheusFlags make ps and top read the whole cluster from Prometheus, Thanos or Mimir instead of the node.
type prometheusFlags struct {
	url        string
	selector   string
	nodeLabel  string
	interval   optionalDuration
	timeout    time.Duration
	at         string
	httpConfig string
	maxAnswer  int64
	set        map[string]*bool // the flags given, which need --prometheus
	// source is the node's source flags: reading a node and reading the cluster exclude each other.
	source *sourceFlags

	// Filled in by check.
	sel    promapi.Selector
	atTime time.Time
	client *http.Client
	// exposed says how the client configuration exposes its secrets, for the start's warnings.
	exposed []string
}

func (f *prometheusFlags) register(cmd flagHost) {
	f.set = map[string]*bool{}
	flag := func(name, help string) *kingpin.FlagClause {
		f.set[name] = new(bool)
		return cmd.Flag(name, help).IsSetByUser(f.set[name])
	}
	cmd.Flag("prometheus", "Read the whole cluster from the Prometheus HTTP API at this URL (Prometheus, Thanos Query, "+
		"or Mimir's .../prometheus), where the exporters' series are, instead of this node.").
		Envar(prometheusEnv).PlaceHolder("URL").StringVar(&f.url)
	flag("prometheus.selector", `Label matchers that narrow every query to some exporters' targets, e.g. `+
		`cluster="prod",instance=~"gpu-.*".`).PlaceHolder("MATCHERS").StringVar(&f.selector)
	flag("prometheus.node-label", "The target label that names a node (the chart's ServiceMonitor sets instance to "+
		"the node's name); a series without it is named by its instance.").Default(cluster.DefaultNodeLabel).StringVar(&f.nodeLabel)
	flag("prometheus.scrape-interval", "How often Prometheus scrapes the exporters; a node whose last reading is older "+
		"than two intervals is stale. Default: each target's, measured from its samples of up.").
		PlaceHolder("DURATION").SetValue(&f.interval)
	f.interval.flag = "prometheus.scrape-interval"
	flag("prometheus.timeout", "Deadline of one reading of the cluster (all its queries).").Default("30s").
		SetValue(durationValue{flag: "prometheus.timeout", dst: &f.timeout})
	flag("prometheus.time", "Read the cluster as it was at this time (RFC 3339, or Unix seconds) instead of now.").
		PlaceHolder("TIME").StringVar(&f.at)
	flag("prometheus.max-answer-bytes", "Most bytes the answers of one reading may take in all (KiB, MiB, GiB), across "+
		"its queries: a reading past it fails, naming the bound. The default holds about 1,500 eight-GPU nodes; a "+
		"reading's memory grows to about 4.7 times the bound.").Default("48MiB").PlaceHolder("SIZE").
		SetValue(bytesValue{flag: "prometheus.max-answer-bytes", min: minAnswerBytes, max: maxAnswerBytes, dst: &f.maxAnswer})
	flag("http.config.file", "HTTP client configuration for --prometheus, as promtool's and amtool's: basic auth, "+
		"bearer token file, TLS CA and client certificates, proxy, headers (Mimir's X-Scope-OrgID).").
		PlaceHolder("FILE").StringVar(&f.httpConfig)
}

// The bounds of --prometheus.max-answer-bytes: a sample of the answer may take a MiB, and a reading holds about
// 4.7 times the bound at most, so a GiB is several GiB of memory.
const (
	minAnswerBytes = 1 << 20
	maxAnswerBytes = 1 << 30
)

func (f *prometheusFlags) warnings() []string { return f.exposed }

// on reports whether the command reads the cluster.
func (f *prometheusFlags) on() bool { return f.url != "" }

var labelNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// check validates the flags and builds the HTTP client: a flag of the group without --prometheus, or with a node
// source, is a usage error, as is a URL, selector, time or client configuration that cannot work.
func (f *prometheusFlags) check() error {
	if !f.on() {
		for name, set := range f.set {
			if *set {
				return flagError(name, "reads the cluster from Prometheus: it needs --prometheus (or $%s)", prometheusEnv)
			}
		}
		return nil
	}
	for name, on := range map[string]bool{"demo": f.source.demo, "gpu.simulated-config": f.source.simulatedConfig != ""} {
		if on {
			return flagError("prometheus", "reads the cluster from Prometheus, not this node's GPUs: it cannot be combined "+
				"with --%s (unset $%s to read a node)", name, prometheusEnv)
		}
	}
	if _, err := promapi.ParseURL(f.url); err != nil {
		return flagError("prometheus", "%v", err)
	}
	sel, err := promapi.ParseSelector(f.selector)
	if err != nil {
		return flagError("prometheus.selector", "%v", err)
	}
	f.sel = sel
	if !labelNameRE.MatchString(f.nodeLabel) {
		return flagError("prometheus.node-label", "%q is not a label name", f.nodeLabel)
	}
	if f.at != "" {
		if f.atTime, err = parseTime(f.at); err != nil {
			return flagError("prometheus.time", "%v", err)
		}
	}
	cfg := config.DefaultHTTPClientConfig
	if f.httpConfig != "" {
		c, err := configfile.HTTPClient(f.httpConfig)
		if err != nil {
			return flagError("http.config.file", "%v", err)
		}
		cfg = *c
	}
	if err := cfg.Validate(); err != nil {
		return flagError("http.config.file", "%v", err)
	}
	if f.client, err = config.NewClientFromConfig(cfg, "gpu-pod-exporter"); err != nil {
		return flagError("http.config.file", "%v", err)
	}
	f.exposed = promapi.ConfigWarnings(f.url, &cfg, f.httpConfig)
	return nil
}

// parseTime reads --prometheus.time as promtool reads a time: RFC 3339, or Unix seconds.
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	secs, err := strconv.ParseFloat(s, 64)
	if err != nil || secs < 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-12-01T03:00:00Z) nor Unix seconds", s)
	}
	return time.UnixMilli(int64(secs * 1000)), nil
}

// reader is the cluster reader the flags describe.
func (f *prometheusFlags) reader() (*cluster.Reader, error) {
	client, err := promapi.New(f.url, f.client)
	if err != nil {
		return nil, err
	}
	return cluster.New(client, cluster.Config{Selector: f.sel, NodeLabel: f.nodeLabel, ScrapeInterval: f.interval.d,
		At: f.atTime, MaxAnswerBytes: f.maxAnswer}), nil
}

// explain adds to a failure what the person can do about it.
func (f *prometheusFlags) explain(err error) error {
	switch {
	case errors.Is(err, promapi.ErrUnauthorized) && f.httpConfig == "":
		return fmt.Errorf("%w; give credentials with --http.config.file", err)
	case errors.Is(err, promapi.ErrUnauthorized):
		return fmt.Errorf("%w; check the credentials in %s", err, f.httpConfig)
	case errors.Is(err, promapi.ErrUnreachable) && loopback(f.url):
		return fmt.Errorf("%w (through kubectl port-forward? it must be running)", err)
	case errors.Is(err, promapi.ErrTooLarge):
		return fmt.Errorf("%w, or raise --prometheus.max-answer-bytes (%s)", err, units.Base2Bytes(f.maxAnswer))
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w (--prometheus.timeout %s)", err, f.timeout)
	}
	return err
}

func loopback(u string) bool {
	parsed, err := promapi.ParseURL(u)
	if err != nil {
		return false
	}
	if parsed.Hostname() == "localhost" {
		return true
	}
	ip := net.ParseIP(parsed.Hostname())
	return ip != nil && ip.IsLoopback()
}

// read takes one reading of the cluster within --prometheus.timeout.
func (f *prometheusFlags) read(ctx context.Context, r *cluster.Reader, what cluster.What) (*view.Reading, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	v, err := r.Read(ctx, what)
	if err != nil {
		return nil, f.explain(err)
	}
	return v, nil
}

// optionalDuration is a positive duration flag without a default value.
type optionalDuration struct {
	flag string
	d    time.Duration
}

func (v *optionalDuration) Set(s string) error { return durationValue{flag: v.flag, dst: &v.d}.Set(s) }

func (v *optionalDuration) String() string {
	if v.d == 0 {
		return ""
	}
	return v.d.String()
}

// runClusterPS is `ps --prometheus`.
func runClusterPS(ctx context.Context, f *prometheusFlags, pf *psFlags) int {
	r, err := f.reader()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %v\n", err)
		return 2
	}
	return runPS(ctx, pf, func(ctx context.Context) (*view.Reading, error) { return f.read(ctx, r, cluster.What{}) })
}

// clusterInterval is top's default interval on a cluster: the exporters are scraped every 15 to 60 seconds, so a
// faster refresh only shows the same samples again, at the cost of a thousand nodes' answers each time.
const clusterInterval = 10 * time.Second

// runCluster is `top --prometheus`.
func (f *topFlags) runCluster(ctx context.Context, pf *prometheusFlags) int {
	r, err := pf.reader()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-pod-exporter: %v\n", err)
		return 2
	}
	if !f.intervalSet {
		f.interval = clusterInterval
	}
	return f.show(ctx, nil, func(ctx context.Context, o top.Options) (*view.Reading, error) {
		return pf.read(ctx, r, cluster.What{Top: true, Workloads: o.Group && !o.Namespaces})
	})
}
