package procfs

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// Stat reads <procfs>/<pid>/stat for the process name and the process's start time (clock ticks after boot). A
// PID and its start time name one process for its whole life: a PID that the kernel gives to a new process comes
// with another start time. The name is comm's, read in the same system call.
func (r *Reader) Stat(pid uint32) (comm string, start uint64, err error) {
	b, err := r.read(pid, "stat")
	if err != nil {
		return "", 0, fmt.Errorf("reading process status: %w", err)
	}
	return statFields(b, r.root+"/"+strconv.FormatUint(uint64(pid), 10)+"/stat")
}

func statFields(b []byte, path string) (string, uint64, error) {
	comm, start, ok := parseStat(b)
	if !ok {
		return "", 0, fmt.Errorf("reading process status: %s is not a stat file", path)
	}
	return comm, start, nil
}

// parseStat returns the name (field 2) and start time (field 22) of a stat line. The name is in parentheses and
// may itself hold spaces and parentheses, so the fields after it are counted from its last ')'.
func parseStat(b []byte) (comm string, start uint64, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	rest := b[end+1:]
	// rest is " S ppid ...": field 3 (state) is the first; starttime is field 22, the 20th.
	for field := 3; field < 22; field++ {
		rest = bytes.TrimLeft(rest, " ")
		i := bytes.IndexByte(rest, ' ')
		if i < 0 {
			return "", 0, false
		}
		rest = rest[i:]
	}
	rest = bytes.TrimLeft(rest, " ")
	if i := bytes.IndexAny(rest, " \n"); i >= 0 {
		rest = rest[:i]
	}
	start, err := strconv.ParseUint(string(rest), 10, 64)
	if err != nil {
		return "", 0, false
	}
	return string(b[open+1 : end]), start, true
}

// Usage is what a process's stat says of it for a person looking at it (top's detail): its start time (clock ticks
// after boot), which with the PID names the process, the CPU time it has used (user and system, in clock ticks) and
// its resident set (in pages).
type Usage struct{ Start, CPUTicks, RSSPages uint64 }

// Usage reads <procfs>/<pid>/stat for the process's Usage, all of it from one read: the CPU time and resident set
// are those of the process whose start time comes with them, not of another that the PID was given to meanwhile.
func (r *Reader) Usage(pid uint32) (Usage, error) {
	b, err := r.read(pid, "stat")
	if err != nil {
		return Usage{}, fmt.Errorf("reading process status: %w", err)
	}
	f, ok := statAfterComm(b, 24)
	if !ok {
		return Usage{}, fmt.Errorf("reading process status: %s/%d/stat is not a stat file", r.root, pid)
	}
	utime, err1 := strconv.ParseUint(f[14-3], 10, 64)
	stime, err2 := strconv.ParseUint(f[15-3], 10, 64)
	start, err3 := strconv.ParseUint(f[22-3], 10, 64)
	rss, err4 := strconv.ParseInt(f[24-3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return Usage{}, fmt.Errorf("reading process status: %s/%d/stat is not a stat file", r.root, pid)
	}
	return Usage{Start: start, CPUTicks: utime + stime, RSSPages: uint64(max(rss, 0))}, nil
}

// statAfterComm returns fields 3 to last of a stat line, counted from the last ')' of the name (field 2).
func statAfterComm(b []byte, last int) ([]string, bool) {
	end := bytes.LastIndexByte(b, ')')
	if bytes.IndexByte(b, '(') < 0 || end < 0 {
		return nil, false
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < last-2 {
		return nil, false
	}
	return f[:last-2], true
}
