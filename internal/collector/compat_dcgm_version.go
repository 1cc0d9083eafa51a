package collector

import (
	"fmt"
	"strconv"
	"strings"
)

// dcgmVersion is a dcgm-exporter release from which --compat=dcgm's output changes: what its exposition names
// differently from the release before. Only what was read in dcgm-exporter's own files is here (docs/compat.md,
// "dcgm-exporter versions", says where).
type dcgmVersion struct {
	since [3]int
	// hostname is the name of the label that carries the node's name.
	hostname string
}

// dcgmVersions are the releases whose output --compat=dcgm follows, oldest first: each holds until the next.
// dcgmNewest is the newest release whose output we have checked; one after it may rename more than we know of.
var (
	dcgmVersions = []dcgmVersion{
		{since: [3]int{3, 0, 0}, hostname: "Hostname"},
		// Its internal/pkg/rendermetrics/render_metrics.go writes hostname (upstream's #655, after 4.8.2).
		{since: [3]int{4, 8, 3}, hostname: "hostname"},
	}
	dcgmNewest = [3]int{4, 8, 4}
)

// DefaultDCGMVersion is the dcgm-exporter release whose names --compat=dcgm writes unless told otherwise: the last
// one with the Hostname label, which every dashboard written before mid-2026 reads.
const DefaultDCGMVersion = "4.8.2"

// ParseDCGMVersion checks a --compat.dcgm-version value: an exporter version (4.8.3), with or without the DCGM
// version that dcgm-exporter's release tags lead with (4.6.0-4.8.3) and a leading v (see parseVersion). Versions before 3.0.0, and
// after the newest whose output we checked, are errors that say which are known.
func ParseDCGMVersion(s string) error {
	_, err := parseDCGMVersion(s)
	return err
}

func parseDCGMVersion(s string) (dcgmVersion, error) {
	v, ok := parseVersion(s)
	if !ok {
		return dcgmVersion{}, fmt.Errorf("dcgm-exporter version %q is not a version like 4.8.3 (or 4.6.0-4.8.3)", s)
	}
	if compareVersions(v, dcgmVersions[0].since) < 0 || compareVersions(v, dcgmNewest) > 0 {
		return dcgmVersion{}, fmt.Errorf("dcgm-exporter version %q is not one whose names are known: %s to %s "+
			"(a later release may rename fields; %s writes the newest known names)", s,
			formatVersion(dcgmVersions[0].since), formatVersion(dcgmNewest), formatVersion(dcgmNewest))
	}
	out := dcgmVersions[0]
	for _, d := range dcgmVersions {
		if compareVersions(v, d.since) >= 0 {
			out = d
		}
	}
	return out, nil
}

// parseVersion reads major.minor.patch, after an optional v and an optional DCGM version (major.minor.patch too)
// and dash, as dcgm-exporter's release tags write them: 4.8.3, v4.8.3, 4.6.0-4.8.3. Numbers are decimal without
// leading zeros; nothing else is taken, spaces included: the chart's schema (values.schema.json,
// compat.dcgm.version) takes the same strings, which a test checks.
func parseVersion(s string) ([3]int, bool) {
	s = strings.TrimPrefix(s, "v")
	if dcgm, exporter, ok := strings.Cut(s, "-"); ok {
		if _, ok := parseTriple(dcgm); !ok {
			return [3]int{}, false
		}
		s = exporter
	}
	return parseTriple(s)
}

// parseTriple reads major.minor.patch, each of at most 9 digits (an int on every platform).
func parseTriple(s string) ([3]int, bool) {
	parts := strings.Split(s, ".")
	var v [3]int
	if len(parts) != 3 {
		return v, false
	}
	for i, p := range parts {
		if len(p) > 9 {
			return v, false
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || p != strconv.Itoa(n) {
			return v, false
		}
		v[i] = n
	}
	return v, true
}

func compareVersions(a, b [3]int) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

func formatVersion(v [3]int) string { return fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]) }
