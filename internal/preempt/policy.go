// Package preempt holds gpud's priority rules as data with their pure
// functions (Decide, Resumable, Relend, FreezeSafe, the modes), and the
// data a decision and its record are made of (Victim, Target, Party,
// Record). What carries a verdict out lives below it: executor (the
// Executor and the Reclaimer), kill (pidfds, batches) and journal (the
// durable record, checkpoint directories).
package preempt

import "github.com/gpud/gpud/internal/occupancy"

// Holding says which classes hold a GPU at the moment of an open.
// Unmanaged and unclassified holders never block anyone.
type Holding struct {
	High bool
	Low  bool
	// Shared: the GPU is shared by DRA claims (its sharers are fenced to
	// it); the "shared" rows apply, whoever holds it.
	Shared bool
}

// Verdict is the answer to one open.
type Verdict struct {
	Allow bool
	// KillHolders: kill the GPU's low-priority holders and reclaim their
	// containers asynchronously.
	KillHolders bool
	// ReclaimOpener: reclaim the (refused) opener's container asynchronously.
	ReclaimOpener bool
	// PreemptSharers: on a shared GPU, which low-priority sharers the
	// opener's need for the memory of its share preempts (DecideShared).
	PreemptSharers Sharers
	// Rule names the row of the table that decided.
	Rule string
}

// Rule is one row of the table.
type Rule struct {
	HeldBy  string             // "high", "low", "nobody": the strongest class holding the GPU; "shared": shared by DRA claims
	Opener  occupancy.Priority // high or low; other classes are always allowed
	Verdict Verdict
}

// Rules is the table of DESIGN.md, one row per case.
var Rules = []Rule{
	{"low", occupancy.High, Verdict{Allow: true, KillHolders: true, Rule: "low-held/high-opens: preempt"}},
	{"high", occupancy.High, Verdict{Allow: true, Rule: "high-held/high-opens: share"}},
	{"high", occupancy.Low, Verdict{Allow: false, ReclaimOpener: true, Rule: "high-held/low-opens: deny"}},
	{"low", occupancy.Low, Verdict{Allow: true, Rule: "low-held/low-opens: share"}},
	{"nobody", occupancy.High, Verdict{Allow: true, Rule: "free: allow"}},
	{"nobody", occupancy.Low, Verdict{Allow: true, Rule: "free: allow"}},
	// A shared GPU: its sharers open it (the kernel's fence refuses anyone
	// else), and the need of a sharer within its share, memory the
	// scheduler gave it that lower-class sharers use, preempts. A need for
	// compute preempts nobody: the time-slice scheduler gives each sharer
	// its compute, and never throttles a high one.
	{"shared", occupancy.High, Verdict{Allow: true, PreemptSharers: SharersLow, Rule: RuleSharedHigh}},
	{"shared", occupancy.Low, Verdict{Allow: true, PreemptSharers: SharersOver, Rule: RuleSharedLow}},
}

var unmanagedOpener = Verdict{Allow: true, Rule: "unmanaged opener: allow"}

// Decide returns the verdict for an opener of class opener on a GPU held as
// held. A GPU held by both classes (a transient state: the low holders are
// being killed) counts as held by high for a low opener and as held by low
// for a high one, so both rules act.
func Decide(held Holding, opener occupancy.Priority) Verdict {
	if opener != occupancy.High && opener != occupancy.Low {
		return unmanagedOpener
	}
	by := "nobody"
	switch {
	case held.Shared:
		by = "shared"
	case opener == occupancy.Low && held.High:
		by = "high"
	case opener == occupancy.High && held.Low:
		by = "low"
	case held.High:
		by = "high"
	case held.Low:
		by = "low"
	}
	for _, r := range Rules {
		if r.HeldBy == by && r.Opener == opener {
			return r.Verdict
		}
	}
	return unmanagedOpener // unreachable: the table covers every case
}
