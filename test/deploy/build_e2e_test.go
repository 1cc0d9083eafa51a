//go:build e2e

package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/test/internal/e2eutil"
)

// The build tests run each way of building the exporter as its users do and read what the build prints: a
// newcomer takes a page of gcc warnings for a failed build.

// freshCgo is an environment in which every cgo package (go-nvml among them) is compiled afresh rather than taken
// from the build cache, as on a first build: cgo's preprocessor flags are part of the cache key, and a define that
// nothing reads changes them without changing the build. The build paths under test set CGO_CFLAGS, not these.
func freshCgo() string {
	return fmt.Sprintf("CGO_CPPFLAGS=-DGPE_FRESH_BUILD=%d", time.Now().UnixNano())
}

// compilerWarnings are the lines of a build's output in which a compiler warns.
func compilerWarnings(out string) []string {
	var w []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "warning:") {
			w = append(w, l)
		}
	}
	return w
}

// TestREADMECommandsRunAsWritten: the README's two commands, exactly as written (without cgo), build and run on a
// machine as it is: the demo serves its simulated node on :9402 and top prints it; neither prints a warning.
func TestREADMECommandsRunAsWritten(t *testing.T) {
	readme := string(readRepoFile(t, "README.md"))
	commands := readmeCommands(readme)
	if len(commands) != 2 {
		t.Fatalf("README.md's commands: %q, want the demo and its top", commands)
	}
	for _, c := range commands {
		top := strings.Contains(c, " top ")
		name := map[bool]string{false: "demo", true: "top"}[top]
		t.Run(name, func(t *testing.T) {
			cmd, out := startREADMECommand(t, c)
			if top {
				// Not on a terminal, top prints a plain table every --interval.
				testkit.WaitFor(t, 5*time.Minute, "top's first table", func() bool {
					return strings.Contains(out.String(), "(simulated)") && strings.Contains(out.String(), "OWNER")
				})
			} else {
				testkit.WaitFor(t, 5*time.Minute, "the demo's metrics on :9402", func() bool {
					body, err := e2eutil.Get("http://localhost:9402/metrics")
					return err == nil && strings.Contains(body, `simulated="true"`) &&
						strings.Contains(out.String(), `msg="Listening on" address=[::]:9402`)
				})
			}
			stopGroup(t, cmd, out)
			if w := compilerWarnings(out.String()); len(w) > 0 {
				t.Errorf("%s printed warnings:\n%s", c, strings.Join(w, "\n"))
			}
		})
	}
}

// startREADMECommand starts a README command line (VAR=value ... go run ...) without a shell, in its own process
// group, since go run leaves an interrupt to the program it runs.
func startREADMECommand(t *testing.T, line string) (*exec.Cmd, *testkit.SyncBuffer) {
	t.Helper()
	fields := strings.Fields(line)
	env := os.Environ()
	for len(fields) > 0 && strings.Contains(fields[0], "=") {
		env = append(env, fields[0])
		fields = fields[1:]
	}
	cmd := exec.Command(fields[0], fields[1:]...)
	cmd.Dir = repoRoot(t)
	cmd.Env = env
	out := &testkit.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	})
	return cmd, out
}

// stopGroup interrupts a command's process group, as Ctrl-C does, and wants it to end. Its status is go run's,
// which is 1 after any interrupt whatever the program's.
func stopGroup(t *testing.T, cmd *exec.Cmd, out *testkit.SyncBuffer) {
	t.Helper()
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Errorf("%v did not end within 30s of an interrupt:\n%s", cmd.Args, out)
	}
}

// TestBuildsForMacOS: the exporter builds for macOS from Linux as a Mac builds it (no cgo), without a warning, and
// the binary has no NVML source: the demo, ps and top are what runs there.
func TestBuildsForMacOS(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gpu-pod-exporter")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/gpu-pod-exporter")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("GOOS=darwin go build: %v\n%s", err, out)
	}
	if w := compilerWarnings(string(out)); len(w) > 0 {
		t.Errorf("GOOS=darwin go build printed warnings:\n%s", strings.Join(w, "\n"))
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "built without NVML (needs linux and cgo)") {
		t.Error("the macOS binary does not carry the reason it has no NVML")
	}
}

// TestBuildPathsPrintNoCompilerWarnings: `make build` and the Dockerfile's build, with go-nvml compiled afresh as on
// a first build, print no compiler warning; the same fresh build without their CGO_CFLAGS does (nvml.h's
// deprecation warnings), so the two would catch them. (make build leaves ./gpu-pod-exporter, as it always does.)
func TestBuildPathsPrintNoCompilerWarnings(t *testing.T) {
	build := func(t *testing.T, name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = repoRoot(t)
		// A CGO_CFLAGS of the caller's (a developer's quiet one) would stand in for the build path's own.
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, "CGO_CFLAGS=") && !strings.HasPrefix(e, "CGO_ENABLED=") {
				cmd.Env = append(cmd.Env, e)
			}
		}
		cmd.Env = append(cmd.Env, "CGO_ENABLED=1", freshCgo())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	t.Run("go build, the control", func(t *testing.T) {
		out := build(t, "go", "build", "-o", os.DevNull, "./cmd/gpu-pod-exporter")
		if len(compilerWarnings(out)) == 0 {
			t.Fatalf("a fresh cgo build without CGO_CFLAGS printed no warning, so this test cannot see them:\n%s", out)
		}
	})
	t.Run("make build", func(t *testing.T) {
		if w := compilerWarnings(build(t, "make", "build")); len(w) > 0 {
			t.Errorf("make build printed warnings:\n%s", strings.Join(w, "\n"))
		}
	})
	t.Run("Dockerfile", func(t *testing.T) {
		if w := compilerWarnings(build(t, "sh", "-c", dockerfileBuildCommand(t, t.TempDir()))); len(w) > 0 {
			t.Errorf("the Dockerfile's go build printed warnings:\n%s", strings.Join(w, "\n"))
		}
	})
}
