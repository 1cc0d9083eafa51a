package main

import "github.com/gpu-pod-exporter/gpu-pod-exporter/internal/simulated"

// demoValue is --demo: the flag alone is the built-in demo node, --demo=NAME a node of its own
// (simulated.DemoNamed). kingpin's flags take a value always or never, so demoArgs gives the flag alone its value.
type demoValue struct {
	on   *bool
	name *string
}

func (v demoValue) Set(s string) error {
	if s == "" {
		s = simulated.DemoNode
	}
	if s != simulated.DemoNode {
		if err := simulated.CheckDemoName(s); err != nil {
			return flagError("demo", "%v", err)
		}
	}
	*v.on, *v.name = true, s
	return nil
}

func (v demoValue) String() string { return *v.name }

// demoArgs writes --demo, where it stands alone, as --demo=node-a, so that `--demo ps` stays the demo's ps and
// `--demo=node-b` names a node. What follows "--" is left as it is.
func demoArgs(args []string) []string {
	out := make([]string, len(args))
	copy(out, args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if a == "--demo" {
			out[i] = "--demo=" + simulated.DemoNode
		}
	}
	return out
}
