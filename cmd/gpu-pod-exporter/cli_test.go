package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The command line is tested as its user meets it: the test binary runs as the program (runMain), with the
// arguments a person would type.

func TestMain(m *testing.M) {
	if os.Getenv("GPE_TEST_RUN_MAIN") == "1" {
		stampVersion()
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// runMain runs the program with args and returns what it wrote and its exit status.
func runMain(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "GPE_TEST_RUN_MAIN=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// --help and help show the server's flags too, since it runs without a command; a command's help shows its own.
func TestHelpShowsTheDefaultCommandsFlags(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"-h"}} {
		out, _, code := runMain(t, args...)
		if code != 0 || !strings.Contains(out, "Flags of serve, the default command:") ||
			!strings.Contains(out, "--web.listen-address") || !strings.Contains(out, "--gpu.source") {
			t.Errorf("%v: exit %d, no server flags on stdout:\n%s", args, code, out)
		}
	}
	out, _, _ := runMain(t, "help", "ps")
	if strings.Contains(out, "--web.listen-address") || !strings.Contains(out, "--output") {
		t.Errorf("help ps shows the server's flags, or not its own:\n%s", out)
	}
}

// `version` says what --version says, on stdout.
func TestVersionCommand(t *testing.T) {
	cmd, _, code := runMain(t, "version")
	flag, _, _ := runMain(t, "--version")
	if code != 0 || !strings.HasPrefix(cmd, "gpu_pod_exporter, version ") || cmd != flag {
		t.Errorf("version: exit %d, %q; --version: %q", code, cmd, flag)
	}
}

// A flag given to a command that does not have it says which command has it.
func TestFlagOfAnotherCommand(t *testing.T) {
	cases := []struct {
		args []string
		want string // "" for no hint
	}{
		{[]string{"serve", "--output", "json"}, "--output is a flag of ps, not of serve (try gpu-pod-exporter help ps)"},
		{[]string{"-o", "json"}, "-o is a flag of ps, not of serve (try gpu-pod-exporter help ps)"},
		{[]string{"top", "--watch"}, "--watch is a flag of ps, not of top (try gpu-pod-exporter help ps)"},
		{[]string{"ps", "--web.listen-address=:1"}, "--web.listen-address is a flag of serve, not of ps"},
		{[]string{"ps", "--no-collector.processes"}, "--no-collector.processes is a flag of serve, not of ps"},
		{[]string{"serve", "--interval=1s"}, "--interval is a flag of ps and top, not of serve"},
		{[]string{"--no-such-flag"}, ""},
	}
	for _, c := range cases {
		_, stderr, code := runMain(t, c.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 2 || len(lines) != 1 {
			t.Errorf("%v: exit %d, want 2 with one line:\n%s", c.args, code, stderr)
			continue
		}
		if c.want == "" && strings.Contains(stderr, "is a flag of") || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: %q, want %q", c.args, lines[0], c.want)
		}
	}
}

// --help-man writes a man page that groff reads without a warning, whose NAME line whatis and apropos index, and
// whose .TH header has the five fields of man(7).
func TestManPage(t *testing.T) {
	out, stderr, code := runMain(t, "--help-man")
	if code != 0 || stderr != "" {
		t.Fatalf("--help-man: exit %d, stderr %q", code, stderr)
	}
	th := strings.SplitN(out, "\n", 2)[0]
	if !regexp.MustCompile(`^\.TH GPU\\-POD\\-EXPORTER 1 "" "gpu\\-pod\\-exporter [^"\n]+" "User Commands"$`).MatchString(th) {
		t.Errorf(".TH header %q", th)
	}
	page := filepath.Join(t.TempDir(), "gpu-pod-exporter.1")
	if err := os.WriteFile(page, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("groff"); err != nil {
		t.Skip("groff is not installed (scripts/test.sh installs it)")
	}
	groff := exec.Command("groff", "-man", "-Tutf8", "-ww", "-z", page)
	if msg, err := groff.CombinedOutput(); err != nil || len(msg) > 0 {
		t.Errorf("groff: %v\n%s", err, msg)
	}
	text, err := exec.Command("groff", "-man", "-Tascii", "-P-cbou", page).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gpu-pod-exporter - tells which pod", "--web.listen-address", "--gpu.source", "EXIT STATUS"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	if lexgrog, err := exec.LookPath("lexgrog"); err == nil {
		if got, err := exec.Command(lexgrog, page).Output(); err != nil || !strings.Contains(string(got), `"gpu-pod-exporter - tells which pod`) {
			t.Errorf("lexgrog: %v, %s", err, got)
		}
	}
}

// The completion scripts, each run in its shell: what they offer after the words typed so far.
func TestCompletion(t *testing.T) {
	_, stderr, code := runMain(t, "completion", "tcsh")
	if code != 2 || !strings.Contains(stderr, "bash,fish,zsh") {
		t.Errorf("completion tcsh: exit %d, %q", code, stderr)
	}
	script := func(shell string) string {
		out, stderr, code := runMain(t, "completion", shell)
		if code != 0 || stderr != "" {
			t.Fatalf("completion %s: exit %d, %s", shell, code, stderr)
		}
		path := filepath.Join(t.TempDir(), "_gpu-pod-exporter")
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// Each case: the words on the line (the last one being completed), and some of what must and must not be offered.
	cases := []struct {
		words     []string
		want, not []string
		filesToo  bool // a path: the shell's own file name completion
	}{
		{words: []string{""}, want: []string{"ps", "top", "serve", "completion", "version"}},
		{words: []string{"--"}, want: []string{"--web.listen-address", "--demo"}, not: []string{"--output"}},
		{words: []string{"p"}, want: []string{"ps"}, not: []string{"top"}},
		{words: []string{"ps", "--o"}, want: []string{"--output", "--owner"}, not: []string{"--web.listen-address"}},
		{words: []string{"ps", "--output", ""}, want: []string{"table", "json"}, not: []string{"--demo"}},
		{words: []string{"--gpu.source", "n"}, want: []string{"nvml", "nvidia-smi"}, not: []string{"auto"}},
		{words: []string{"--log.level", "debug", "top", "--s"}, want: []string{"--sort"}, not: []string{"--output"}},
		{words: []string{"completion", ""}, want: []string{"bash", "fish", "zsh"}},
		{words: []string{"--owner", "ps", "--w"}, want: []string{"--web.listen-address"}, not: []string{"--watch"}},
	}
	t.Run("bash", func(t *testing.T) {
		path := script("bash")
		for _, c := range cases {
			line := `source "$1"; shift; COMP_WORDS=(gpu-pod-exporter "$@"); COMP_CWORD=$#; _gpu_pod_exporter; printf '%s\n' "${COMPREPLY[@]}"`
			out, err := exec.Command("bash", append([]string{"-c", line, "bash", path}, c.words...)...).CombinedOutput()
			checkCompletion(t, "bash", c.words, string(out), err, c.want, c.not)
		}
	})
	t.Run("zsh", func(t *testing.T) {
		if _, err := exec.LookPath("zsh"); err != nil {
			t.Skip("zsh is not installed (scripts/test.sh installs it)")
		}
		path := script("zsh")
		// compadd and compset are the completion system's; here they print what would be offered.
		line := `compdef() { :; }; compadd() { [[ $1 == -- ]] && shift; print -l -- "$@"; }; compset() { :; }; _files() { :; }
			source "$1"; shift; words=(gpu-pod-exporter "$@"); CURRENT=$#words; _gpu_pod_exporter`
		for _, c := range cases {
			out, err := exec.Command("zsh", append([]string{"-f", "-c", line, "zsh", path}, c.words...)...).CombinedOutput()
			// compadd leaves matching to the completion system: keep the words that start with what is typed.
			var offered []string
			for _, w := range strings.Fields(string(out)) {
				if strings.HasPrefix(w, c.words[len(c.words)-1]) {
					offered = append(offered, w)
				}
			}
			checkCompletion(t, "zsh", c.words, strings.Join(offered, "\n"), err, c.want, c.not)
		}
	})
	t.Run("fish", func(t *testing.T) {
		if _, err := exec.LookPath("fish"); err != nil {
			t.Skip("fish is not installed (scripts/test.sh installs it)")
		}
		path := script("fish")
		for _, c := range cases {
			line := "gpu-pod-exporter " + strings.Join(c.words, " ")
			out, err := exec.Command("fish", "--no-config", "-c", `source $argv[1]; complete -C $argv[2]`, path, line).CombinedOutput()
			var offered []string
			for _, l := range strings.Split(string(out), "\n") {
				offered = append(offered, strings.SplitN(l, "\t", 2)[0]) // a candidate, then its description
			}
			checkCompletion(t, "fish", c.words, strings.Join(offered, "\n"), err, c.want, c.not)
		}
	})
}

func checkCompletion(t *testing.T, shell string, words []string, out string, err error, want, not []string) {
	t.Helper()
	if err != nil {
		t.Errorf("%s %q: %v\n%s", shell, words, err, out)
		return
	}
	offered := strings.Split(strings.TrimSpace(out), "\n")
	for _, w := range want {
		if !slices.Contains(offered, w) {
			t.Errorf("%s %q: %q not offered; offered %q", shell, words, w, offered)
		}
	}
	for _, w := range not {
		if slices.Contains(offered, w) {
			t.Errorf("%s %q: %q offered", shell, words, w)
		}
	}
}
