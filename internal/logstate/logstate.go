// Package logstate remembers what a component last logged about its health, so that a problem is logged when it
// starts, changes or ends, and not once per scrape while it lasts.
package logstate

import "sync"

// State is the last logged state of one component: "" until something is set. It is safe for concurrent use.
type State struct {
	mu    sync.Mutex
	state string
}

// Set records the component's state now and returns the state it replaces, and whether that differs: the caller
// logs only then.
func (s *State) Set(state string) (prev string, changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, s.state = s.state, state
	return prev, prev != state
}
