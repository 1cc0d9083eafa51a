// Command fakesmi stands in for nvidia-smi in tests: it answers `-q -x` the way a healthy or a broken nvidia-smi
// would. Environment variables choose the behaviour, so a test (or an end-to-end setup) can point the exporter's
// --nvidia-smi.path at the built binary:
//
//	FAKESMI_MODE     file (default): print FAKESMI_FILE (and FAKESMI_STDERR, if set, to stderr) and exit 0
//	                 exit: print FAKESMI_STDERR to stderr and exit with FAKESMI_EXIT (default 9)
//	                 garbage: print bytes that are not XML and exit 0
//	                 flood: print garbage without end
//	                 stall: sleep FAKESMI_SLEEP (default 1h), or until the file FAKESMI_WAITFILE exists, then
//	                 behave like file
//	                 hang-child: start a child that holds stdout open, then hang
//	                 orphan: print FAKESMI_FILE, start a child that holds stdout open, and exit 0
//	FAKESMI_RUNLOG   file that gets one line per run (to count runs)
//	FAKESMI_PIDFILE  file that gets the PID of every process this run started, itself included
//
// Any argv other than `-q -x` exits 64: the source must call nvidia-smi exactly so, without a shell.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

func main() {
	if os.Getenv("FAKESMI_CHILD") == "1" {
		// The child of hang-child and orphan: hold the inherited stdout and never finish.
		time.Sleep(time.Hour)
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fakesmi:", err)
		os.Exit(70)
	}
}

func run() error {
	if got := strings.Join(os.Args[1:], " "); got != "-q -x" {
		fmt.Fprintf(os.Stderr, "unexpected arguments %q\n", got)
		os.Exit(64)
	}
	// The PID first: a test that has seen a run in the run log finds its PID recorded, even when it kills the run
	// at once.
	if err := appendLine(os.Getenv("FAKESMI_PIDFILE"), strconv.Itoa(os.Getpid())); err != nil {
		return err
	}
	if err := appendLine(os.Getenv("FAKESMI_RUNLOG"), strconv.Itoa(os.Getpid())); err != nil {
		return err
	}

	switch mode := os.Getenv("FAKESMI_MODE"); mode {
	case "", "file":
		return printFile()
	case "exit":
		fmt.Fprintln(os.Stderr, os.Getenv("FAKESMI_STDERR"))
		code := 9
		if s := os.Getenv("FAKESMI_EXIT"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("FAKESMI_EXIT: %w", err)
			}
			code = n
		}
		os.Exit(code)
	case "garbage":
		_, err := os.Stdout.WriteString("\x00\x01 this is not <xml at all & never was\n")
		return err
	case "flood":
		line := []byte(strings.Repeat("garbage ", 1024))
		for {
			if _, err := os.Stdout.Write(line); err != nil {
				return err
			}
		}
	case "stall":
		if wait := os.Getenv("FAKESMI_WAITFILE"); wait != "" {
			for {
				if _, err := os.Stat(wait); err == nil {
					return printFile()
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		d := time.Hour
		if s := os.Getenv("FAKESMI_SLEEP"); s != "" {
			var err error
			if d, err = time.ParseDuration(s); err != nil {
				return fmt.Errorf("FAKESMI_SLEEP: %w", err)
			}
		}
		time.Sleep(d)
		return printFile()
	case "hang-child":
		if err := startChild(); err != nil {
			return err
		}
		if _, err := os.Stdout.WriteString("<?xml version=\"1.0\" ?>\n<nvidia_smi_log>\n"); err != nil {
			return err
		}
		time.Sleep(time.Hour)
	case "orphan":
		if err := printFile(); err != nil {
			return err
		}
		return startChild()
	default:
		return fmt.Errorf("unknown FAKESMI_MODE %q", mode)
	}
	return nil
}

func printFile() error {
	b, err := os.ReadFile(os.Getenv("FAKESMI_FILE"))
	if err != nil {
		return err
	}
	if msg := os.Getenv("FAKESMI_STDERR"); msg != "" {
		fmt.Fprintln(os.Stderr, msg)
	}
	_, err = os.Stdout.Write(b)
	return err
}

// startChild starts a copy of this program that inherits stdout (so the reader never sees EOF while it lives) and
// stays in our process group, as a helper that nvidia-smi forked would.
func startChild() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "FAKESMI_CHILD=1")
	cmd.Stdout = os.Stdout
	if err := cmd.Start(); err != nil {
		return err
	}
	return appendLine(os.Getenv("FAKESMI_PIDFILE"), strconv.Itoa(cmd.Process.Pid))
}

func appendLine(path, line string) error {
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
