package nvidiasmi

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/reading"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/testkit"
)

type noAttribution struct{}

func (noAttribution) Attribute(context.Context, *gpu.Snapshot) map[uint32]attribution.Owner {
	return nil
}

// A hung nvidia-smi, read with a collection timeout below its own: every scrape gives up, then every run is killed
// at nvidia-smi's timeout. That is one problem, logged once, however many scrapes it lasts, and once more when it
// ends.
func TestSourceHungIsLoggedOnce(t *testing.T) {
	const runs = 8
	fixture, err := filepath.Abs("testdata/telegraf__tesla-t4.xml")
	if err != nil {
		t.Fatal(err)
	}
	unstall := filepath.Join(t.TempDir(), "unstall")
	runlog, _ := fake(t, "stall", "FAKESMI_FILE="+fixture, "FAKESMI_WAITFILE="+unstall)
	logs := &testkit.Logs{}
	s := newSource(t, Config{Timeout: 300 * time.Millisecond, Logger: slog.New(logs)})
	r := reading.New(s, noAttribution{}, 50*time.Millisecond, slog.New(logs))

	// Scrapes come as Prometheus's do: each gives up at the collection timeout, and those that come while a run
	// is still on join it; each run ends at nvidia-smi's timeout.
	scrapes := 0
	for len(lines(t, runlog)) < runs {
		scrapes++
		if _, err := r.Read(t.Context()); err == nil {
			t.Fatal("a scrape of a hung nvidia-smi got a reading")
		}
	}
	// nvidia-smi answers again: the first scrape that gets a reading is the recovery.
	if err := os.WriteFile(unstall, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "a scrape to get a reading", func() bool {
		scrapes++
		_, err := r.Read(t.Context())
		return err == nil
	})
	errs, infos := logs.Messages(slog.LevelError), logs.Messages(slog.LevelInfo)
	t.Logf("%d scrapes, %d runs of a hung nvidia-smi and a recovery: %d errors, %d infos logged", scrapes,
		len(lines(t, runlog)), len(errs), len(infos))
	if len(errs) != 1 || !strings.Contains(errs[0], "collection timeout") {
		t.Errorf("errors logged: %q, want one that says the collection timed out", errs)
	}
	if len(infos) != 1 || infos[0] != "GPU source recovered" {
		t.Errorf("infos logged: %q, want the recovery", infos)
	}
}

// A run that leaves a helper holding nvidia-smi's output costs that helper its life at every run, and one warning
// when it starts, not one per run; runs that stop leaving them are logged once.
func TestSourceLeftoverHelpersAreLoggedOnce(t *testing.T) {
	const runs = 4
	fixture, err := filepath.Abs("testdata/telegraf__tesla-t4.xml")
	if err != nil {
		t.Fatal(err)
	}
	_, pidfile := fake(t, "orphan", "FAKESMI_FILE="+fixture)
	logs := &testkit.Logs{}
	s := newSource(t, Config{Timeout: 20 * time.Second, Logger: slog.New(logs)})
	for range runs {
		if _, err := s.Snapshot(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	waitGone(t, pidfile)
	if n := len(lines(t, pidfile)); n != 2*runs {
		t.Fatalf("the fake recorded %d PIDs, want %d runs and their helpers", n, runs)
	}
	t.Setenv("FAKESMI_MODE", "file")
	for range 2 {
		if _, err := s.Snapshot(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	warns, infos := logs.Messages(slog.LevelWarn), logs.Messages(slog.LevelInfo)
	t.Logf("%d runs that left a helper, 2 that did not: %d warnings, %d infos logged", runs, len(warns), len(infos))
	if len(warns) != 1 || !strings.HasPrefix(warns[0], "killed processes that nvidia-smi left") {
		t.Errorf("warnings logged: %q, want one", warns)
	}
	if len(infos) != 1 || !strings.Contains(infos[0], "no longer") {
		t.Errorf("infos logged: %q, want that runs stopped leaving helpers", infos)
	}
}

// What nvidia-smi says on stderr at every run (a GPU it cannot open) is logged when it changes.
func TestSourceStderrIsLoggedWhenItChanges(t *testing.T) {
	fixture, err := filepath.Abs("testdata/telegraf__tesla-t4.xml")
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.Logs{}
	fake(t, "file", "FAKESMI_FILE="+fixture)
	s := newSource(t, Config{Timeout: 20 * time.Second, Logger: slog.New(logs)})
	for _, stderr := range []string{"", "Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error",
		"Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error", "", "",
		"Unable to determine the device handle for GPU 0000:86:00.0: GPU is lost",
		"Unable to determine the device handle for GPU 0000:86:00.0: GPU is lost"} {
		t.Setenv("FAKESMI_STDERR", stderr)
		if _, err := s.Snapshot(t.Context()); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
	if n := logs.Count(slog.LevelWarn); n != 2 {
		t.Errorf("%d warnings over 7 runs with 2 changes of what stderr said, want 2: %q", n, logs.Messages(slog.LevelWarn))
	}
}
