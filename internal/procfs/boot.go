package procfs

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// userHZ is the unit of a process's start time in its stat file: USER_HZ, which sysconf(_SC_CLK_TCK) reports and
// which is 100 on every architecture Linux runs the exporter on.
const userHZ = 100

// maxStatSize bounds the read of <procfs>/stat: btime comes after a line per CPU, about 100 bytes each.
const maxStatSize = 1 << 20

// BootTime reads when the machine booted: btime of <procfs>/stat, in seconds since the epoch.
func BootTime(root string) (time.Time, error) {
	f, err := os.Open(root + "/stat")
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	return parseBootTime(io.LimitReader(f, maxStatSize))
}

func parseBootTime(r io.Reader) (time.Time, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		if rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("btime ")); ok {
			s, err := strconv.ParseInt(string(bytes.TrimSpace(rest)), 10, 64)
			if err != nil || s <= 0 {
				return time.Time{}, fmt.Errorf("reading the boot time: btime %q is not a time", rest)
			}
			return time.Unix(s, 0), nil
		}
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, fmt.Errorf("reading the boot time: %w", err)
	}
	return time.Time{}, fmt.Errorf("reading the boot time: no btime line")
}

// Started is when a process started, from the machine's boot time and the start time of its stat (clock ticks
// after boot).
func Started(boot time.Time, ticks uint64) time.Time {
	return boot.Add(time.Duration(ticks/userHZ)*time.Second + time.Duration(ticks%userHZ)*(time.Second/userHZ))
}
