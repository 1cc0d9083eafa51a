package main

import (
	"os"
	"slices"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
)

// collectorFlags choose which families beyond the default ones the server writes.
type collectorFlags struct {
	processes   bool
	compat      compatFlag
	dcgmVersion string
	dcgmGREst   bool
}

func (f *collectorFlags) register(serve flagHost) {
	serve.Flag("collector.processes", "Export per-process series (gpu_process_*).").Default("true").BoolVar(&f.processes)
	serve.Flag("compat", "Also write other exporters' metrics, so that their dashboards keep working: a comma-separated "+
		"list of nvidiasmi (nvidia-smi exporter: nvidiasmi_process_used_memory_bytes) and dcgm (dcgm-exporter's "+
		"default DCGM_FI_DEV_* counters). See docs/compat.md.").PlaceHolder("nvidiasmi,dcgm").SetValue(&f.compat)
	serve.Flag("compat.dcgm-version", "The dcgm-exporter release whose names --compat=dcgm writes (its host label is "+
		"Hostname up to 4.8.2, hostname from 4.8.3). See docs/compat.md.").Default(collector.DefaultDCGMVersion).StringVar(&f.dcgmVersion)
	serve.Flag("compat.dcgm-gr-engine-estimate", "With --compat=dcgm, write DCGM_FI_PROF_GR_ENGINE_ACTIVE on GPUs "+
		"without a performance monitor (before Hopper) from the driver's utilization: an estimate, for tools such as "+
		"OpenCost that read that field. See docs/compat.md.").Default("false").BoolVar(&f.dcgmGREst)
}

func (f *collectorFlags) check() error {
	if err := collector.ParseDCGMVersion(f.dcgmVersion); err != nil {
		return flagError("compat.dcgm-version", "%v", err)
	}
	return nil
}

// warnings: the dcgm flags tune --compat=dcgm and do nothing without it.
func (f *collectorFlags) warnings() []string {
	if slices.Contains(f.compat, collector.CompatDCGM) {
		return nil
	}
	var w []string
	if f.dcgmVersion != collector.DefaultDCGMVersion {
		w = append(w, "--compat.dcgm-version has no effect without --compat=dcgm")
	}
	if f.dcgmGREst {
		w = append(w, "--compat.dcgm-gr-engine-estimate has no effect without --compat=dcgm")
	}
	return w
}

// apply sets the options these flags choose. dcgm-exporter's Hostname is the node's name: NODE_NAME, which its Helm
// chart and ours set from the downward API (in a pod, os.Hostname is the pod's name), else the host name.
func (f *collectorFlags) apply(opts *collector.Options) {
	opts.Processes = f.processes
	opts.Compat = f.compat
	opts.CompatDCGM = collector.DCGMOptions{Version: f.dcgmVersion, EstimateGREngineActive: f.dcgmGREst}
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
