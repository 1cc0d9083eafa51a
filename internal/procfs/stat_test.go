package procfs

import (
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	for line, want := range map[string]struct {
		comm  string
		start uint64
		ok    bool
	}{
		"42 (python3) S 1 42 42 0 -1 4194560 1 0 0 0 5 1 0 0 20 0 1 0 123456 1000 10 18446744073709551615 0 0\n": {"python3", 123456, true},
		// comm may hold spaces and parentheses: the fields count from the last ')'.
		"7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0\n": {"a) b (c)", 99, true},
		"7 () R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5":                {"", 5, true},
		"7 (short) R 1 7": {ok: false},
		"garbage":         {ok: false},
		"7 (x) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 notanumber 0 0": {ok: false},
	} {
		comm, start, ok := parseStat([]byte(line))
		if ok != want.ok || ok && (comm != want.comm || start != want.start) {
			t.Errorf("parseStat(%q) = %q, %d, %v; want %q, %d, %v", line, comm, start, ok, want.comm, want.start, want.ok)
		}
	}
}

// The real kernel's stat file of this process parses, and names it as comm does.
func TestStatOfSelf(t *testing.T) {
	pid := uint32(os.Getpid())
	r := NewReader("/proc")
	comm, err := r.Comm(pid)
	if err != nil {
		t.Skip("no /proc:", err)
	}
	name, start, err := r.Stat(pid)
	if err != nil {
		t.Fatal(err)
	}
	if name != comm || start == 0 {
		t.Errorf("Stat = %q, %d; comm %q", name, start, comm)
	}
}

// Usage reads utime, stime, starttime and rss (fields 14, 15, 22 and 24) after the name, whatever the name holds.
func TestUsage(t *testing.T) {
	root, dir := fakeProc(t)
	writeFile(t, dir+"/stat", "42 (py (x) 3) S 1 42 42 0 -1 4194560 1 0 0 0 500 120 0 0 20 0 1 0 123456 1000 2048 18446744073709551615 0 0\n")
	u, err := NewReader(root).Usage(42)
	if want := (Usage{Start: 123456, CPUTicks: 620, RSSPages: 2048}); err != nil || u != want {
		t.Errorf("Usage = %+v, %v; want %+v", u, err, want)
	}
	writeFile(t, dir+"/stat", "42 (python3) S 1 42\n")
	if _, err := NewReader(root).Usage(42); err == nil {
		t.Error("a short stat line: no error")
	}
}
