package procfs

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// An open stat or comm file reads its process again and again, and fails once that process has exited and been
// reaped: a PID that the kernel gives to another process cannot be read through it.
func TestKeptFilesAreTiedToTheirProcess(t *testing.T) {
	if ok, err := IsProcFS("/proc"); err != nil || !ok {
		t.Skip("no procfs at /proc")
	}
	r := NewReader("/proc")
	for _, tc := range []struct {
		file string
		open func(uint32) (*KeptFile, error)
		read func(*KeptFile) (string, error)
	}{
		{"stat", r.OpenStat, func(f *KeptFile) (string, error) {
			comm, start, err := r.ReadStat(f)
			return fmt.Sprint(comm, " ", start), err
		}},
		{"comm", r.OpenComm, r.ReadComm},
	} {
		t.Run(tc.file, func(t *testing.T) {
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Skip("cannot start sleep:", err)
			}
			f, err := tc.open(uint32(cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var first string
			for range 3 {
				got, err := tc.read(f)
				if err != nil || strings.Fields(got)[0] != "sleep" || first != "" && got != first {
					t.Fatalf("read %q, %v; first %q", got, err, first)
				}
				first = got
			}
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if _, err := tc.read(f); !Exited(err) {
				t.Errorf("after the process was reaped: %v, want an exited error", err)
			}
		})
	}
}
