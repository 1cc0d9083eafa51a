package top

import (
	"fmt"
	"time"

	"github.com/charmbracelet/x/ansi"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/attribution"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/terminal"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/view"
)

// Detail is one process looked at: its rows on every GPU it uses, who owns it, and what its node's /proc says.
type Detail struct {
	// GPUs are the process's rows, one per GPU it uses.
	GPUs []view.Process
	// Host is what /proc says of it; nil when it runs on another machine (a cluster's process).
	Host *view.Host
	// Workload, for a grouped row: its processes and GPUs, summed.
	Workload *Row
	At       time.Time
}

func (d Detail) escaped() Detail {
	out := d
	out.GPUs = make([]view.Process, len(d.GPUs))
	for i, p := range d.GPUs {
		p.Name, p.Node, p.Type = terminal.Escape(p.Name), terminal.Escape(p.Node), terminal.Escape(p.Type)
		id := p.Identity
		for _, l := range attribution.IdentityLabels {
			v := l.Get(&id)
			*v = terminal.Escape(*v)
		}
		id.PodLabels = nil
		p.Identity = id
		out.GPUs[i] = p
	}
	if d.Host != nil {
		h := *d.Host
		h.Cgroup, h.Err = terminal.Escape(h.Cgroup), terminal.Escape(h.Err)
		out.Host = &h
	}
	return out
}

// detailLines draw a process looked at, in place of the reading: the full identity, the process's name, age and
// type, its memory and SM on each GPU, its host CPU and memory, and the commands that look further.
func detailLines(f Frame, st Styles) []string {
	d := f.Detail
	w := width(f)
	if len(d.GPUs) == 0 {
		return []string{st.Title.Render("gpu-pod-exporter top: the process has left"), "", st.Dim.Render("Esc goes back")}
	}
	p := &d.GPUs[0]
	id := &p.Identity
	title := fmt.Sprintf("gpu-pod-exporter top: process %d", p.PID)
	if p.Node != "" {
		title += " on " + p.Node
	}
	lines := []string{st.Title.Render(ansi.Truncate(title, w, "…")), ""}
	field := func(name, value string) {
		if value == "" {
			return
		}
		lines = append(lines, ansi.Truncate(fmt.Sprintf("  %s %s", st.Key.Render(fit(name, 12, false)), value), w, "…"))
	}
	if d.Workload != nil {
		r := d.Workload
		field("workload", r.Owner.String())
		field("processes", fmt.Sprintf("%s on GPU %s, memory %s, ΣSM %s", r.PID, r.GPU, r.Memory, r.SM))
	}
	field("process", fmt.Sprintf("%s (%s), PID %d", dash(p.Name), dash(p.Type), p.PID))
	field("running", view.AgeAt(p.Started, d.At))
	field("user", id.User)
	for _, g := range d.GPUs {
		field("GPU "+g.GPUColumn(), fmt.Sprintf("memory %s, SM %s  %s", view.Memory(g.Memory), view.Percent(g.SM), g.UUID))
	}
	switch h := d.Host; {
	case h != nil && h.Exited:
		field("host", "process exited")
	case h != nil && h.Err != "" && !h.RSS.Valid:
		field("host", h.Err)
	case h != nil:
		host := "CPU " + view.Age(h.CPU) + ", resident memory " + view.Memory(h.RSS)
		if h.Err != "" {
			host += " (" + h.Err + ")"
		}
		field("host", host)
	case p.Node != "":
		field("host", "not read here: /proc is "+p.Node+"'s")
	}
	field("owner", p.Owner().String())
	field("namespace", id.Namespace)
	field("pod", id.Pod)
	field("container", id.Container)
	field("pod uid", id.PodUID)
	field("container id", id.ContainerID)
	field("runtime", id.Runtime)
	field("qos", id.QoS)
	field("slurm job", id.SlurmJobID)
	field("unit", id.SystemdUnit)
	if d.Host != nil {
		field("cgroup", d.Host.Cgroup)
	}
	if cmds := view.Commands(p); len(cmds) > 0 {
		lines = append(lines, "", st.Dim.Render("  to look further:"))
		for _, c := range cmds {
			lines = append(lines, "  "+terminal.Escape(c))
		}
	}
	return lines
}
