// Package clidoc writes what shells and man know of the program's command line: the bash, zsh and fish completion
// scripts and the man page, from kingpin's model of it, so that they cannot drift from the flags.
package clidoc

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/template"

	"github.com/alecthomas/kingpin/v2"
)

// The shell completion scripts of `completion bash|zsh|fish`, written from the command line's own model: the
// commands, each one's flags, and the values of flags that take a fixed set. They complete without running the
// program, and a flag that takes a path (or any other free value) falls back to the shell's file names.

// Options is a flag value with a fixed set of values, which completion offers.
type Options interface{ Options() []string }

// completionFlag is one flag as the scripts offer it.
type completionFlag struct {
	Name   string   // without dashes
	Short  string   // one letter, or ""
	Help   string   // the first sentence, for fish's descriptions
	Value  bool     // takes a value
	Values []string // the values it takes, when they are a fixed set
}

// completionCommand is one command with its own flags and the words it takes.
type completionCommand struct {
	Name  string
	Help  string
	Flags []completionFlag
	Args  []string
}

// completionModel is what every script is written from.
type completionModel struct {
	Program  string
	Default  string // the command that runs when none is given (serve)
	Commands []completionCommand
	Common   []completionFlag // the flags of every command
}

// CommandNames are the commands, in order.
func (m completionModel) CommandNames() []string {
	var names []string
	for _, c := range m.Commands {
		names = append(names, c.Name)
	}
	return names
}

// ValueFlags are the flags, of any command, that take a value: a word after one is its value, not a command.
func (m completionModel) ValueFlags() []completionFlag {
	seen := map[string]completionFlag{}
	for _, f := range m.Common {
		seen[f.Name] = f
	}
	for _, c := range m.Commands {
		for _, f := range c.Flags {
			seen[f.Name] = f
		}
	}
	var out []completionFlag
	for _, name := range slices.Sorted(maps.Keys(seen)) {
		if seen[name].Value {
			out = append(out, seen[name])
		}
	}
	return out
}

// newCompletionModel reads the model of app; args gives the words of commands that take some, besides help's.
func newCompletionModel(app *kingpin.Application, defaultCommand string, args map[string][]string) completionModel {
	args = maps.Clone(args)
	if args == nil {
		args = map[string][]string{}
	}
	args["help"] = commandNames(app)
	am := app.Model()
	m := completionModel{Program: am.Name, Default: defaultCommand, Common: completionFlags(am.Flags)}
	for _, c := range am.FlattenedCommands() {
		if c.Hidden {
			continue
		}
		m.Commands = append(m.Commands, completionCommand{Name: c.FullCommand, Help: firstSentence(c.Help),
			Flags: completionFlags(c.Flags), Args: args[c.FullCommand]})
	}
	return m
}

func completionFlags(flags []*kingpin.FlagModel) []completionFlag {
	var out []completionFlag
	for _, f := range flags {
		if f.Hidden {
			continue
		}
		cf := completionFlag{Name: f.Name, Help: firstSentence(f.Help), Value: !f.IsBoolFlag()}
		if f.Short != 0 {
			cf.Short = string(f.Short)
		}
		if o, ok := f.Value.(Options); ok {
			cf.Values = o.Options()
		}
		out = append(out, cf)
	}
	return out
}

// flagWords are the flags as typed: --output, -o, --sort.
func flagWords(flags []completionFlag) []string {
	var w []string
	for _, f := range flags {
		w = append(w, "--"+f.Name)
		if f.Short != "" {
			w = append(w, "-"+f.Short)
		}
	}
	return w
}

// firstSentence is the start of a help text, up to its first full stop followed by a space (not that of "e.g."),
// or all of it.
func firstSentence(help string) string {
	for i := 0; ; {
		j := strings.Index(help[i:], ". ")
		if j < 0 {
			return help
		}
		i += j
		if !strings.HasSuffix(help[:i], "e.g") && !strings.HasSuffix(help[:i], "i.e") {
			return help[:i+1]
		}
		i++
	}
}

// completionScripts are the scripts' templates by shell.
var completionScripts = map[string]*template.Template{
	"bash": completionTemplate(bashCompletion),
	"zsh":  completionTemplate(zshCompletion),
	"fish": completionTemplate(fishCompletion),
}

// Shells are the shells WriteCompletion writes a script for.
var Shells = slices.Sorted(maps.Keys(completionScripts))

func completionTemplate(text string) *template.Template {
	return template.Must(template.New("").Funcs(template.FuncMap{
		"join": strings.Join,
		"list": func(f completionFlag) []completionFlag { return []completionFlag{f} },
		// fishQuote quotes a word for fish: inside single quotes only \ and ' are special.
		"fishQuote": func(s string) string {
			return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
		},
		// patterns are flags as one case pattern: --output|-o|--sort.
		"patterns":    func(flags []completionFlag) string { return strings.Join(flagWords(flags), "|") },
		"patternList": flagWords,
		// funcName is a shell function name from the program's.
		"funcName": func(s string) string { return "_" + strings.ReplaceAll(s, "-", "_") },
	}).Parse(text))
}

// WriteCompletion writes the completion script of shell, one of Shells, for app, whose command defaultCommand runs
// when none is given; args are the words that its commands take, by command (help's are its commands).
func WriteCompletion(w io.Writer, shell string, app *kingpin.Application, defaultCommand string, args map[string][]string) error {
	t, ok := completionScripts[shell]
	if !ok {
		return fmt.Errorf("no completion for %q (want one of %s)", shell, strings.Join(Shells, ", "))
	}
	return t.Execute(w, newCompletionModel(app, defaultCommand, args))
}

// bashCompletion: bash splits --flag=value at "=" into three words, which the script puts back together.
const bashCompletion = `# bash completion for {{.Program}}: source it, or install it as
# /usr/share/bash-completion/completions/{{.Program}} (the packages do). Written by "{{.Program}} completion bash".
{{funcName .Program}}() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd= i w
    if [[ $cur == = ]]; then
        cur=
    elif [[ $prev == = ]]; then
        prev=${COMP_WORDS[COMP_CWORD-2]}
    fi
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
        {{patterns .ValueFlags}}) [[ ${COMP_WORDS[i+1]} == = ]] && ((i++)); ((i++)) ;;
        -*) ;;
        *) cmd=$w; break ;;
        esac
    done
    case $prev in
    {{- range .ValueFlags}}{{if .Values}}
    {{patterns (list .)}}) COMPREPLY=($(compgen -W "{{join .Values " "}}" -- "$cur")); return ;;
    {{- end}}{{end}}
    {{patterns .ValueFlags}}) return ;; # a path or a free value: bash completes file names
    esac
    local words
    case $cmd in
    '') words="{{join .CommandNames " "}}{{range .Commands}}{{if eq .Name $.Default}}{{range .Flags}} --{{.Name}}{{end}}{{end}}{{end}}" ;;
    {{- range .Commands}}
    {{.Name}}) words="{{join .Args " "}}{{range .Flags}} --{{.Name}}{{end}}" ;;
    {{- end}}
    esac
    COMPREPLY=($(compgen -W "$words{{range .Common}} --{{.Name}}{{end}}" -- "$cur"))
}
complete -o default -F {{funcName .Program}} {{.Program}}
`

// zshCompletion works both as an autoloaded _{{.Program}} file on $fpath and sourced.
const zshCompletion = `#compdef {{.Program}}
# zsh completion for {{.Program}}: install it as _{{.Program}} in a directory of $fpath (the packages do), or
# source it after compinit. Written by "{{.Program}} completion zsh".
{{funcName .Program}}() {
    local cmd= flag=${words[CURRENT-1]} w i
    for ((i = 2; i < CURRENT; i++)); do
        w=${words[i]}
        case $w in
        ({{patterns .ValueFlags}}) ((i++)) ;;
        (-*) ;;
        (*) cmd=$w; break ;;
        esac
    done
    if [[ ${words[CURRENT]} == --*=* ]]; then
        flag=${words[CURRENT]%%=*}
        compset -P '*='
    fi
    case $flag in
    {{- range .ValueFlags}}{{if .Values}}
    ({{patterns (list .)}}) compadd -- {{join .Values " "}}; return ;;
    {{- end}}{{end}}
    ({{patterns .ValueFlags}}) _files; return ;;
    esac
    local -a candidates
    case $cmd in
    ('') candidates=({{join .CommandNames " "}}{{range .Commands}}{{if eq .Name $.Default}}{{range .Flags}} --{{.Name}}{{end}}{{end}}{{end}}) ;;
    {{- range .Commands}}
    ({{.Name}}) candidates=({{join .Args " "}}{{range .Flags}} --{{.Name}}{{end}}) ;;
    {{- end}}
    esac
    compadd -- $candidates{{range .Common}} --{{.Name}}{{end}}
}
if [[ $funcstack[1] == _{{.Program}} ]]; then
    {{funcName .Program}} "$@"
else
    compdef {{funcName .Program}} {{.Program}}
fi
`

// fishCompletion is declarative: a command's flags are offered once the command is on the line, the default
// command's while no other is. The command is the first word that is neither a flag nor a flag's value.
const fishCompletion = `# fish completion for {{.Program}}: source it, or install it as
# /usr/share/fish/vendor_completions.d/{{.Program}}.fish (the packages do). Written by "{{.Program}} completion fish".
function {{funcName .Program}}_command_is --description 'Whether the command on the line is one of the arguments'
    set -l words (commandline -opc)
    set -l command ''
    for i in (seq 2 (count $words))
        if set -q skip[1]
            set -e skip
            continue
        end
        switch $words[$i]
            case {{join (patternList .ValueFlags) " "}}
                set skip 1
            case '-*'
            case '*'
                set command $words[$i]
                break
        end
    end
    contains -- $command $argv
end
complete -c {{.Program}} -f
{{- range .Commands}}
complete -c {{$.Program}} -n '{{funcName $.Program}}_command_is ""' -a {{.Name}} -d {{fishQuote .Help}}
{{- end}}
{{- range .Common}}
complete -c {{$.Program}}{{template "flag" .}}
{{- end}}
{{- range $c := .Commands}}
{{- range .Flags}}
complete -c {{$.Program}} -n '{{funcName $.Program}}_command_is {{$c.Name}}{{if eq $c.Name $.Default}} ""{{end}}'{{template "flag" .}}
{{- end}}
{{- if .Args}}
complete -c {{$.Program}} -n '{{funcName $.Program}}_command_is {{$c.Name}}' -a {{fishQuote (join .Args " ")}}
{{- end}}
{{- end}}
{{define "flag"}} -l {{.Name}}{{if .Short}} -s {{.Short}}{{end}}{{if .Values}} -x -a {{fishQuote (join .Values " ")}}{{else if .Value}} -r -F{{end}} -d {{fishQuote .Help}}{{end}}
`

// commandNames are the application's commands.
func commandNames(app *kingpin.Application) []string {
	var names []string
	for _, c := range app.Model().FlattenedCommands() {
		if !c.Hidden {
			names = append(names, c.FullCommand)
		}
	}
	return names
}
