package collector

import (
	"strings"
	"testing"
)

// The host label is Hostname by default and up to 4.8.2, hostname from 4.8.3 (dcgm-exporter's own
// render_metrics.go of that release); everything else stays.
func TestCompatDCGMVersionHostLabel(t *testing.T) {
	snap, owners := compatNode()
	for _, c := range []struct{ version, label, other string }{
		{"", "Hostname", "hostname"}, {"4.8.2", "Hostname", "hostname"}, {"3.3.9-3.6.1", "Hostname", "hostname"},
		{"4.8.3", "hostname", "Hostname"}, {"4.6.0-4.8.3", "hostname", "Hostname"}, {"v4.8.4", "hostname", "Hostname"},
	} {
		opts := Options{Compat: []string{CompatDCGM}, CompatHostname: "gpu-node-1", CompatDCGM: DCGMOptions{Version: c.version}}
		text := compatExposition(t, registry(t, fixedSource{snap}, owners, opts), "DCGM_")
		if !strings.Contains(text, c.label+`="gpu-node-1"`) || strings.Contains(text, c.other+`=`) {
			t.Errorf("version %q: want label %s and no %s; the exposition:\n%.400s", c.version, c.label, c.other, text)
		}
		if n := strings.Count(text, "\nDCGM_FI_DEV_FB_USED{"); n != 8 {
			t.Errorf("version %q: %d FB_USED series, want the same 8 as by default", c.version, n)
		}
	}
}

func TestParseDCGMVersion(t *testing.T) {
	for _, ok := range []string{"4.8.2", "4.8.3", "4.8.4", "3.0.0", "4.5.3-4.8.2", "v4.8.3"} {
		if err := ParseDCGMVersion(ok); err != nil {
			t.Errorf("ParseDCGMVersion(%q): %v", ok, err)
		}
	}
	for bad, says := range map[string]string{
		"4.9.0":        "4.8.4", // after the newest whose names we checked
		"4.7.1-4.10.0": "4.8.4",
		"2.4.7":        "3.0.0",
		"4.8":          "like 4.8.3",
		"latest":       "like 4.8.3",
		"4.08.3":       "like 4.8.3",
		"":             "like 4.8.3",
		" 4.8.4 ":      "like 4.8.3",
		// The DCGM version before the dash is a version too.
		"garbage-4.8.3": "like 4.8.3",
		"v-4.8.3":       "like 4.8.3",
		"4.6-4.8.3":     "like 4.8.3",
	} {
		if err := ParseDCGMVersion(bad); err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "dcgm-exporter") {
			t.Errorf("ParseDCGMVersion(%q) = %v, want an error that says %q", bad, err, says)
		}
	}
}

// Whatever the input, a version the parser takes is one it writes back the same (the input ends with it), and one
// ParseDCGMVersion accepts is within the range whose names are known and takes the names of the newest release at
// or before it.
func FuzzParseDCGMVersion(f *testing.F) {
	for _, s := range []string{"4.8.3", "v4.8.2", "4.6.0-4.8.3", "3.0.0", "4.8.5", "garbage-4.8.3", "v-4.8.3", "04.8.3", "4.8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := parseVersion(s)
		got, err := parseDCGMVersion(s)
		if !ok {
			if err == nil {
				t.Fatalf("%q is not a version, and was accepted", s)
			}
			return
		}
		text := formatVersion(v)
		if back, ok := parseVersion(text); !ok || back != v || !strings.HasSuffix(s, text) {
			t.Fatalf("%q reads as %v, written %q, which reads back as %v (%v)", s, v, text, back, ok)
		}
		inRange := compareVersions(v, dcgmVersions[0].since) >= 0 && compareVersions(v, dcgmNewest) <= 0
		if (err == nil) != inRange {
			t.Fatalf("%q (%s): error %v, in the known range %v", s, text, err, inRange)
		}
		if err != nil {
			return
		}
		for _, d := range dcgmVersions {
			if compareVersions(d.since, v) <= 0 && compareVersions(d.since, got.since) > 0 {
				t.Fatalf("%q takes the names of %v, but %v is newer and not after it", s, got.since, d.since)
			}
		}
		if compareVersions(got.since, v) > 0 {
			t.Fatalf("%q takes the names of %v, a later release", s, got.since)
		}
	})
}
