package preempt

import "sync/atomic"

// Hooks stop the executor between a decision and its action, so that tests
// can make a race with the victim deterministic (the victim exits and its
// PID is reused, it moves cgroups, its container is replaced). Nil in
// production: the cost is one atomic load per action.
type Hooks struct {
	// BeforeKill runs after the decision to kill v, before its pidfd is
	// opened and the victim verified.
	BeforeKill func(v Victim)
	// BeforeReclaim runs before the first runtime call of a reclaim of t.
	BeforeReclaim func(t Target)
	// AfterReclaim runs when a reclaim of t has ended (err nil: reclaimed,
	// or already gone).
	AfterReclaim func(t Target, err error)
}

var hooks atomic.Pointer[Hooks]

// SetHooks installs h for every executor and reclaimer of the process (nil
// removes them). For tests only.
func SetHooks(h *Hooks) { hooks.Store(h) }

func beforeKill(v Victim) {
	if h := hooks.Load(); h != nil && h.BeforeKill != nil {
		h.BeforeKill(v)
	}
}

func beforeReclaim(t Target) {
	if h := hooks.Load(); h != nil && h.BeforeReclaim != nil {
		h.BeforeReclaim(t)
	}
}

func afterReclaim(t Target, err error) {
	if h := hooks.Load(); h != nil && h.AfterReclaim != nil {
		h.AfterReclaim(t, err)
	}
}
