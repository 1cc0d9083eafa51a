package main

import (
	"fmt"
	"regexp"
	"strings"
	"text/template"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/version"

	"github.com/gpu-pod-exporter/gpu-pod-exporter/internal/clidoc"
)

// What the command line offers besides the commands that read GPUs: the help that shows the default command's
// flags, the man page, shell completion, and the hint for a flag given to the wrong command.

// summary is the one line that says what the program is: the man page's NAME, the help's first words.
const summary = "tells which pod, container, Slurm job or service uses each GPU, and how much of it"

// serveFlagsAnchor is where the top-level help adds the flags of serve, the default command, which `--help` and
// `help` would otherwise leave to `help serve`: kingpin's template lists the application's flags only.
const serveFlagsAnchor = "{{if .Context.Args -}}"

// usageTemplate is kingpin's usage, with serve's flags after the application's when no command is chosen.
var usageTemplate = func() string {
	if !strings.Contains(kingpin.DefaultUsageTemplate, serveFlagsAnchor) {
		panic("kingpin's usage template changed: no " + serveFlagsAnchor)
	}
	return strings.Replace(kingpin.DefaultUsageTemplate, serveFlagsAnchor, `{{if not .Context.SelectedCommand -}}
Flags of serve, the default command:
{{ServeFlags|FlagsToTwoColumns|FormatTwoColumns}}
{{end -}}
`+serveFlagsAnchor, 1)
}()

// useUsage makes the application's help show serve's flags at the top level.
func useUsage(app *kingpin.Application, serve *command) {
	app.UsageTemplate(usageTemplate)
	app.UsageFuncs(template.FuncMap{
		"ServeFlags": func() []*kingpin.FlagModel { return serve.clause.Model().Flags },
		"roff":       clidoc.Roff,
		"version":    func() string { return version.Version },
		"summary":    func() string { return summary },
	})
}

func init() {
	// Kingpin writes --help-man from this template, with no other way to give one.
	kingpin.ManPageTemplate = clidoc.ManPage
}

// unknownFlag is the parser's error for a flag the chosen command does not have.
var unknownFlag = regexp.MustCompile(`^unknown (long|short) flag '-{1,2}([^']+)'$`)

// flagHint says, for a flag the chosen command does not have, which other commands have it ("--output" given to
// the server belongs to ps), and where to read about it. Both are empty when no command has the flag.
func flagHint(parseErr error, chosen string, cmds []*command) (hint, try string) {
	m := unknownFlag.FindStringSubmatch(parseErr.Error())
	if m == nil {
		return "", ""
	}
	long, name := m[1] == "long", m[2]
	var owners []string
	for _, c := range cmds {
		for _, f := range c.clause.Model().Flags {
			if long && (f.Name == name || f.IsBoolFlag() && "no-"+f.Name == name) || !long && string(f.Short) == name {
				owners = append(owners, c.clause.FullCommand())
				break
			}
		}
	}
	if len(owners) == 0 {
		return "", ""
	}
	given := "-" + name
	if long {
		given = "--" + name
	}
	return fmt.Sprintf("%s is a flag of %s, not of %s", given, strings.Join(owners, " and "), chosen),
		"gpu-pod-exporter help " + owners[0]
}
