package deploy

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const unitPath = "deploy/systemd/gpu-pod-exporter.service"

// parseUnit reads a unit file into section → key → values (a key may repeat).
func parseUnit(t *testing.T, b []byte) map[string]map[string][]string {
	t.Helper()
	units := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			units[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a key=value in a section: %q", unitPath, n, line)
			}
			units[section][strings.TrimSpace(k)] = append(units[section][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return units
}

func TestSystemdUnitKeys(t *testing.T) {
	u := parseUnit(t, readRepoFile(t, unitPath))
	want := map[string]map[string]string{
		"Unit": {"After": "containerd.service docker.service"},
		"Service": {
			"EnvironmentFile": "-/etc/default/gpu-pod-exporter -/etc/sysconfig/gpu-pod-exporter",
			"NoNewPrivileges": "yes",
			"ProtectSystem":   "strict",
			"ProtectHome":     "yes",
			"PrivateTmp":      "yes",
			"Restart":         "on-failure",
		},
		"Install": {"WantedBy": "multi-user.target"},
	}
	for section, keys := range want {
		for k, v := range keys {
			got := strings.Join(u[section][k], " ")
			for _, w := range strings.Fields(v) {
				if !strings.Contains(got, w) {
					t.Errorf("[%s] %s=%q lacks %q", section, k, got, w)
				}
			}
		}
	}
	// A bare name: systemd takes /usr/local/bin/gpu-pod-exporter (installed by hand) before /usr/bin/gpu-pod-exporter
	// (the packages'), so one unit serves both.
	if got := u["Service"]["ExecStart"]; len(got) != 1 || got[0] != "gpu-pod-exporter $GPU_POD_EXPORTER_OPTS" {
		t.Errorf("ExecStart=%q, want the bare name gpu-pod-exporter with $GPU_POD_EXPORTER_OPTS", got)
	}
	if got := u["Service"]["CapabilityBoundingSet"]; len(got) != 1 || got[0] != "" {
		t.Errorf("CapabilityBoundingSet=%q, want empty: no capability is needed", got)
	}
	// Settings that would hide what the exporter reads.
	for _, k := range []string{"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "ProtectProc", "ProcSubset", "PrivateNetwork", "PrivatePIDs"} {
		if v, ok := u["Service"][k]; ok {
			t.Errorf("%s=%v: hides the NVIDIA devices, other processes' /proc or the network (see the unit's comments)", k, v)
		}
	}
}

// TestSystemdAnalyzeVerify runs systemd's own checks on the unit in an offline root (no running systemd needed):
// `systemd-analyze verify` rejects unknown keys and bad values, `systemd-analyze security` scores the hardening.
func TestSystemdAnalyzeVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (Debian package systemd); TestSystemdUnitKeys still checks the keys")
	}
	systemUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(systemUnits, "multi-user.target")); err != nil {
		systemUnits = "/lib/systemd/system"
	}
	root := t.TempDir()
	for _, d := range []string{"usr/local/bin", "etc/systemd/system", "usr/lib/systemd"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The targets it orders against, and an executable where ExecStart points.
	out, err := exec.Command("cp", "-a", systemUnits, filepath.Join(root, "usr/lib/systemd/system")).CombinedOutput()
	if err != nil {
		t.Fatalf("copying %s: %v\n%s", systemUnits, err, out)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/local/bin/gpu-pod-exporter"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	verify := func(unit []byte) ([]byte, error) {
		if err := os.WriteFile(filepath.Join(root, "etc/systemd/system/gpu-pod-exporter.service"), unit, 0o644); err != nil {
			t.Fatal(err)
		}
		return exec.Command(sa, "verify", "--root="+root, "gpu-pod-exporter.service").CombinedOutput()
	}
	unit := readRepoFile(t, unitPath)
	if out, err := verify(unit); err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The check can fail: a misspelt key is reported.
	if out, _ := verify(bytes.Replace(unit, []byte("ProtectSystem="), []byte("ProtectSytem="), 1)); !bytes.Contains(out, []byte("ProtectSytem")) {
		t.Errorf("systemd-analyze verify did not report a misspelt key:\n%s", out)
	}
	verify(unit)
	// Exposure 0 (locked down) to 10 (unprotected), times 10 for --threshold: at most 3.0.
	out, err = exec.Command(sa, "security", "--offline=yes", "--root="+root, "--threshold=30", "gpu-pod-exporter.service").CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze security: exposure above 3.0 (%v):\n%s", err, out)
	}
}
