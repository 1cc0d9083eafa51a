//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// env is the environment that TestMain set up; the tests only read it.
var env *environment

type environment struct {
	repo string // repository root
	work string // E2E_WORK: the daemons' state, sockets and logs
	tmp  string // this run's scratch directory

	image            string
	containerdSock   string
	containerdConfig string
	dockerSock       string
	podmanSock       string
	podmanEnv        []string // CONTAINERS_CONF, CONTAINERS_STORAGE_CONF for the podman CLI

	binary   string // the built gpu-pod-exporter
	buildErr error  // why it could not be built; the tests that need it fail with this
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: these tests need root (they start container runtimes and write cgroups); skipping")
		return 0
	}
	repo := e2eutil.RepoRoot()
	work := os.Getenv("E2E_WORK")
	if work == "" {
		work = "/tmp/gpe-e2e"
	}
	tmp, err := os.MkdirTemp("", "gpe-e2e-run-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(tmp)

	keep := os.Getenv("GPE_E2E_KEEP") == "1"
	var once sync.Once
	teardown := func() {
		once.Do(func() {
			if keep {
				fmt.Fprintf(os.Stderr, "e2e: GPE_E2E_KEEP=1: leaving the runtimes running; clean up with "+
					"E2E_WORK=%s %s\n", work, filepath.Join(repo, "scripts/e2e/teardown-runtimes.sh"))
				return
			}
			if err := runScript(repo, work, "teardown-runtimes.sh", 3*time.Minute); err != nil {
				fmt.Fprintln(os.Stderr, "e2e: teardown:", err)
			}
		})
	}
	// Clean up also when the run is interrupted, or is about to be killed by -timeout (which runs no defers).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "e2e: %v: tearing down\n", s)
		teardown()
		os.RemoveAll(tmp)
		os.Exit(2)
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, err := time.ParseDuration(f.Value.String()); err == nil && d > time.Minute {
			go func() {
				time.Sleep(d - 45*time.Second)
				fmt.Fprintln(os.Stderr, "e2e: the test timeout is near: tearing down the runtimes now")
				teardown()
			}()
		}
	}

	// A run that was killed may have left workloads behind: start from a clean state.
	if os.Getenv("GPE_E2E_REUSE") != "1" {
		if err := runScript(repo, work, "teardown-runtimes.sh", 3*time.Minute); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: teardown of an earlier run:", err)
		}
	}
	defer teardown()
	start := time.Now()
	if err := runScript(repo, work, "setup-runtimes.sh", 15*time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: setting up the container runtimes failed:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: runtimes ready in %s\n", time.Since(start).Round(100*time.Millisecond))

	env, err = loadEnvironment(repo, work, tmp)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	start = time.Now()
	if env.binary, env.buildErr = e2eutil.BuildBinary(tmp); env.buildErr != nil {
		fmt.Fprintln(os.Stderr, "e2e:", env.buildErr)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: built the exporter in %s\n", time.Since(start).Round(100*time.Millisecond))
	}
	return m.Run()
}

// runScript runs scripts/e2e/NAME with E2E_WORK set, streaming its output to stderr.
func runScript(repo, work, name string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repo, "scripts/e2e", name))
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "E2E_WORK="+work)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// loadEnvironment reads the KEY=VALUE file that setup-runtimes.sh wrote.
func loadEnvironment(repo, work, tmp string) (*environment, error) {
	path := filepath.Join(work, "env")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the runtimes' environment: %w", err)
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	e := &environment{
		repo:             repo,
		work:             work,
		tmp:              tmp,
		image:            kv["GPE_E2E_IMAGE"],
		containerdSock:   kv["GPE_E2E_CONTAINERD_SOCK"],
		containerdConfig: kv["GPE_E2E_CONTAINERD_CONFIG"],
		dockerSock:       kv["GPE_E2E_DOCKER_SOCK"],
		podmanSock:       kv["GPE_E2E_PODMAN_SOCK"],
		podmanEnv: []string{
			"CONTAINERS_CONF=" + kv["CONTAINERS_CONF"],
			"CONTAINERS_STORAGE_CONF=" + kv["CONTAINERS_STORAGE_CONF"],
		},
	}
	for k, v := range map[string]string{"GPE_E2E_IMAGE": e.image, "GPE_E2E_CONTAINERD_SOCK": e.containerdSock,
		"GPE_E2E_DOCKER_SOCK": e.dockerSock, "GPE_E2E_PODMAN_SOCK": e.podmanSock} {
		if v == "" {
			return nil, fmt.Errorf("%s: %s is missing", path, k)
		}
	}
	return e, nil
}

// logTail returns the last n lines of a file, for failure messages.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// daemonLogs returns the tails of the named daemons' logs ("containerd", "dockerd", "podman").
func (e *environment) daemonLogs(names ...string) string {
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "\n--- last lines of %s log ---\n%s\n", n, logTail(filepath.Join(e.work, "logs", n+".log"), 25))
	}
	return b.String()
}

// daemonPID returns the PID that setup-runtimes.sh recorded for a daemon.
func (e *environment) daemonPID(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join(e.work, "pids", name+".pid"))
	if err != nil {
		return 0, err
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		return 0, fmt.Errorf("pid file of %s: %v", name, err)
	}
	return pid, nil
}

// stopContainerd stops containerd (its shims and containers keep running, as on a real node).
func (e *environment) stopContainerd() error {
	pid, err := e.daemonPID("containerd")
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("kill -TERM containerd (%d): %w", pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return fmt.Errorf("containerd (%d) did not exit within 30s of SIGTERM; killed", pid)
}

// startContainerd starts containerd again through the (idempotent) setup script.
func (e *environment) startContainerd() error {
	return runScript(e.repo, e.work, "setup-runtimes.sh", 3*time.Minute)
}
