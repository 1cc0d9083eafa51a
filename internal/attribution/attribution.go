// Package attribution finds who owns each GPU process: it reads the process's name and cgroup from procfs, derives
// pod, container, Slurm job and systemd unit from the cgroup path, and asks the container runtimes for names.
package attribution

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/identity"
)

// Owner is what attribution learned about one PID.
type Owner struct {
	// Name is the process name: /proc/<pid>/comm, else what the GPU source called it.
	Name     string
	Identity identity.Identity
}

// Config configures an Attributor.
type Config struct {
	ProcFS string // the host's proc filesystem, usually /proc
	Logger *slog.Logger
}

// Attributor labels GPU processes with their owners.
type Attributor struct {
	procfs string
	logger *slog.Logger
}

// New returns an Attributor.
func New(cfg Config) *Attributor {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Attributor{procfs: cfg.ProcFS, logger: cfg.Logger}
}

// Attribute returns the owner of every process in the snapshot, keyed by PID. It never fails: what cannot be
// learned is left empty.
func (a *Attributor) Attribute(ctx context.Context, snap *gpu.Snapshot) map[uint32]Owner {
	owners := make(map[uint32]Owner)
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if _, done := owners[p.PID]; done {
				continue
			}
			if p.Identity != nil {
				owners[p.PID] = Owner{Name: p.Name, Identity: *p.Identity}
				continue
			}
			owners[p.PID] = a.owner(p)
		}
	}
	return owners
}

func (a *Attributor) owner(p gpu.Process) Owner {
	o := Owner{Name: p.Name}
	if comm, err := readComm(a.procfs, p.PID); err == nil && comm != "" {
		o.Name = comm
	}
	return o
}

// readComm reads /proc/<pid>/comm. A PID that has exited returns an error the caller ignores: its GPU series are
// still written, with an empty identity.
func readComm(procfs string, pid uint32) (string, error) {
	b, err := os.ReadFile(filepath.Join(procfs, strconv.FormatUint(uint64(pid), 10), "comm"))
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\n"), nil
}
