package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/alecthomas/units"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/socket"
)

// flagGroup is a set of flags that belong together (the GPU source's, the web server's, ...): it registers them,
// checks them before anything starts (an error names the flag and makes the exit status 2), and says what they point
// at that is not there yet, which the exporter warns about once and starts anyway. Each command lists its groups.
type flagGroup interface {
	register(flagHost)
	check() error
	warnings() []string
}

// flagHost is a command or the application: what flags are registered on.
type flagHost interface {
	Flag(name, help string) *kingpin.FlagClause
}

// noChecks is embedded by a group whose flags the parser checks in full and which point at nothing.
type noChecks struct{}

func (noChecks) check() error       { return nil }
func (noChecks) warnings() []string { return nil }

// usageError is a flag that cannot work, found before anything starts: the exporter exits with status 2 and one
// line that names the flag.
type usageError struct {
	flag string
	err  error
}

func (e *usageError) Error() string { return "--" + e.flag + ": " + e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func flagError(flag string, format string, args ...any) error {
	return &usageError{flag: flag, err: fmt.Errorf(format, args...)}
}

// durationValue is a duration flag that must be greater than zero: a zero or negative timeout or interval would
// silently turn the thing it bounds off. Kingpin's own duration errors do not name the flag; these do.
type durationValue struct {
	flag string
	dst  *time.Duration
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return flagError(v.flag, "%q is not a duration (use a unit, e.g. 5s or 500ms)", s)
	}
	if d <= 0 {
		return flagError(v.flag, "must be greater than 0, got %s", s)
	}
	*v.dst = d
	return nil
}

func (v durationValue) String() string { return v.dst.String() }

// durationFlag registers a positive duration flag.
func durationFlag(g flagHost, name, help string, def time.Duration, dst *time.Duration) {
	g.Flag(name, help).Default(def.String()).SetValue(durationValue{flag: name, dst: dst})
}

// intValue is an integer flag with a least value, whose errors name the flag.
type intValue struct {
	flag string
	min  int
	dst  *int
}

func (v intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return flagError(v.flag, "%q is not a whole number", s)
	}
	if n < v.min {
		return flagError(v.flag, "must be at least %d, got %d", v.min, n)
	}
	*v.dst = n
	return nil
}

func (v intValue) String() string { return strconv.Itoa(*v.dst) }

// intFlag registers an integer flag of at least min.
func intFlag(g flagHost, name, help string, def, min int, dst *int) {
	g.Flag(name, help).Default(strconv.Itoa(def)).SetValue(intValue{flag: name, min: min, dst: dst})
}

// bytesValue is a size flag, "48MiB" (KiB, MiB, GiB; KB, MB and GB are the same) or whole bytes, between min and
// max, whose errors name the flag.
type bytesValue struct {
	flag     string
	min, max int64
	dst      *int64
}

func (v bytesValue) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		b, unitErr := units.ParseBase2Bytes(s)
		if unitErr != nil {
			return flagError(v.flag, "%q is not a size (e.g. 48MiB, 1GiB)", s)
		}
		n = int64(b)
	}
	if n < v.min || n > v.max {
		return flagError(v.flag, "must be from %s to %s, got %s", units.Base2Bytes(v.min), units.Base2Bytes(v.max), s)
	}
	*v.dst = n
	return nil
}

func (v bytesValue) String() string { return units.Base2Bytes(*v.dst).String() }

// enumValue is a flag with a fixed set of values whose error names the flag and lists them.
type enumValue struct {
	flag    string
	allowed []string
	dst     *string
}

func (v enumValue) Set(s string) error {
	if !slices.Contains(v.allowed, s) {
		return flagError(v.flag, "%q is not one of %s", s, strings.Join(v.allowed, ", "))
	}
	*v.dst = s
	return nil
}

func (v enumValue) String() string { return *v.dst }

// Options are the values, for shell completion.
func (v enumValue) Options() []string { return v.allowed }

// enumFlag registers an enum flag.
func enumFlag(g flagHost, name, help, def string, dst *string, allowed ...string) *kingpin.FlagClause {
	c := g.Flag(name, help).Default(def)
	c.SetValue(enumValue{flag: name, allowed: allowed, dst: dst})
	return c
}

// namedValue wraps a library's flag value (the log level and format) so that its errors name the flag; values are
// those it takes, for shell completion.
type namedValue struct {
	flag   string
	values []string
	kingpin.Value
}

// Options are the values, for shell completion.
func (v namedValue) Options() []string { return v.values }

func (v namedValue) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return &usageError{flag: v.flag, err: err}
	}
	return nil
}

// checkProcFS refuses a --path.procfs that is not a readable directory. A directory that is not a proc filesystem
// (a test tree, a wrong bind mount) is allowed with a warning, returned as a non-empty string: every identity read
// from it is only as trustworthy as the tree.
func checkProcFS(path string, isProc func(string) (bool, error)) (warning string, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", flagError("path.procfs", "%v", err)
	}
	if !fi.IsDir() {
		return "", flagError("path.procfs", "%s is not a directory", path)
	}
	proc, err := isProc(path)
	if err != nil {
		return "", flagError("path.procfs", "%v", err)
	}
	if !proc {
		return path + " is not a proc filesystem: GPU processes are attributed from whatever it holds", nil
	}
	return "", nil
}

// checkSocketFlag validates an endpoint flag's syntax and says whether the socket it names is missing: the
// exporter still starts (the runtime or kubelet may come up later), but says so once, naming the flag.
func checkSocketFlag(flag, endpoint string) (missing string, err error) {
	if endpoint == "" {
		return "", nil
	}
	path, err := socket.Path(endpoint)
	if err != nil {
		return "", flagError(flag, "%v", err)
	}
	if !socket.Exists(path) {
		return path, nil
	}
	return "", nil
}

// asUsage reports whether err is a usage error, for the exit status.
func asUsage(err error) bool {
	var u *usageError
	return errors.As(err, &u)
}
