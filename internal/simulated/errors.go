package simulated

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// configTypes are the node file's sections by their Go type name, so that a decoding error can list the keys valid
// where the mistake is instead of naming a Go type the user never sees.
var configTypes = map[string]reflect.Type{}

func init() {
	registerSections(nodeConfig{}, allocationConfig{}, claimConfig{}, gpuConfig{}, migConfig{}, placementConfig{},
		processConfig{})
}

func registerSections(sections ...any) {
	for _, v := range sections {
		t := reflect.TypeOf(v)
		configTypes["simulated."+t.Name()] = t
	}
}

var (
	unknownField = regexp.MustCompile(`^line (\d+): field (.+) not found in type (\S+)$`)
	wrongType    = regexp.MustCompile("^line (\\d+): cannot unmarshal !!(\\w+)(?: `(.*)`)? into (\\S+)$")
)

// explain rewrites yaml's type errors in the node file's words: an unknown key with the keys valid there, and a
// value of the wrong kind with the kind wanted. Other errors are returned as they are.
func explain(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	lines := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		lines = append(lines, explainLine(e))
	}
	return errors.New(strings.Join(lines, "; "))
}

func explainLine(e string) string {
	if m := unknownField.FindStringSubmatch(e); m != nil {
		msg := fmt.Sprintf("line %s: unknown key %q", m[1], m[2])
		if t, ok := configTypes[m[3]]; ok {
			msg += " (valid keys here: " + strings.Join(yamlKeys(t), ", ") + ")"
		}
		return msg
	}
	if m := wrongType.FindStringSubmatch(e); m != nil {
		got := kindOfTag(m[2])
		if m[3] != "" {
			got += " " + m[3]
		}
		return fmt.Sprintf("line %s: want %s, got %s", m[1], kindOfGoType(m[4]), got)
	}
	return e
}

func yamlKeys(t reflect.Type) []string {
	var keys []string
	for f := range t.Fields() {
		k, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case opts == "inline":
			keys = append(keys, yamlKeys(f.Type)...)
		case k != "" && k != "-":
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func kindOfTag(tag string) string {
	switch tag {
	case "seq":
		return "a list"
	case "map":
		return "a mapping (key: value)"
	case "str":
		return "the text"
	case "int", "float":
		return "the number"
	case "bool":
		return "the boolean"
	case "null":
		return "nothing"
	}
	return "a " + tag
}

func kindOfGoType(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["), strings.HasPrefix(t, "simulated."):
		return "a mapping (key: value)"
	case t == "string":
		return "a text value"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"), strings.HasPrefix(t, "float"):
		return "a number"
	}
	return "another kind of value"
}
