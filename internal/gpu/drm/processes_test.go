package drm

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu/drm/drmfake"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
)

// The scanner keeps what it found from one reading to the next (processes.go): these tests move the clock and the
// files under it, as processes open, close and reuse fds and exit, and check that what it keeps never outlives what
// it describes.

func snapshot(t *testing.T, s *Source) *gpu.Snapshot {
	t.Helper()
	snap, err := s.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// drmFD is the fd of a process's first DRM file, as the scanner found it.
func drmFD(t *testing.T, s *Source, pid uint32) int {
	t.Helper()
	p := s.scan.procs[pid]
	if p == nil || len(p.drm) == 0 {
		t.Fatalf("PID %d: no DRM file found", pid)
	}
	return p.drm[0].FD
}

func listed(snap *gpu.Snapshot, pid uint32) (gpu.Process, int, bool) {
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if p.PID == pid {
				return p, d.Index, true
			}
		}
	}
	return gpu.Process{}, 0, false
}

// A process seen without a DRM file that opens one later is found at its next full look, within fullLookEvery;
// until then it is not listed (the documented cost of not listing every fd of every process at every reading).
func TestDRMFileOpenedLater(t *testing.T) {
	mi := drmfake.NewMI300X()
	node := mi.Node(false)
	const pid = 7000
	node.Processes = append(node.Processes, drmfake.Process{PID: pid, Other: 1})
	_, sysfs, procfs := writeNode(t, node)
	c := newClock()
	s := openSource(t, sysfs, procfs, c)
	if _, _, ok := listed(snapshot(t, s), pid); ok {
		t.Fatal("a process with no DRM file listed")
	}

	// It opens GPU 0's render node, the one PID 4101 holds, as fd 1.
	g := mi.GPUs[0]
	target, err := os.Readlink(filepath.Join(procfs, "4101", "fd", strconv.Itoa(drmFD(t, s, 4101))))
	if err != nil {
		t.Fatal(err)
	}
	pdir := filepath.Join(procfs, strconv.Itoa(pid))
	if err := os.Symlink(target, filepath.Join(pdir, "fd", "1")); err != nil {
		t.Fatal(err)
	}
	info := drmfake.AMDGPUClient{PDev: g.PCI, ID: 9000, VRAM: 3 << 30}.FDInfo()
	if err := os.WriteFile(filepath.Join(pdir, "fdinfo", "1"), []byte(info), 0o644); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Second)
	if _, _, ok := listed(snapshot(t, s), pid); ok {
		t.Log("found before its next full look") // not an error: its look may fall due at once
	}
	c.t = c.t.Add(fullLookEvery)
	p, dev, ok := listed(snapshot(t, s), pid)
	if !ok || dev != 0 {
		t.Fatalf("the DRM file opened later not found within %v (listed %v, on GPU %d)", fullLookEvery, ok, dev)
	}
	value(t, "its memory", p.UsedMemoryBytes, 3<<30)
}

// A known DRM file's number reused for a file that is no DRM client's is forgotten at the next reading, not read
// as the client it was; the process is looked at in full again.
func TestReusedFDForgotten(t *testing.T) {
	mi := drmfake.NewMI300X()
	_, sysfs, procfs := writeNode(t, mi.Node(false))
	c := newClock()
	s := openSource(t, sysfs, procfs, c)
	const pid = 4401 // ffmpeg, a DRM client without KFD
	if _, _, ok := listed(snapshot(t, s), pid); !ok {
		t.Fatal("not listed at first")
	}
	kept := s.scan.kept

	// It closes its DRM file and opens /dev/null under the same number: the kernel's fdinfo/<fd> now shows that
	// file's fields (a kept fdinfo file shows whatever the fd is at each read).
	fd := strconv.Itoa(drmFD(t, s, pid))
	pdir := filepath.Join(procfs, strconv.Itoa(pid))
	if err := os.Remove(filepath.Join(pdir, "fd", fd)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", filepath.Join(pdir, "fd", fd)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pdir, "fdinfo", fd), []byte("pos:\t0\nflags:\t02\nmnt_id:\t5\nino:\t4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Second)
	snap := snapshot(t, s)
	if p, _, ok := listed(snap, pid); ok {
		t.Errorf("a reused fd read as the DRM client it was: %+v", p)
	}
	if s.scan.kept != kept-1 {
		t.Errorf("%d fdinfo files kept, want %d: the reused fd's not closed", s.scan.kept, kept-1)
	}
	if _, ok := s.scan.procs[pid]; ok {
		t.Error("a process with no DRM file left still remembered")
	}
	// The next reading looks at it in full, and finds nothing.
	c.t = c.t.Add(time.Second)
	snapshot(t, s)
	if p, ok := s.scan.procs[pid]; !ok || len(p.drm) != 0 {
		t.Errorf("after its full look: %+v, %v", p, ok)
	}
}

// A process that exits is forgotten with its kept files, its KFD files too; a new compute process under a new PID
// is read at once; Close closes every file kept.
func TestExitedProcessForgotten(t *testing.T) {
	mi := drmfake.NewMI300X()
	_, sysfs, procfs := writeNode(t, mi.Node(false))
	c := newClock()
	s := openSource(t, sysfs, procfs, c)
	const pid = 4201 // vllm on GPU 4, a KFD process
	snapshot(t, s)
	p := s.scan.procs[pid]
	if p == nil || len(p.drm) != 1 || p.drm[0].info == nil {
		t.Fatalf("PID %d's DRM file not kept: %+v", pid, p)
	}
	kfdDir := filepath.Join(sysfs, "class", "kfd", "kfd", "proc")
	vram := filepath.Join(kfdDir, strconv.Itoa(pid), "vram_"+strconv.FormatUint(mi.GPUs[4].KFDGPUID, 10))
	if k := s.kfd.procs[pid]; k == nil || len(k.vram) != 1 || k.vram[0].path != vram || k.vram[0].fd < 0 {
		t.Fatalf("PID %d's KFD file %s not kept open: %+v", pid, vram, k)
	}
	kept, kfdKept := s.scan.kept, s.kfd.kept

	// It exits; a new compute process starts on GPU 5.
	if err := os.RemoveAll(filepath.Join(procfs, strconv.Itoa(pid))); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(kfdDir, strconv.Itoa(pid))); err != nil {
		t.Fatal(err)
	}
	const newPID = 4301
	id := strconv.FormatUint(mi.GPUs[5].KFDGPUID, 10)
	if err := os.MkdirAll(filepath.Join(kfdDir, strconv.Itoa(newPID)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kfdDir, strconv.Itoa(newPID), "vram_"+id), []byte("4294967296\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Second)
	snap := snapshot(t, s)
	if _, _, ok := listed(snap, pid); ok {
		t.Error("an exited process listed")
	}
	if _, ok := s.scan.procs[pid]; ok || s.scan.kept != kept-1 {
		t.Errorf("exited process remembered (%v) or its fdinfo not closed (%d kept, want %d)", ok, s.scan.kept, kept-1)
	}
	if _, ok := s.kfd.procs[pid]; ok || s.kfd.kept != kfdKept {
		// The new process's file is kept in place of the exited one's.
		t.Errorf("exited process's KFD files remembered (%v) or not closed (%d kept, want %d)", ok, s.kfd.kept, kfdKept)
	}
	got, dev, ok := listed(snap, newPID)
	if !ok || dev != 5 {
		t.Fatalf("the new compute process not read at once (listed %v, GPU %d)", ok, dev)
	}
	value(t, "its memory", got.UsedMemoryBytes, 4<<30)
	// Its file, kept open, is read again at each reading, its directory not listed again while every file of it is.
	k := s.kfd.procs[newPID]
	if k == nil || len(k.vram) != 1 || k.vram[0].fd < 0 {
		t.Fatalf("PID %d's KFD file not kept open: %+v", newPID, k)
	}
	listedAt := k.listed
	vramFile := filepath.Join(kfdDir, strconv.Itoa(newPID), "vram_"+id)
	if err := os.WriteFile(vramFile, []byte("8589934592\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(2 * fullLookEvery)
	got, _, _ = listed(snapshot(t, s), newPID)
	value(t, "its memory, grown", got.UsedMemoryBytes, 8<<30)
	if k := s.kfd.procs[newPID]; k == nil || !k.listed.Equal(listedAt) || s.kfd.kept != kfdKept {
		t.Errorf("a process whose KFD files are all kept listed again (%+v), or %d files kept, want %d", k, s.kfd.kept, kfdKept)
	}
	// A file that fails to read (here, with what is not a number) drops the process's files, which are listed and
	// opened again at the next reading.
	if err := os.WriteFile(vramFile, []byte("busy\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Second)
	if p, _, ok := listed(snapshot(t, s), newPID); ok {
		t.Errorf("a compute process whose only file failed to read listed: %+v", p)
	}
	if _, ok := s.kfd.procs[newPID]; ok || s.kfd.kept != kfdKept-1 {
		t.Errorf("after a failed read: remembered %v, %d files kept, want %d", ok, s.kfd.kept, kfdKept-1)
	}
	if err := os.WriteFile(vramFile, []byte("1073741824\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Second)
	got, _, _ = listed(snapshot(t, s), newPID)
	value(t, "its memory, listed again", got.UsedMemoryBytes, 1<<30)
	if k := s.kfd.procs[newPID]; k == nil || !k.listed.Equal(c.t) || s.kfd.kept != kfdKept {
		t.Errorf("not listed and kept again: %+v, %d files kept, want %d", k, s.kfd.kept, kfdKept)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s.scan.kept != 0 || len(s.scan.procs) != 0 || len(s.files.kept) != 0 || s.kfd.kept != 0 || len(s.kfd.procs) != 0 {
		t.Errorf("after Close: %d fdinfo files, %d processes, %d attribute files, %d KFD files of %d processes kept",
			s.scan.kept, len(s.scan.procs), len(s.files.kept), s.kfd.kept, len(s.kfd.procs))
	}
}

// A file a driver does not publish is not looked for again at every reading; it is after fullLookEvery.
func TestAbsentAttributeLookedForAgain(t *testing.T) {
	mi := drmfake.NewMI300X()
	_, sysfs, procfs := writeNode(t, mi.Node(false))
	c := newClock()
	s := openSource(t, sysfs, procfs, c)
	absentValue(t, "fan speed (an MI300X has no fan)", snapshot(t, s).Devices[0].FanSpeedRatio)
	hwmon, err := filepath.Glob(filepath.Join(sysfs, "class", "drm", "card1", "device", "hwmon", "hwmon*"))
	if err != nil || len(hwmon) != 1 {
		t.Fatalf("GPU 0's hwmon: %v, %v", hwmon, err)
	}
	if err := os.WriteFile(filepath.Join(hwmon[0], "pwm1"), []byte("102\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Second)
	absentValue(t, "fan speed a second later", snapshot(t, s).Devices[0].FanSpeedRatio)
	c.t = c.t.Add(fullLookEvery)
	value(t, "fan speed after a minute", snapshot(t, s).Devices[0].FanSpeedRatio, 0.4)
}

// An attribute file read at a reading stays open for the next one; one not read at a reading is closed at the start
// of the next.
func TestAttributeFilesKept(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, p := range []string{a, b} {
		if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f := files{budget: procfs.NewKeptFiles(2)}
	defer f.closeAll()
	c := newClock()
	f.reading(c.now())
	for _, p := range []string{a, b} {
		if n, err := f.uint(p); err != nil || n != 1 {
			t.Fatalf("%s: %d, %v", p, n, err)
		}
	}
	if len(f.kept) != 2 {
		t.Fatalf("%d files kept, want 2", len(f.kept))
	}
	if err := os.WriteFile(a, []byte("22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.reading(c.now())
	if n, err := f.uint(a); err != nil || n != 22 {
		t.Fatalf("a read again: %d, %v; want 22", n, err)
	}
	f.reading(c.now())
	if _, ok := f.kept[b]; ok || len(f.kept) != 1 {
		t.Errorf("b, not read at the last reading, still open (%d files kept)", len(f.kept))
	}
}
