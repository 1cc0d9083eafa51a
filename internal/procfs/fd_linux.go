package procfs

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// AppendPIDs appends the processes of the proc filesystem (its numeric directories) to pids, in the order the
// kernel lists them.
func (r *Reader) AppendPIDs(pids []uint32) ([]uint32, error) {
	err := r.entries(r.root, func(name []byte) bool {
		if pid, ok := parseDecimal(name); ok && pid > 0 && pid <= 1<<22 { // PID_MAX_LIMIT is 2^22
			pids = append(pids, uint32(pid))
		}
		return true
	})
	return pids, err
}

// DeviceFD is an open file of a process that is a device node.
type DeviceFD struct {
	FD    int
	Minor uint32
}

// FDTarget is what an open file of a process is: its file type and, for a device, its device number.
type FDTarget struct {
	Mode uint32 // the file type bits (S_IFMT) of st_mode
	Rdev uint64
}

// CharDevice reports whether the target is a character device of the given major number, and its minor.
func (t FDTarget) CharDevice(major uint32) (minor uint32, ok bool) {
	if t.Mode != unix.S_IFCHR || unix.Major(t.Rdev) != major {
		return 0, false
	}
	return unix.Minor(t.Rdev), true
}

// FDs lists <procfs>/<pid>/fd and calls each with every fd number, in the order the kernel lists them (increasing),
// and a function that stats the file the fd refers to through its link: that tells a device from other files
// without opening it, and costs a system call, which a caller that knows the fd from before can spare. each
// returns false to stop. It looks at no more than limit fds and reports how many it looked at, and whether it
// stopped at the limit.
//
// Reading another process's fds needs ptrace read access to it (CAP_SYS_PTRACE for processes with capabilities
// the reader lacks) and, for another user's, CAP_DAC_READ_SEARCH: without them the error is a permission error.
func (r *Reader) FDs(pid uint32, limit int, each func(fd int, stat func() (FDTarget, error)) bool) (seen int, truncated bool, err error) {
	dir := r.pathOf(pid, "fd")
	dfd, err := ignoringEINTR(func() (int, error) {
		return unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	})
	if err != nil {
		return 0, false, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	st := &fdStat{dfd: dfd}
	stat := st.stat
	err = r.direntries(dfd, dir, func(name []byte) bool {
		fd, ok := parseDecimal(name)
		if !ok {
			return true
		}
		if seen == limit {
			truncated = true
			return false
		}
		seen++
		st.name = name
		return each(int(fd), stat)
	})
	return seen, truncated, err
}

// fdStat stats one entry of an open fd directory.
type fdStat struct {
	dfd  int
	name []byte // NUL-terminated in the getdents buffer
	st   unix.Stat_t
}

func (s *fdStat) stat() (FDTarget, error) {
	if err := statat(s.dfd, s.name, &s.st); err != nil {
		return FDTarget{}, err
	}
	return FDTarget{Mode: s.st.Mode & unix.S_IFMT, Rdev: s.st.Rdev}, nil
}

// maxFDInfoFile bounds an fdinfo file: the generic lines and a DRM driver's usage stats, a few dozen lines of
// under 64 bytes.
const maxFDInfoFile = 16 << 10

// FDInfo reads <procfs>/<pid>/fdinfo/<fd> as read reads a file of a process. The bytes are the Reader's, good until
// its next read.
func (r *Reader) FDInfo(pid uint32, fd int) ([]byte, error) {
	r.fdinfo = strconv.AppendInt(append(r.fdinfo[:0], "fdinfo/"...), int64(fd), 10)
	path := r.pathOf(pid, string(r.fdinfo))
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(f)
	return r.readFD(f, path, maxFDInfoFile, false)
}

// OpenFDInfo opens <procfs>/<pid>/fdinfo/<fd> for ReadFDInfo, as every file of a process is opened, when the budget
// has room; ErrNoKeptRoom when it has none, and the file is to be read by path (Reader.FDInfo). Like a kept stat
// file, it stays tied to its process: each read shows the fd as it is then (another file, if the number was reused),
// and once the process has exited, reading fails with ESRCH, whoever has its PID now. Close it when done.
func (k *KeptFiles) OpenFDInfo(r *Reader, pid uint32, fd int) (*KeptFile, error) {
	r.fdinfo = strconv.AppendInt(append(r.fdinfo[:0], "fdinfo/"...), int64(fd), 10)
	return k.openFile(r, pid, string(r.fdinfo))
}

// ReadFDInfo reads an open fdinfo file from its start, as FDInfo reads one. The bytes are the Reader's, good until
// its next read.
func (r *Reader) ReadFDInfo(f *KeptFile) ([]byte, error) {
	return r.readFD(f.fd, f.path, maxFDInfoFile, true)
}

// entries calls fn with the name of each entry of the directory at path but . and .., until fn returns false.
func (r *Reader) entries(path string, fn func(name []byte) bool) error {
	dfd, err := ignoringEINTR(func() (int, error) {
		return unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(dfd)
	return r.direntries(dfd, path, fn)
}

// direntries reads an open directory with getdents64 into the Reader's buffer and calls fn with each name, which
// is NUL-terminated in the buffer and valid until the next read.
func (r *Reader) direntries(dfd int, path string, fn func(name []byte) bool) error {
	if cap(r.dents) == 0 {
		r.dents = make([]byte, 64<<10) // a node's /proc in one or two calls
	}
	buf := r.dents[:cap(r.dents)]
	for {
		n, err := ignoringEINTR(func() (int, error) { return unix.Getdents(dfd, buf) })
		if err != nil {
			return &fs.PathError{Op: "getdents", Path: path, Err: err}
		}
		if n <= 0 {
			return nil
		}
		// The kernel fills the buffer with as many entries as fit: room for another name left means the listing
		// ended, and the call that would return 0 is spared.
		last := n < len(buf)-maxDirent
		for off := 0; off < n; {
			// struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name (NUL-terminated).
			if off+19 > n {
				return fmt.Errorf("%s: truncated directory entry", path)
			}
			reclen := int(*(*uint16)(unsafe.Pointer(&buf[off+16])))
			if reclen < 20 || off+reclen > n {
				return fmt.Errorf("%s: malformed directory entry", path)
			}
			name := buf[off+19 : off+reclen]
			for i, ch := range name {
				if ch == 0 {
					name = name[: i : i+1]
					break
				}
			}
			off += reclen
			if len(name) == 0 || name[0] == '.' && (len(name) == 1 || len(name) == 2 && name[1] == '.') {
				continue
			}
			if !fn(name) {
				return nil
			}
		}
		if last {
			return nil
		}
	}
}

// maxDirent is the largest directory entry: the header and a 255-byte name, aligned.
const maxDirent = 19 + 256 + 5

// statat stats the file that name, in directory dfd, names or links to. name must be followed by a NUL byte in
// its backing array, as getdents writes it.
func statat(dfd int, name []byte, st *unix.Stat_t) error {
	p := unsafe.String(&name[0], len(name))
	err := unix.Fstatat(dfd, p, st, 0)
	if errors.Is(err, unix.EINTR) {
		err = unix.Fstatat(dfd, p, st, 0)
	}
	return err
}

// parseDecimal reads a whole unsigned decimal number of at most 9 digits.
func parseDecimal(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	var n uint64
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		n = n*10 + uint64(ch-'0')
	}
	return n, true
}
