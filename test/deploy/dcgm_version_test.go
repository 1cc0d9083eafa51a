package deploy

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/collector"
)

// dcgmVersions are --compat.dcgm-version's values to check, as the exporter takes them: release versions from
// 3.0.0 to 4.8.4, the newest whose names it knows, alone or in the release tag's form after the DCGM version
// (4.6.0-4.8.3), with or without a leading v.
var dcgmVersions = map[string]bool{
	"3.0.0": true, "3.10.0": true, "4.7.99": true, "4.8.2": true, "4.8.3": true, "4.8.4": true, "v4.8.3": true,
	"3.3.9-3.6.1": true, "4.5.3-4.8.2": true, "4.6.0-4.8.3": true, "v4.6.0-4.8.3": true, "10.0.0-4.8.4": true,
	// Out of the range whose names are known.
	"2.4.7": false, "2.99.99": false, "4.8.5": false, "4.9.0": false, "9.9.9": false, "5.0.0": false, "4.7.1-4.10.0": false,
	// Not a version: the DCGM part must be one too.
	"garbage-4.8.3": false, "v-4.8.3": false, "-4.8.3": false, "4.6-4.8.3": false, "4.6.0.1-4.8.3": false,
	"1-2-4.8.3": false, "4.6.0-4.8.3-1": false, "4.6.0-v4.8.3": false, "4.6.0--4.8.3": false,
	"4.8": false, "latest": false, "4.08.3": false, "04.8.3": false, "4.8.03": false, "04.6.0-4.8.3": false,
	"V4.8.3": false, "vv4.8.3": false, " 4.8.4": false, "4.8.4 ": false, "4.8.4\n": false, "4.8.4-": false,
	"4.8.+4": false, "4.8.-4": false, "4.8.٤": false,
	// Numbers of up to 9 digits, an int everywhere.
	"3.999999999.0": true, "3.1000000000.0": false, "999999999.0.0-4.8.4": true, "1000000000.0.0-4.8.4": false,
}

// The chart's schema takes exactly the versions the exporter takes, so that helm refuses at install what the
// exporter would refuse at start: its pattern and the exporter's parser agree on every value of one table; "" is
// the chart's "the exporter's default", rendered as no flag.
func TestDCGMVersionSchemaAgreesWithTheExporter(t *testing.T) {
	var schema struct {
		Properties struct {
			Compat struct {
				Properties struct {
					DCGM struct {
						Properties struct {
							Version struct{ Pattern string }
						}
					}
				}
			}
		}
	}
	if err := json.Unmarshal(readRepoFile(t, "deploy/helm/gpu-pod-exporter/values.schema.json"), &schema); err != nil {
		t.Fatal(err)
	}
	pattern := regexp.MustCompile(schema.Properties.Compat.Properties.DCGM.Properties.Version.Pattern)
	if !pattern.MatchString("") {
		t.Error(`the schema refuses "", the chart's default`)
	}
	for v, want := range dcgmVersions {
		err := collector.ParseDCGMVersion(v)
		if (err == nil) != want {
			t.Errorf("the exporter: %q gives %v, want accepted %v", v, err, want)
		}
		if got := pattern.MatchString(v); got != want {
			t.Errorf("the schema's pattern: %q matches %v, want %v", v, got, want)
		}
	}
	// Helm applies the pattern as Go's regexp does.
	for _, v := range []string{"garbage-4.8.3", "9.9.9", "4.6.0-4.8.3"} {
		out, err := runErr(t, helm(t), "template", "gpe", chartDir, "--kube-version", kubeVersion,
			"--set", "compat.dcgm.enabled=true", "--set-string", "compat.dcgm.version="+v)
		if (err == nil) != dcgmVersions[v] || err != nil && !strings.Contains(string(out), "version") {
			t.Errorf("helm template with compat.dcgm.version=%s: %v\n%s", v, err, out)
		}
	}
}
