package users

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/configfile"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

// statusSample is the head of a real /proc/<pid>/status (Linux 6.1), where uid 1000 runs a process whose
// effective uid is 0 (a setuid program): the real uid is the owner.
const statusSample = `Name:	python3
Umask:	0022
State:	S (sleeping)
Tgid:	31337
Ngid:	0
Pid:	31337
PPid:	1
TracerPid:	0
Uid:	1000	0	0	0
Gid:	1000	1000	1000	1000
FDSize:	256
Groups:	27 1000
`

func TestParseStatusUID(t *testing.T) {
	for _, tc := range []struct {
		status string
		uid    uint32
		ok     bool
	}{
		{statusSample, 1000, true},
		{"Uid:\t0\t0\t0\t0\n", 0, true},
		{"Uid:\t4294967294\t0\t0\t0", 4294967294, true}, // no trailing newline; the overflow uid
		{"Name:\tx\n", 0, false},
		{"Uid:\n", 0, false},
		{"Uid:\t-1\t0\t0\t0\n", 0, false},
		{"Uid:\t4294967296\t0\n", 0, false},
		{"", 0, false},
	} {
		uid, ok := ParseStatusUID([]byte(tc.status))
		if uid != tc.uid || ok != tc.ok {
			t.Errorf("ParseStatusUID(%q) = %d, %v, want %d, %v", tc.status, uid, ok, tc.uid, tc.ok)
		}
	}
}

func TestParsePasswd(t *testing.T) {
	got := ParsePasswd(strings.NewReader(`root:x:0:0:root:/root:/bin/bash
# a comment
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
alice:x:1000:1000:Alice,,,:/home/alice:/bin/bash
toor:x:0:0:second root:/root:/bin/sh
+nisuser::::::
broken:x
nouid:x::1::/:/bin/sh
:x:7:7::/:/bin/sh
big:x:4294967296:1::/:/bin/sh
bad` + "\xff" + `name:x:2000:2000::/:/bin/sh
`))
	want := map[uint32]string{0: "root", 1: "daemon", 1000: "alice", 2000: "bad\uFFFDname"}
	if len(got) != len(want) {
		t.Errorf("ParsePasswd = %v, want %v", got, want)
	}
	for uid, name := range want {
		if got[uid] != name {
			t.Errorf("uid %d: %q, want %q", uid, got[uid], name)
		}
	}
}

func TestResolver(t *testing.T) {
	dir := t.TempDir()
	procfs := filepath.Join(dir, "proc")
	passwd := filepath.Join(dir, "passwd")
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(procfs, "31337", "status"), statusSample)
	write(filepath.Join(procfs, "42", "status"), "Uid:\t5000\t5000\t5000\t5000\n")
	write(passwd, "alice:x:1000:1000::/home/alice:/bin/bash\n")
	now := time.Unix(1e9, 0)
	r := New(procfs, passwd)
	r.now = func() time.Time { return now }

	check := func(pid uint32, want string) {
		t.Helper()
		got, err := r.User(pid)
		if err != nil || got != want {
			t.Errorf("User(%d) = %q, %v, want %q", pid, got, err, want)
		}
	}
	check(31337, "alice")
	check(42, "5000") // not in the user database: the uid
	if _, err := r.User(7); err == nil {
		t.Error("User of a process that does not exist did not fail")
	}

	// A user added later is named once the file is checked again, not before.
	write(passwd, "alice:x:1000:1000::/home/alice:/bin/bash\nbob:x:5000:5000::/home/bob:/bin/bash\n")
	check(42, "5000")
	now = now.Add(refresh)
	check(42, "bob")

	// A database that disappears keeps the names it gave, and says why.
	if err := os.Remove(passwd); err != nil {
		t.Fatal(err)
	}
	now = now.Add(refresh)
	check(42, "bob")
	if r.Err() == nil {
		t.Error("no error for a missing user database")
	}
}

// A user database that is not a regular file (a FIFO under a wrong --path.rootfs) is an error, not a lookup blocked
// until something writes to it; the process is named by its uid.
func TestResolverRefusesAFIFO(t *testing.T) {
	dir := t.TempDir()
	procfs := filepath.Join(dir, "proc")
	if err := os.MkdirAll(filepath.Join(procfs, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(procfs, "42", "status"), []byte("Uid:\t5000\t5000\t5000\t5000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(dir, "passwd")
	if err := syscall.Mkfifo(passwd, 0o600); err != nil {
		t.Fatal(err)
	}
	r := New(procfs, passwd)
	var name string
	testkit.Within(t, 5*time.Second, "a lookup with a FIFO for passwd", func() (err error) {
		name, err = r.User(42)
		return err
	})
	if name != "5000" || !errors.Is(r.Err(), configfile.ErrNotRegular) {
		t.Errorf("User = %q, Err = %v; want the uid and a refusal", name, r.Err())
	}
}

func FuzzParseStatusUID(f *testing.F) {
	f.Add([]byte(statusSample))
	f.Add([]byte("Uid:\t1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		uid, ok := ParseStatusUID(b)
		if !ok && uid != 0 {
			t.Errorf("uid %d with ok false", uid)
		}
		if ok && !strings.Contains(string(b), "Uid:") {
			t.Error("a uid from a status without a Uid line")
		}
	})
}

func FuzzParsePasswd(f *testing.F) {
	f.Add([]byte("root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\n"))
	f.Add([]byte("+::::::\n#\n:x:1:1::/:/\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for uid, name := range ParsePasswd(strings.NewReader(string(b))) {
			if name == "" || strings.ContainsAny(name, ":\n") {
				t.Errorf("uid %d: name %q", uid, name)
			}
		}
	})
}
