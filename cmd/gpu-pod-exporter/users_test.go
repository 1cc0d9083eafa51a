package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kingpin/v2"
)

// Off by default, on with --demo unless turned off there, on when asked.
func TestProcessUserFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		demo bool
		want bool
	}{
		{nil, false, false},
		{nil, true, true},
		{[]string{"--no-collector.process-user"}, true, false},
		{[]string{"--collector.process-user"}, false, true},
	} {
		app := kingpin.New("test", "")
		pu := &processUserFlags{demo: &tc.demo}
		pu.register(app)
		if _, err := app.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if got := pu.on(); got != tc.want {
			t.Errorf("%v, demo %v: on = %v, want %v", tc.args, tc.demo, got, tc.want)
		}
	}
}

// --path.rootfs must be a directory; a missing passwd under it is a warning (users become uids), except on the demo.
func TestProcessUserRootFS(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	demo := false
	for _, bad := range []string{filepath.Join(root, "missing"), file} {
		pu := &processUserFlags{enabled: true, rootfs: bad, demo: &demo}
		if err := pu.check(); err == nil || !strings.HasPrefix(err.Error(), "--path.rootfs: ") {
			t.Errorf("rootfs %s: %v, want an error naming --path.rootfs", bad, err)
		}
	}
	off := &processUserFlags{rootfs: filepath.Join(root, "missing"), demo: &demo}
	if err := off.check(); err != nil {
		t.Errorf("rootfs checked while users are not looked up: %v", err)
	}
	pu := &processUserFlags{enabled: true, rootfs: root, demo: &demo}
	if err := pu.check(); err != nil {
		t.Error(err)
	}
	if ws := pu.warnings(); len(ws) != 1 || !strings.Contains(ws[0], "numeric uids") {
		t.Errorf("warnings without etc/passwd: %v", ws)
	}
	demo = true
	if ws := pu.warnings(); len(ws) != 0 {
		t.Errorf("warnings on the demo: %v", ws)
	}
	demo = false
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ws := pu.warnings(); len(ws) != 0 {
		t.Errorf("warnings with etc/passwd: %v", ws)
	}
}
