package view

import (
	"strings"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/gpu"
)

// Host is what the process's node says of it in /proc: its CPU time, resident memory and cgroup. Its command line
// and environment are never read: they hold secrets.
type Host struct {
	CPU    time.Duration // user and system time since it started
	RSS    gpu.Value     // bytes
	Cgroup string
	// Err is why some of it could not be read.
	Err string
	// Exited is set when the process has exited: its PID is gone, or now another process's (another start time),
	// whose numbers are not shown as the process's.
	Exited bool
}

// Commands are the lines a person copies to look further at a process's owner: the pod's kubectl describe and
// logs, a Slurm job's scontrol, a service's systemctl and journalctl. Each word a shell would read otherwise is
// quoted, and the names come after "--", so that a name that starts with "-" (a unit a user named --host=x.service)
// is a name to the command, not an option. An option's value is safe where it is: kubectl, journalctl and the
// runtimes' command lines take the next word as the value of -n, -c and -u whatever it starts with.
func Commands(p *Process) []string {
	id := &p.Identity
	switch {
	case id.Pod != "" && id.Namespace != "":
		ns, pod := shellWord(id.Namespace), shellWord(id.Pod)
		logs := "kubectl -n " + ns + " logs"
		if id.Container != "" {
			logs += " -c " + shellWord(id.Container)
		}
		return []string{"kubectl -n " + ns + " describe pod -- " + pod, logs + " -- " + pod}
	case id.SlurmJobID != "":
		return []string{"scontrol show job -- " + shellWord(id.SlurmJobID)}
	case id.SystemdUnit != "":
		unit := shellWord(id.SystemdUnit)
		return []string{"systemctl status -- " + unit, "journalctl -u " + unit}
	case id.Container != "" && (id.Runtime == "docker" || id.Runtime == "podman"):
		name := shellWord(id.Container)
		return []string{id.Runtime + " inspect -- " + name, id.Runtime + " logs -- " + name}
	case id.ContainerID != "" && id.Runtime != "":
		cli := map[string]string{"containerd": "crictl", "crio": "crictl", "docker": "docker", "podman": "podman"}[id.Runtime]
		if cli != "" {
			return []string{cli + " inspect -- " + shellWord(id.ContainerID)}
		}
	}
	return nil
}

// shellWord is s as one word of a POSIX shell: as it is when it holds only characters no shell reads, else in
// single quotes.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/:@=+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
