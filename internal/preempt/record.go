package preempt

import v1 "github.com/gpud/gpud/api/v1"

// Party is one side of a preemption (a wire type: api/v1).
type Party = v1.Party

// Actions recorded.
const (
	ActionKill    = v1.ActionKill
	ActionDeny    = v1.ActionDeny
	ActionReclaim = v1.ActionReclaim
	ActionFreeze  = v1.ActionFreeze
	ActionThaw    = v1.ActionThaw
)

// Record is one preemption, as journaled and shown in the state file (a
// wire type: api/v1).
type Record = v1.Preemption

// ResultPending marks a kill record written before the kill: if gpud dies
// before the outcome is appended, the next gpud resolves it (Resolve).
const ResultPending = "pending"

// Suspension is a workload frozen instead of killed (a wire type: api/v1).
type Suspension = v1.Suspension
