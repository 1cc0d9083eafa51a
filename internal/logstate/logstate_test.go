package logstate

import (
	"testing"
	"time"
)

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

// clock is a clock the test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// With a limit, a burst of changes is logged at once; past it, changes are held and counted, and the state as it
// is when a line is allowed again is logged with the count, even when it is back to what was logged last.
func TestUpdateLimited(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	s := State{Every: time.Minute, Burst: 2, Now: clk.now}
	for i, step := range []struct {
		advance time.Duration
		state   string
		want    Change
	}{
		{0, "", Change{}},
		{0, "down", Change{Log: true}},
		{0, "", Change{Log: true, Prev: "down"}},
		{time.Second, "down", Change{Prev: ""}}, // the burst is spent: held
		{time.Second, "", Change{Prev: ""}},
		{time.Second, "down", Change{Prev: ""}},
		{time.Second, "down", Change{Prev: ""}}, // no change: nothing to log
		{time.Minute, "down", Change{Log: true, Prev: "", Unlogged: 2}},
		{time.Second, "down", Change{Prev: "down"}},
		{time.Second, "", Change{Prev: "down"}},
		{time.Second, "down", Change{Prev: "down"}},
		{time.Minute, "down", Change{Log: true, Prev: "down", Unlogged: 2}}, // flapped back: said once a minute
		{time.Minute, "down", Change{Prev: "down"}},
		// Two quiet minutes refill the burst: a new outage is logged at once, start and end.
		{2 * time.Minute, "", Change{Log: true, Prev: "down"}},
		{time.Second, "down", Change{Log: true, Prev: ""}},
		{time.Second, "", Change{Prev: "down"}},
	} {
		clk.t = clk.t.Add(step.advance)
		if got := s.Update(step.state); got != step.want {
			t.Errorf("step %d: Update(%q) = %+v, want %+v", i, step.state, got, step.want)
		}
	}
}

// Without a limit every change is logged and none is held.
func TestUpdateUnlimited(t *testing.T) {
	var s State
	for i := range 100 {
		state := "down"
		if i%2 == 1 {
			state = ""
		}
		if c := s.Update(state); !c.Log || c.Unlogged != 0 {
			t.Fatalf("change %d: %+v", i, c)
		}
	}
}
