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
	compat := registerCompat(app)
	if _, err := app.Parse([]string{"--compat=nvidiasmi, dcgm", "--compat=dcgm"}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "gpu-node-7")
	var opts collector.Options
	compat.apply(&opts)
	if !slices.Equal(opts.Compat, []string{"nvidiasmi", "dcgm", "dcgm"}) || opts.CompatHostname != "gpu-node-7" {
		t.Errorf("options = %+v", opts)
	}

	app = kingpin.New("test", "")
	registerCompat(app)
	if _, err := app.Parse([]string{"--compat=nvidiasmi,dgcm"}); err == nil || !strings.Contains(err.Error(), `"dgcm"`) {
		t.Errorf("--compat=nvidiasmi,dgcm: %v, want an error naming dgcm", err)
	}
}

func TestCompatIsOffByDefault(t *testing.T) {
	app := kingpin.New("test", "")
	compat := registerCompat(app)
	if _, err := app.Parse(nil); err != nil {
		t.Fatal(err)
	}
	var opts collector.Options
	compat.apply(&opts)
	if len(opts.Compat) != 0 {
		t.Errorf("Compat = %v without --compat", opts.Compat)
	}
}
