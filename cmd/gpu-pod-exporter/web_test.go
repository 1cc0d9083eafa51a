package main

import (
	"strings"
	"testing"
)

// The server's flags that cannot work stop it before it listens, with one line that names the flag.
func TestServerFlagErrors(t *testing.T) {
	for _, c := range []struct{ args, want string }{
		{"--web.telemetry-path=/healthz", "--web.telemetry-path: /healthz is served by the exporter already"},
		{"--web.listen-address=9402", `--web.listen-address: "9402" is a port without a host`},
		{"--web.health-listen-address=nohost", "--web.health-listen-address: "},
		{"--web.config.file=/nonexistent/web.yml", "--web.config.file: "},
	} {
		_, stderr, code := runMain(t, "--demo", c.args)
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("%s: exit %d, %q, want 2 and one line with %q", c.args, code, stderr, c.want)
		}
	}
}
