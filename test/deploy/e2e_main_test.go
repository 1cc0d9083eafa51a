//go:build e2e

package deploy

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// The e2e tests of this package start their own dockerd through scripts/e2e/setup-runtimes.sh, in a work directory
// of their own (GPE_DEPLOY_E2E_WORK, default /tmp/gpe-e2e-deploy), so that they can run while test/e2e runs with
// its own; TestMain tears it down with scripts/e2e/teardown-runtimes.sh.

var (
	runtimesOnce    sync.Once
	runtimesErr     error
	runtimesStarted bool
	runtimesEnv     map[string]string
)

func deployWork() string {
	if w := os.Getenv("GPE_DEPLOY_E2E_WORK"); w != "" {
		return w
	}
	return "/tmp/gpe-e2e-deploy"
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if runtimesStarted && os.Getenv("GPE_E2E_KEEP") != "1" {
		if err := runtimesScript("teardown-runtimes.sh", 3*time.Minute); err != nil {
			fmt.Fprintln(os.Stderr, "test/deploy: teardown:", err)
		}
	}
	os.Exit(code)
}

func runtimesScript(name string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repo, "scripts/e2e", name))
	cmd.Env = append(os.Environ(), "E2E_WORK="+deployWork())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// dockerHost starts (once) the harness' private dockerd and returns its socket. It needs root.
func dockerHost(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: starts a private dockerd (scripts/e2e/setup-runtimes.sh)")
	}
	runtimesOnce.Do(func() {
		runtimesStarted = true
		start := time.Now()
		// A run that was killed may have left containers behind.
		if err := runtimesScript("teardown-runtimes.sh", 3*time.Minute); err != nil {
			fmt.Fprintln(os.Stderr, "test/deploy: teardown of an earlier run:", err)
		}
		if err := runtimesScript("setup-runtimes.sh", 15*time.Minute); err != nil {
			runtimesErr = fmt.Errorf("scripts/e2e/setup-runtimes.sh: %v", err)
			return
		}
		b, err := os.ReadFile(filepath.Join(deployWork(), "env"))
		if err != nil {
			runtimesErr = err
			return
		}
		runtimesEnv = map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				runtimesEnv[k] = v
			}
		}
		fmt.Fprintf(os.Stderr, "test/deploy: runtimes ready in %s\n", time.Since(start).Round(100*time.Millisecond))
	})
	if runtimesErr != nil {
		t.Fatal(runtimesErr)
	}
	sock := runtimesEnv["GPE_E2E_DOCKER_SOCK"]
	if sock == "" {
		t.Fatal("setup-runtimes.sh wrote no GPE_E2E_DOCKER_SOCK")
	}
	return sock
}

// docker runs the docker CLI against the private dockerd. Debian's 20.10 CLI (/usr/bin/docker) speaks BuildKit
// without the buildx plugin.
func docker(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := "/usr/bin/docker"
	if _, err := os.Stat(bin); err != nil {
		bin = "docker"
	}
	cmd := exec.Command(bin, append([]string{"-H", "unix://" + dockerHost(t)}, args...)...)
	cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=1")
	cmd.Dir = repoRoot(t)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func mustDocker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := docker(t, args...)
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}
