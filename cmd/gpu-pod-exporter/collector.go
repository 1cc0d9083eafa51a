package main

import (
	"os"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
)

// collectorFlags choose which families beyond the default ones the server writes.
type collectorFlags struct {
	noChecks
	processes bool
	compat    compatFlag
}

func (f *collectorFlags) register(serve flagHost) {
	serve.Flag("collector.processes", "Export per-process series (gpu_process_*).").Default("true").BoolVar(&f.processes)
	serve.Flag("compat", "Also write other exporters' metrics, so that their dashboards keep working: a comma-separated "+
		"list of nvidiasmi (nvidia-smi exporter: nvidiasmi_process_used_memory_bytes) and dcgm (dcgm-exporter's "+
		"default DCGM_FI_DEV_* counters). See docs/compat.md.").PlaceHolder("nvidiasmi,dcgm").SetValue(&f.compat)
}

// apply sets the options these flags choose. dcgm-exporter's Hostname is the node's name: NODE_NAME, which its Helm
// chart and ours set from the downward API (in a pod, os.Hostname is the pod's name), else the host name.
func (f *collectorFlags) apply(opts *collector.Options) {
	opts.Processes = f.processes
	opts.Compat = f.compat
	opts.CompatHostname = os.Getenv("NODE_NAME")
	if opts.CompatHostname == "" {
		opts.CompatHostname, _ = os.Hostname()
	}
}

// compatFlag is --compat: the compatibility outputs, checked as the command line is parsed so that a misspelt name
// stops the exporter with a message naming it.
type compatFlag []string

// Set implements kingpin.Value.
func (f *compatFlag) Set(s string) error {
	var names []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if err := collector.ValidateCompat(names); err != nil {
		return err
	}
	*f = append(*f, names...)
	return nil
}

func (f *compatFlag) String() string { return strings.Join(*f, ",") }

// IsCumulative lets --compat be repeated as well as comma-separated.
func (f *compatFlag) IsCumulative() bool { return true }
