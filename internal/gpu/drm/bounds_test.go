package drm

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
)

// The files a driver does not publish are remembered for a minute, then forgotten, whether or not they are looked
// for again: those of a GPU unbound since, or of a compute process that exited, are not remembered for ever.
func TestAbsentFilesForgotten(t *testing.T) {
	_, sysfs, procFS := writeNode(t, drmfake.NewMI300X().Node(false))
	clk := newClock()
	s, err := New(Config{SysFS: sysfs, ProcFS: procFS, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	card := filepath.Join(sysfs, "class", "drm", "card8")
	absentUnder := func() (n int) {
		for path := range s.files.absent {
			if strings.HasPrefix(path, card+"/") {
				n++
			}
		}
		return n
	}
	snapshot(t, s)
	if absentUnder() == 0 {
		t.Fatalf("no absent file of GPU 7 remembered (an MI300X has no fan): %v", s.files.absent)
	}
	// GPU 7 unbound from its driver: its DRM entries are gone.
	for _, name := range []string{"card8", "renderD135"} {
		if err := os.Remove(filepath.Join(sysfs, "class", "drm", name)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		clk.t = clk.t.Add(40 * time.Second)
		if got := len(snapshot(t, s).Devices); got != 7 {
			t.Fatalf("%d GPUs after GPU 7 was unbound, want 7", got)
		}
	}
	if n := absentUnder(); n != 0 {
		t.Errorf("%d absent files of the unbound GPU 7 still remembered two minutes later", n)
	}
	for path, at := range s.files.absent {
		if clk.t.Sub(at) >= fullLookEvery {
			t.Errorf("%s remembered as absent since %v, over a minute ago", path, clk.t.Sub(at))
		}
	}
}

// However many files are missing, at most maxAbsent are remembered; those past it are looked for at each reading,
// and read as missing all the same.
func TestAbsentFilesBounded(t *testing.T) {
	dir := t.TempDir()
	var f files
	f.reading(newClock().t)
	for i := range maxAbsent + 10 {
		if _, err := f.read(filepath.Join(dir, strconv.Itoa(i))); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("file %d: %v, want not found", i, err)
		}
	}
	if len(f.absent) != maxAbsent {
		t.Errorf("%d absent files remembered, want %d", len(f.absent), maxAbsent)
	}
}

// A directory with more entries than a reading reads is said: an error at each reading, under the operation whose
// values it leaves out, and a warning logged once; the process lists it leaves incomplete are said so.
func TestTruncationsSurfaced(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bounds func(*bounds)
		dir    string
		op     gpu.Operation
		gpus   int
	}{
		{"cards", func(b *bounds) { b.cards = 4 }, "class/drm", gpu.OpDevice, -1},
		{"KFD nodes", func(b *bounds) { b.kfdNodes = 2 }, "class/kfd/kfd/topology/nodes", gpu.OpProcesses, 8},
		{"KFD processes", func(b *bounds) { b.kfdProcesses = 2 }, "class/kfd/kfd/proc", gpu.OpProcesses, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, sysfs, procFS := writeNode(t, drmfake.NewMI300X().Node(false))
			var log bytes.Buffer
			clk := newClock()
			s, err := New(Config{SysFS: sysfs, ProcFS: procFS, Now: clk.now, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			tc.bounds(&s.bounds)
			dir := filepath.Join(sysfs, tc.dir)
			for reading := range 2 {
				clk.t = clk.t.Add(time.Second)
				snap := snapshot(t, s)
				var found bool
				for _, e := range snap.Errors {
					var tr *truncation
					found = found || e.Operation == tc.op && errors.As(e.Err, &tr) && tr.dir == dir
				}
				if !found {
					t.Errorf("reading %d: no %s error saying %s was cut: %v", reading, tc.op, dir, snap.Errors)
				}
				if tc.gpus >= 0 && len(snap.Devices) != tc.gpus {
					t.Errorf("reading %d: %d GPUs, want %d", reading, len(snap.Devices), tc.gpus)
				}
				for _, d := range snap.Devices {
					if tc.op == gpu.OpProcesses && d.ProcessesListed {
						t.Errorf("reading %d: GPU %d's process list complete", reading, d.Index)
					}
				}
			}
			if n := strings.Count(log.String(), "level=WARN"); n != 1 || !strings.Contains(log.String(), dir) {
				t.Errorf("want one warning naming %s over two readings, got %d:\n%s", dir, n, log.String())
			}
		})
	}
}
