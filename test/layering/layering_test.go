// Package layering holds the test that keeps the packages in their layers: data flows one way, from the GPU
// sources through attribution and the domain packages to the outputs, and no package reaches past its layer.
package layering

import (
	"bytes"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gpu-pod-exporter/gpu-pod-exporter/"

// rule is one thing the layering forbids: a package it applies to may depend, directly or not, only on the module's
// packages that allowed accepts. Paths are relative to the module.
type rule struct {
	name    string
	applies func(pkg string) bool
	allowed func(pkg, dep string) bool
}

// within reports whether pkg is dir or below it.
func within(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

var rules = []rule{
	{
		// A GPU source knows the snapshot types and nothing of who uses the GPUs or how they are shown; it logs
		// its own trouble when it changes, as every component does (internal/logstate). The DRM source reads
		// processes' open files through the hardened procfs reads (internal/procfs), which know nothing of GPUs.
		name:    "internal/gpu/* imports only internal/gpu, internal/logstate and internal/procfs",
		applies: func(pkg string) bool { return strings.HasPrefix(pkg, "internal/gpu/") },
		allowed: func(pkg, dep string) bool {
			return dep == "internal/gpu" || dep == "internal/logstate" || dep == "internal/procfs" || within(dep, pkg)
		},
	},
	{
		// The table of families is what the exporter and its views agree on: it knows the snapshot's value type
		// and nothing that reads or writes the families.
		name:    "internal/families imports only internal/gpu",
		applies: func(pkg string) bool { return within(pkg, "internal/families") },
		allowed: func(pkg, dep string) bool { return dep == "internal/gpu" || within(dep, pkg) },
	},
	{
		name:    "only cmd imports internal/exposition",
		applies: func(pkg string) bool { return !within(pkg, "cmd") && pkg != "internal/exposition" },
		allowed: func(_, dep string) bool { return dep != "internal/exposition" },
	},
	{
		// The views show readings and the domain packages' answers, not metric series.
		name: "internal/view, internal/top and internal/ps do not import internal/collector",
		applies: func(pkg string) bool {
			return within(pkg, "internal/view") || within(pkg, "internal/top") || within(pkg, "internal/ps")
		},
		allowed: func(_, dep string) bool { return !within(dep, "internal/collector") },
	},
	{
		// The HTTP server serves the handlers it is given: it knows nothing of GPUs, processes or their owners, so
		// that it can be read, tested and hardened on its own. Of the module it uses only what guards a server.
		name:    "internal/server depends only on internal/connlimit, basicauth, logstate and configfile",
		applies: func(pkg string) bool { return within(pkg, "internal/server") },
		allowed: func(pkg, dep string) bool {
			return within(dep, pkg) || slices.Contains([]string{"internal/connlimit", "internal/basicauth",
				"internal/logstate", "internal/configfile"}, dep)
		},
	},
	{
		// The program's edge: the server and the command line's generated documents belong to the program, not to
		// a package that another could use.
		name:    "only cmd imports internal/server and internal/clidoc",
		applies: func(pkg string) bool { return !within(pkg, "cmd") },
		allowed: func(pkg, dep string) bool {
			return within(dep, pkg) || !within(dep, "internal/server") && !within(dep, "internal/clidoc")
		},
	},
	{
		// The completion scripts and the man page are written from kingpin's model alone.
		name:    "internal/clidoc imports nothing of the module",
		applies: func(pkg string) bool { return within(pkg, "internal/clidoc") },
		allowed: func(pkg, dep string) bool { return within(dep, pkg) },
	},
	{
		// ps and top are two renderings of one view model (internal/view): only the command wires them, so that
		// neither the cluster reader nor the model links a terminal UI or a table printer.
		name: "only cmd imports internal/top and internal/ps",
		applies: func(pkg string) bool {
			return !within(pkg, "cmd") && !within(pkg, "internal/top") && !within(pkg, "internal/ps")
		},
		allowed: func(_, dep string) bool { return !within(dep, "internal/top") && !within(dep, "internal/ps") },
	},
	{
		// The cluster reader fills the view model from Prometheus; it knows nothing of how it is drawn.
		name:    "internal/cluster does not import internal/top",
		applies: func(pkg string) bool { return within(pkg, "internal/cluster") },
		allowed: func(_, dep string) bool { return !within(dep, "internal/top") && !within(dep, "internal/ps") },
	},
	{
		// The view model is the one place a workload, a GPU's health and a signal are defined: it reads the node's
		// reading and the domain packages, never a renderer or a reader of Prometheus.
		name:    "internal/view imports neither a renderer nor internal/cluster",
		applies: func(pkg string) bool { return within(pkg, "internal/view") },
		allowed: func(_, dep string) bool {
			return !within(dep, "internal/top") && !within(dep, "internal/ps") && !within(dep, "internal/cluster") &&
				!within(dep, "internal/promapi")
		},
	},
	{
		// A runtime answers what it is asked (internal/runtime); the attribution engine is the one that asks.
		name:    "internal/runtime and its runtimes do not import internal/attribution",
		applies: func(pkg string) bool { return within(pkg, "internal/runtime") },
		allowed: func(_, dep string) bool { return !within(dep, "internal/attribution") },
	},
}

// TestLayering checks every rule against what `go list -deps` says each package of the program depends on. Test
// files are left out: a test may build what it needs from any layer.
func TestLayering(t *testing.T) {
	deps, imports := goList(t)
	// A rule that applies to no package would pass whatever the code did.
	for _, r := range rules {
		n := 0
		for pkg := range deps {
			if r.applies(pkg) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("%s: applies to no package", r.name)
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(deps)) {
		for _, r := range rules {
			if !r.applies(pkg) {
				continue
			}
			for _, dep := range deps[pkg] {
				if !r.allowed(pkg, dep) {
					t.Errorf("%s: %s depends on %s (%s)", r.name, pkg, dep, strings.Join(chain(imports, pkg, dep), " -> "))
				}
			}
		}
	}
}

// goList returns, for every package of the program, the module's packages it depends on (go list's Deps, all the
// way down) and those it imports itself, relative to the module.
func goList(t *testing.T) (deps, imports map[string][]string) {
	t.Helper()
	const format = `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}|{{range .Imports}} {{.}}{{end}}`
	cmd := exec.Command("go", "list", "-f", format, module+"cmd/...", module+"internal/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	ours := func(paths string) []string {
		var in []string
		for _, p := range strings.Fields(paths) {
			if rel, ok := strings.CutPrefix(p, module); ok {
				in = append(in, rel)
			}
		}
		return in
	}
	deps, imports = make(map[string][]string), make(map[string][]string)
	for line := range strings.Lines(string(out)) {
		all, direct, _ := strings.Cut(strings.TrimSpace(line), "|")
		fields := strings.Fields(all)
		pkg, ok := strings.CutPrefix(fields[0], module)
		if !ok {
			continue
		}
		deps[pkg], imports[pkg] = ours(strings.Join(fields[1:], " ")), ours(direct)
	}
	if len(deps) == 0 {
		t.Fatalf("go list named no package of %s", module)
	}
	return deps, imports
}

// chain is the shortest import path from pkg to dep, for the error message.
func chain(imports map[string][]string, pkg, dep string) []string {
	prev := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == dep {
			var path []string
			for ; p != ""; p = prev[p] {
				path = append([]string{p}, path...)
			}
			return path
		}
		for _, next := range imports[p] {
			if _, seen := prev[next]; !seen {
				prev[next] = p
				queue = append(queue, next)
			}
		}
	}
	return []string{pkg, "?", dep}
}
