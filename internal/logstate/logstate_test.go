package logstate

import "testing"

func TestSet(t *testing.T) {
	var s State
	for i, step := range []struct {
		state, prev string
		changed     bool
	}{
		{"", "", false}, // nothing known and nothing wrong: nothing to say
		{"down", "", true},
		{"down", "down", false},
		{"gone", "down", true},
		{"", "gone", true},
		{"", "", false},
	} {
		prev, changed := s.Set(step.state)
		if prev != step.prev || changed != step.changed {
			t.Errorf("step %d: Set(%q) = %q, %t; want %q, %t", i, step.state, prev, changed, step.prev, step.changed)
		}
	}
}
