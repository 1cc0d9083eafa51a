// Package logstate remembers what a component last logged about its health, so that a problem is logged when it
// starts, changes or ends, and not once per scrape while it lasts; and, for a state that flaps, so that the lines
// are rate-limited and the changes in between counted, not lost.
package logstate

import (
	"sync"
	"time"
)

// State is the last logged state of one component: "" until something is set. The zero value logs every change;
// with Every set, at most Burst lines go out at once and one more per Every after that. It is safe for concurrent
// use; Every, Burst and Now are set before the first call.
type State struct {
	// Every is the time it takes to earn one more line once Burst lines have gone out; 0: no limit.
	Every time.Duration
	// Burst is how many changes are logged at once before the limit holds (at least 1).
	Burst int
	// Now is the clock; nil: time.Now.
	Now func() time.Time

	mu      sync.Mutex
	logged  string // the state last logged
	current string // the state last set
	pending int    // changes since the last line
	tokens  int    // lines that may go out now
	earned  time.Time
	started bool
}

// The limit for a state that can flap (a slow source, a helper that sometimes lingers): a burst of changes, an
// outage's start, change of kind and end, is logged as it happens; past it, one line a minute.
const (
	LimitEvery = time.Minute
	LimitBurst = 4
)

// Limited returns a State with the limit for a state that can flap.
func Limited() *State { return &State{Every: LimitEvery, Burst: LimitBurst} }

// Change is what Update says about a state.
type Change struct {
	// Log is true when the state is to be logged now: it changed since the last line, and the limit allows a line.
	Log bool
	// Prev is the state last logged.
	Prev string
	// Unlogged counts, when Log is true, the changes since the last line that this one does not report: a state
	// that flapped while the limit held. The line should say so; when the state is back to Prev, it is logged only
	// to say that.
	Unlogged int
}

// Set records the component's state now and returns the state last logged, and whether to log this one.
func (s *State) Set(state string) (prev string, changed bool) {
	c := s.Update(state)
	return c.Prev, c.Log
}

// Update records the component's state now and says whether to log it. A change the limit holds back is counted,
// and the state as it is then is logged at the first Update after a line is allowed again: a component that
// recovered while its lines were held is logged as recovered, at most Every late if Update is called that often.
func (s *State) Update(state string) Change {
	s.mu.Lock()
	defer s.mu.Unlock()
	if state != s.current {
		s.current = state
		s.pending++
	}
	c := Change{Prev: s.logged}
	if s.pending == 0 || !s.allow() {
		return c
	}
	c.Log, c.Unlogged = true, s.pending
	if state != s.logged {
		c.Unlogged-- // the change this line reports
	}
	s.logged, s.pending = state, 0
	return c
}

// allow takes a line from the limit, if there is one.
func (s *State) allow() bool {
	if s.Every <= 0 {
		return true
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	t := now()
	burst := max(s.Burst, 1)
	if !s.started {
		s.started, s.tokens, s.earned = true, burst, t
	}
	if n := int(t.Sub(s.earned) / s.Every); n > 0 {
		s.tokens = min(burst, s.tokens+n)
		s.earned = s.earned.Add(time.Duration(n) * s.Every)
	}
	if s.tokens == burst {
		s.earned = t // a full bucket earns nothing while it waits
	}
	if s.tokens == 0 {
		return false
	}
	s.tokens--
	return true
}
