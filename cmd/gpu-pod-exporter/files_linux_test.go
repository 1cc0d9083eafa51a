package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Every file a flag names is read only if it is a regular file within a cap, and so is every file those files
// name: /dev/zero would be read until memory ran out, a FIFO would block the start (or, for a password file, the
// first request) for as long as nothing writes to it. Each is refused at once, with one line naming the flag.
func TestFlagFilesMustBeRegular(t *testing.T) {
	dir := t.TempDir()
	pipe := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	passwordFIFO := write("password.yml", "basic_auth:\n  username: u\n  password_file: "+pipe+"\n")
	certZero := write("web.yml", "tls_server_config:\n  cert_file: /dev/zero\n  key_file: /dev/zero\n")
	// A Prometheus that is not there: a request would fail at once, after its password file had been read.
	cluster := []string{"ps", "--prometheus=http://127.0.0.1:1", "--prometheus.timeout=2s"}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--demo", "--web.config.file=/dev/zero"}, "--web.config.file"},
		{[]string{"--demo", "--web.config.file=" + pipe}, "--web.config.file"},
		{[]string{"--demo", "--web.config.file=" + certZero}, "--web.config.file"},
		{append(cluster, "--http.config.file=/dev/zero"), "--http.config.file"},
		{append(cluster, "--http.config.file="+pipe), "--http.config.file"},
		{append(cluster, "--http.config.file="+passwordFIFO), "--http.config.file"},
		{[]string{"ps", "--gpu.simulated-config=" + pipe}, "--gpu.simulated-config"},
		{[]string{"ps", "--gpu.simulated-config=/dev/zero"}, "--gpu.simulated-config"},
	} {
		stderr, code := runMainBounded(t, c.args...)
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "gpu-pod-exporter: "+c.flag+": ") ||
			!strings.Contains(stderr, "not a regular file") {
			t.Errorf("%q: exit %d, %q; want 2 and one line naming %s and the file that is not a regular one", c.args, code, stderr, c.flag)
		}
	}
}

// runMainBounded runs the program as runMain does, but ends it after 20 s and limits its address space to 3 GiB, so
// that a program that reads without end fails the test instead of taking the machine's memory.
func runMainBounded(t *testing.T, args ...string) (stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), "GPE_TEST_RUN_MAIN=1")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	limit := unix.Rlimit{Cur: 3 << 30, Max: 3 << 30}
	if err := unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_AS, &limit, nil); err != nil {
		t.Logf("cannot limit the address space: %v", err)
	}
	cmd.Wait()
	if ctx.Err() != nil {
		t.Errorf("%q: still running after 20 s", args)
	}
	return errOut.String(), cmd.ProcessState.ExitCode()
}
