// Package users names the owners of processes (--collector.process-user): the real uid from procfs, and its name
// from the node's user database, /etc/passwd under the configured root, read as a file so that it is the node's
// and not the exporter's container's, and without cgo.
//
// Only passwd files are read: users that only a directory service knows (LDAP, SSSD, NIS through NSS) keep their
// numeric uid. A user name can be personal data; that is why the flag is off by default.
package users

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/configfile"
	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/procfs"
)

// Bounds: a passwd file larger than maxPasswd is read no further, and no more than maxUsers names are kept.
const (
	maxPasswd = 64 << 20
	maxUsers  = 1 << 17
	// refresh is how often the passwd file is checked for changes (its modification time and size).
	refresh = time.Minute
)

// Resolver names process owners. It is safe for concurrent use.
type Resolver struct {
	passwd string
	now    func() time.Time

	mu      sync.Mutex
	proc    *procfs.Reader // the hardened reader of process files: no symlink, FIFO or oversized file
	names   map[uint32]string
	checked time.Time // when the passwd file was last checked
	modTime time.Time
	size    int64
	loadErr error
}

// New returns a Resolver that reads <procfs>/<pid>/status and passwd (the node's /etc/passwd).
func New(procfsRoot, passwd string) *Resolver {
	return &Resolver{proc: procfs.NewReader(procfsRoot), passwd: passwd, now: time.Now}
}

// User returns the name of the process's owner (its real uid), or the uid in decimal when the user database does
// not name it. It fails when the process's status cannot be read (the process has exited).
func (r *Resolver) User(pid uint32) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	uid, err := r.uid(pid)
	if err != nil {
		return "", err
	}
	if r.now().Sub(r.checked) >= refresh || r.checked.IsZero() {
		r.reload()
	}
	if name, ok := r.names[uid]; ok {
		return name, nil
	}
	return strconv.FormatUint(uint64(uid), 10), nil
}

// Err returns why the user database could not be read, if it could not: every user is then a number.
func (r *Resolver) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loadErr
}

func (r *Resolver) uid(pid uint32) (uint32, error) {
	status, err := r.proc.Status(pid)
	if err != nil {
		return 0, fmt.Errorf("reading the process owner: %w", err)
	}
	uid, ok := ParseStatusUID(status)
	if !ok {
		return 0, fmt.Errorf("reading the process owner: the status of process %d has no Uid line", pid)
	}
	return uid, nil
}

// reload re-reads the passwd file when it changed. A file that cannot be read leaves the names it had.
func (r *Resolver) reload() {
	r.checked = r.now()
	fi, err := os.Stat(r.passwd)
	if err != nil {
		r.loadErr = fmt.Errorf("reading the user database: %w", err)
		return
	}
	if r.names != nil && fi.ModTime().Equal(r.modTime) && fi.Size() == r.size {
		return
	}
	// A regular file only, of any size (it is read no further than maxPasswd): a FIFO would block the lookup.
	f, err := configfile.Open(r.passwd, math.MaxInt64)
	if err != nil {
		r.loadErr = fmt.Errorf("reading the user database: %w", err)
		return
	}
	defer f.Close()
	r.names = ParsePasswd(io.LimitReader(f, maxPasswd))
	r.modTime, r.size, r.loadErr = fi.ModTime(), fi.Size(), nil
}

// ParseStatusUID returns the real uid from the contents of /proc/<pid>/status ("Uid:\treal\teffective\tsaved\tfs").
func ParseStatusUID(status []byte) (uint32, bool) {
	for len(status) > 0 {
		line := status
		if i := bytes.IndexByte(status, '\n'); i >= 0 {
			line, status = status[:i], status[i+1:]
		} else {
			status = nil
		}
		rest, ok := bytes.CutPrefix(line, []byte("Uid:"))
		if !ok {
			continue
		}
		fields := bytes.Fields(rest)
		if len(fields) == 0 {
			return 0, false
		}
		uid, err := strconv.ParseUint(string(fields[0]), 10, 32)
		if err != nil {
			return 0, false
		}
		return uint32(uid), true
	}
	return 0, false
}

// ParsePasswd reads passwd(5) lines (name:password:uid:gid:gecos:home:shell) into names by uid. The first entry
// of a uid wins, as getpwuid's; a name that is not UTF-8 is repaired so that it is a valid label value; comments, NIS "+"/"-" entries and malformed lines are skipped; at most maxUsers
// names are kept.
func ParsePasswd(r io.Reader) map[uint32]string {
	names := make(map[uint32]string)
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 4096), 64<<10)
	for s.Scan() && len(names) < maxUsers {
		line := s.Bytes()
		if len(line) == 0 || line[0] == '#' || line[0] == '+' || line[0] == '-' {
			continue
		}
		name, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 {
			continue
		}
		_, rest, ok = bytes.Cut(rest, []byte(":"))
		if !ok {
			continue
		}
		uidField, _, ok := bytes.Cut(rest, []byte(":"))
		if !ok {
			continue
		}
		uid, err := strconv.ParseUint(string(uidField), 10, 32)
		if err != nil {
			continue
		}
		if _, dup := names[uint32(uid)]; !dup {
			names[uint32(uid)] = string(bytes.ToValidUTF8(name, []byte("\uFFFD")))
		}
	}
	return names
}
