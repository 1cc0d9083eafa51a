package socket

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

func listen(t *testing.T, path string) net.Listener {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestCheck(t *testing.T) {
	dir := testkit.SocketDir(t)
	sock, regular := filepath.Join(dir, "a.sock"), filepath.Join(dir, "file")
	listen(t, sock)
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Check(sock); err != nil || !Exists(sock) {
		t.Errorf("Check(socket) = %v", err)
	}
	if err := Check(regular); err == nil || Exists(regular) {
		t.Errorf("Check(regular file) = %v, want an error", err)
	}
	if err := Check(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Check(missing) = %v, want fs.ErrNotExist", err)
	}
}

// A Watch looks again only once the interval has passed, lists a socket reached under two names once, and
// forgets what it found when told the socket is gone.
func TestWatch(t *testing.T) {
	dir := testkit.SocketDir(t)
	sock := filepath.Join(dir, "a.sock")
	alias := filepath.Join(dir, "alias")
	if err := os.Symlink(dir, alias); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w := NewWatch([]string{filepath.Join(dir, "missing.sock"), sock, filepath.Join(alias, "a.sock")}, 10*time.Second,
		func() time.Time { return now })

	if found, looked := w.Found(); len(found) != 0 || !looked {
		t.Fatalf("first look = %v, %t; want nothing, looked", found, looked)
	}
	listen(t, sock)
	now = now.Add(9 * time.Second)
	if found, looked := w.Found(); len(found) != 0 || looked {
		t.Errorf("within the interval = %v, %t; want the last look's answer", found, looked)
	}
	now = now.Add(time.Second)
	if found, looked := w.Found(); !reflect.DeepEqual(found, []string{sock}) || !looked {
		t.Errorf("after the interval = %v, %t; want [%s], looked", found, looked, sock)
	}
	w.Gone()
	if w.Present() {
		t.Error("Present after Gone, within the interval")
	}
	now = now.Add(10 * time.Second)
	if !w.Present() {
		t.Error("not Present once the interval passed again")
	}
}
