package main

import (
	"fmt"
	"regexp"
	"strings"
	"text/template"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/version"
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
		"roff":       roff,
		"version":    func() string { return version.Version },
		"summary":    func() string { return summary },
	})
}

func init() {
	// Kingpin writes --help-man from this template, with no other way to give one. Its own put the whole
	// multi-line --version text into .TH and wrote help text unescaped, where a line starting with "." is a request.
	kingpin.ManPageTemplate = manPageTemplate
}

// manPageTemplate is the man page, section 1, that --help-man writes and the packages install.
const manPageTemplate = `{{define "flags" -}}
{{range .Flags}}{{if not .Hidden -}}
.TP
\fB{{if .Short}}\-{{.Short|Char}}, {{end}}\-\-{{.Name|roff}}\fR{{if not .IsBoolFlag}}=\fI{{.FormatPlaceHolder|roff}}\fR{{end}}
{{.Help|roff}}
{{end}}{{end -}}
{{end -}}
.TH GPU\-POD\-EXPORTER 1 "" "gpu\-pod\-exporter {{version|roff}}" "User Commands"
.\" Left-aligned and not hyphenated: a long default (a socket's URL) cannot be spread over a justified line, and a
.\" flag broken at a hyphen would be copied wrong.
.ad l
.nh
.SH NAME
gpu\-pod\-exporter \- {{summary|roff}}
.SH SYNOPSIS
.B gpu\-pod\-exporter
[\fIcommand\fR] [\fIflags\fR]
.SH DESCRIPTION
{{.App.Help|roff}}
.SH COMMANDS
{{range .App.FlattenedCommands}}{{if not .Hidden -}}
.SS {{.FullCommand|roff}}{{if .Default}} (the default){{end}}
{{.Help|roff}}
{{template "flags" .}}{{end}}{{end -}}
.SH "FLAGS OF EVERY COMMAND"
{{template "flags" .App -}}
.SH "EXIT STATUS"
0 after a clean stop (SIGINT, SIGTERM, q in top) or a ps that printed; 2 for a command line that does not parse or a
flag value that cannot work, with one line on stderr that names the flag; 1 when the exporter cannot start otherwise.
.SH "SEE ALSO"
\fBnvidia\-smi\fR(1). The reference of every flag, metric and label: /usr/share/doc/gpu\-pod\-exporter/docs/reference.md
`

// roff escapes text for a man page: a backslash is an escape there, a line that starts with "." or "'" a request,
// and "-" a hyphen, which some terminals show as a character that a flag copied from the page cannot have. A path
// or URL may break after a "/", as it cannot at a hyphen.
func roff(s string) string {
	s = strings.NewReplacer(`\`, `\e`, "-", `\-`, "/", `/\:`).Replace(s)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			lines[i] = `\&` + l
		}
	}
	return strings.Join(lines, "\n")
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
