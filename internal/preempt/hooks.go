package preempt

import (
	"sync/atomic"

	"golang.org/x/sys/unix"
)

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
	// Step is told each step of a preemption as it is reached, with
	// CLOCK_MONOTONIC ns (the gate event's clock): where a preemption's
	// time goes, for the latency benchmarks.
	Step func(step string, mono uint64)
}

var hooks atomic.Pointer[Hooks]

// SetHooks installs h for every executor and reclaimer of the process (nil
// removes them). For tests only.
func SetHooks(h *Hooks) { hooks.Store(h) }

// BeforeKill runs the BeforeKill hook, if any.
func BeforeKill(v Victim) {
	if h := hooks.Load(); h != nil && h.BeforeKill != nil {
		h.BeforeKill(v)
	}
}

// BeforeReclaim runs the BeforeReclaim hook, if any.
func BeforeReclaim(t Target) {
	if h := hooks.Load(); h != nil && h.BeforeReclaim != nil {
		h.BeforeReclaim(t)
	}
}

// AfterReclaim runs the AfterReclaim hook, if any.
func AfterReclaim(t Target, err error) {
	if h := hooks.Load(); h != nil && h.AfterReclaim != nil {
		h.AfterReclaim(t, err)
	}
}

// StepAt tells the Step hook that a preemption reached step at mono
// (CLOCK_MONOTONIC ns; the gate's decision, taken in the kernel).
func StepAt(step string, mono uint64) {
	if h := hooks.Load(); h != nil && h.Step != nil {
		h.Step(step, mono)
	}
}

// Step tells the Step hook that a preemption reached step (the gate's
// controller calls it too): one atomic load without hooks.
func Step(step string) {
	if h := hooks.Load(); h != nil && h.Step != nil {
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		h.Step(step, uint64(ts.Nano()))
	}
}
