package configfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

func fifo(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A regular file is read whole up to the cap; anything else is refused for what it is, at once and without
// reading it: a FIFO nobody writes to, a device without end, a directory, a file over the cap.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small.yml")
	if err := os.WriteFile(small, []byte("a: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(small, 5); err != nil || string(b) != "a: 1\n" {
		t.Errorf("a 5-byte file, cap 5: %q, %v", b, err)
	}
	if _, err := Read(small, 4); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), small) {
		t.Errorf("a 5-byte file, cap 4: %v, want ErrTooLarge naming it", err)
	}
	// A sparse file of a gigabyte: refused from its size, not read.
	big := filepath.Join(dir, "big")
	if f, err := os.Create(big); err != nil {
		t.Fatal(err)
	} else {
		if err := f.Truncate(1 << 30); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if err := testkit.Within(t, 5*time.Second, "a 1 GiB file", func() error { _, err := Read(big, MaxBytes); return err }); !errors.Is(err, ErrTooLarge) ||
		!strings.Contains(err.Error(), "1024 MiB, over the cap of 4 MiB") {
		t.Errorf("a 1 GiB file: %v", err)
	}
	for _, c := range []struct{ path, kind string }{
		{fifo(t), "a named pipe (FIFO)"},
		{"/dev/zero", "a character device"},
		{dir, "a directory"},
	} {
		err := testkit.Within(t, 5*time.Second, c.path, func() error { _, err := Read(c.path, MaxBytes); return err })
		if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), c.path) || !strings.Contains(err.Error(), c.kind) {
			t.Errorf("%s: %v, want ErrNotRegular saying it is %s", c.path, err, c.kind)
		}
		if err := testkit.Within(t, 5*time.Second, c.path, func() error { return Check(c.path, MaxBytes) }); !errors.Is(err, ErrNotRegular) {
			t.Errorf("Check(%s): %v", c.path, err)
		}
	}
	if _, err := Read(filepath.Join(dir, "missing"), MaxBytes); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}

// The HTTP client configuration is read through Read, and every file it names is checked: a password file that is
// a FIFO would otherwise hang the first request, since the client reads it then.
func TestHTTPClient(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write("password", "s3cret\n")
	cfg, err := HTTPClient(write("ok.yml", "basic_auth:\n  username: u\n  password_file: password\n"))
	if err != nil || cfg.BasicAuth.PasswordFile != filepath.Join(dir, "password") {
		t.Fatalf("a relative password file: %+v, %v", cfg, err)
	}
	pipe := fifo(t)
	for name, text := range map[string]string{
		"password_file":      "basic_auth:\n  username: u\n  password_file: " + pipe + "\n",
		"credentials_file":   "authorization:\n  credentials_file: " + pipe + "\n",
		"bearer_token_file":  "bearer_token_file: " + pipe + "\n",
		"ca_file":            "tls_config:\n  ca_file: " + pipe + "\n",
		"client_secret_file": "oauth2:\n  client_id: x\n  client_secret_file: " + pipe + "\n  token_url: http://127.0.0.1:1/\n",
		"header files":       "http_headers:\n  X-Scope-OrgID:\n    files: [" + pipe + "]\n",
	} {
		err := testkit.Within(t, 5*time.Second, name, func() error { _, err := HTTPClient(write(strings.ReplaceAll(name, " ", "_")+".yml", text)); return err })
		if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), pipe) {
			t.Errorf("%s naming a FIFO: %v, want ErrNotRegular naming it", name, err)
		}
	}
	if err := testkit.Within(t, 5*time.Second, "/dev/zero", func() error { _, err := HTTPClient("/dev/zero"); return err }); !errors.Is(err, ErrNotRegular) {
		t.Errorf("/dev/zero as the configuration: %v", err)
	}
}
