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
	if len(opts.Compat) != 0 || !opts.Processes {
		t.Errorf("without flags: Compat = %v, Processes = %v; want none and on", opts.Compat, opts.Processes)
	}
}
