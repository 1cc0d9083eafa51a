package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
)

func TestCompatFlag(t *testing.T) {
	app := kingpin.New("test", "")
	var f collectorFlags
	f.register(app)
	if _, err := app.Parse([]string{"--compat=nvidiasmi, dcgm", "--compat=dcgm"}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "gpu-node-7")
	var opts collector.Options
	f.apply(&opts)
	if !slices.Equal(opts.Compat, []string{"nvidiasmi", "dcgm", "dcgm"}) || opts.CompatHostname != "gpu-node-7" {
		t.Errorf("options = %+v", opts)
	}

	app = kingpin.New("test", "")
	(&collectorFlags{}).register(app)
	if _, err := app.Parse([]string{"--compat=nvidiasmi,dgcm"}); err == nil || !strings.Contains(err.Error(), `"dgcm"`) {
		t.Errorf("--compat=nvidiasmi,dgcm: %v, want an error naming dgcm", err)
	}
}

func TestCollectorFlagsDefaults(t *testing.T) {
	app := kingpin.New("test", "")
	var f collectorFlags
	f.register(app)
	if _, err := app.Parse(nil); err != nil {
		t.Fatal(err)
	}
	var opts collector.Options
	f.apply(&opts)
	if len(opts.Compat) != 0 || !opts.Processes || opts.CompatDCGM != (collector.DCGMOptions{Version: collector.DefaultDCGMVersion}) {
		t.Errorf("without flags: Compat = %v, Processes = %v, CompatDCGM = %+v; want none, on and the default version",
			opts.Compat, opts.Processes, opts.CompatDCGM)
	}
	if err := f.check(); err != nil || len(f.warnings()) != 0 {
		t.Errorf("without flags: check() = %v, warnings %v", err, f.warnings())
	}
}

func TestCompatDCGMFlags(t *testing.T) {
	app := kingpin.New("test", "")
	var f collectorFlags
	f.register(app)
	if _, err := app.Parse([]string{"--compat=dcgm", "--compat.dcgm-version=4.6.0-4.8.3", "--compat.dcgm-gr-engine-estimate"}); err != nil {
		t.Fatal(err)
	}
	if err := f.check(); err != nil || len(f.warnings()) != 0 {
		t.Errorf("check() = %v, warnings %v; want none", err, f.warnings())
	}
	var opts collector.Options
	f.apply(&opts)
	if opts.CompatDCGM != (collector.DCGMOptions{Version: "4.6.0-4.8.3", EstimateGREngineActive: true}) {
		t.Errorf("CompatDCGM = %+v", opts.CompatDCGM)
	}

	app = kingpin.New("test", "")
	f = collectorFlags{}
	f.register(app)
	if _, err := app.Parse([]string{"--compat=dcgm", "--compat.dcgm-version=4.10.0"}); err != nil {
		t.Fatal(err)
	}
	if err := f.check(); err == nil || !strings.HasPrefix(err.Error(), "--compat.dcgm-version: ") || !strings.Contains(err.Error(), "4.8.4") {
		t.Errorf("--compat.dcgm-version=4.10.0: check() = %v, want an error that names the flag and the newest known version", err)
	}

	// Without --compat=dcgm the two flags do nothing, which is worth a warning.
	app = kingpin.New("test", "")
	f = collectorFlags{}
	f.register(app)
	if _, err := app.Parse([]string{"--compat=nvidiasmi", "--compat.dcgm-version=4.8.3", "--compat.dcgm-gr-engine-estimate"}); err != nil {
		t.Fatal(err)
	}
	if w := f.warnings(); len(w) != 2 || !strings.Contains(w[0], "--compat.dcgm-version") || !strings.Contains(w[1], "estimate") {
		t.Errorf("warnings() = %q, want one for each flag", w)
	}
}
