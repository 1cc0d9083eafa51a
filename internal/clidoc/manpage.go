package clidoc

import "strings"

// ManPage is the template of the man page, section 1, for kingpin.ManPageTemplate, which --help-man writes. Kingpin's
// own put the whole multi-line --version text into .TH and wrote help text unescaped, where a line starting with "."
// is a request. Besides kingpin's functions it needs the usage functions roff (Roff), version (the program's
// version) and summary (the one line that says what the program is, the NAME line's).
const ManPage = `{{define "flags" -}}
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

// Roff escapes text for a man page: a backslash is an escape there, a line that starts with "." or "'" a request,
// and "-" a hyphen, which some terminals show as a character that a flag copied from the page cannot have. A path
// or URL may break after a "/", as it cannot at a hyphen.
func Roff(s string) string {
	s = strings.NewReplacer(`\`, `\e`, "-", `\-`, "/", `/\:`).Replace(s)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			lines[i] = `\&` + l
		}
	}
	return strings.Join(lines, "\n")
}
