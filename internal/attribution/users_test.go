package attribution

import (
	"errors"
	"testing"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

type fakeUsers map[uint32]string

func (u fakeUsers) User(pid uint32) (string, error) {
	if name, ok := u[pid]; ok {
		return name, nil
	}
	return "", errors.New("no such process")
}

// With a UserResolver, processes read from procfs get their owner's user, preset owners keep theirs; without one,
// no process has a user, so that workloads are not split by a label that is not exported.
func TestAttributeUsers(t *testing.T) {
	p := newProcFS(t)
	p.writeProc(1, "lmp", "0::/system.slice/slurmstepd.scope/job_211/step_0/user/task_0\n")
	p.writeProc(2, "gone", "0::/system.slice/ollama.service\n")
	snap := snapshot(1, 2)
	snap.Devices[0].Processes = append(snap.Devices[0].Processes, gpu.Process{PID: 3, Name: "demo", Type: gpu.ProcessCompute})
	preset := presetOwners{3: {SlurmJobID: "7", User: "carol"}}

	owners := newAttributor(t, Config{ProcFS: p.root, Preset: preset, Users: fakeUsers{1: "alice"}}).Attribute(t.Context(), snap)
	for pid, want := range map[uint32]string{1: "alice", 2: "", 3: "carol"} {
		if got := owners[pid].Identity.User; got != want {
			t.Errorf("with users, pid %d: user %q, want %q", pid, got, want)
		}
	}
	if owners[1].Identity.SlurmJobID != "211" {
		t.Errorf("pid 1: %+v", owners[1])
	}

	owners = newAttributor(t, Config{ProcFS: p.root, Preset: preset}).Attribute(t.Context(), snap)
	for pid := range uint32(3) {
		if got := owners[pid+1].Identity.User; got != "" {
			t.Errorf("without users, pid %d: user %q", pid+1, got)
		}
	}
}
