package preempt

import (
	"cmp"
	"slices"

	"github.com/gpud/gpud/internal/occupancy"
)

// Sharers says which low-priority sharers of a shared GPU a row may
// preempt for the memory its opener needs.
type Sharers string

const (
	// SharersOver: the low sharers over their share, largest overage first.
	SharersOver Sharers = "over-share"
	// SharersLow: the low sharers over their share first, then, while the
	// need is not covered, those within it, the largest user first.
	SharersLow Sharers = "low"
)

// The shared rows' names, as records and gpud explain give them.
const (
	RuleSharedHigh = "shared/high needs its share: preempt low sharers, over-share first"
	RuleSharedLow  = "over its GPU memory share: preempt"
)

// Sharer is one account of a shared GPU as the shared rows see it: the
// shares its pods hold together, their memory, its class.
type Sharer struct {
	// Key orders ties (its first pod's UID), so a choice is stable.
	Key string
	// Class is its pods' strongest class: High if any process is high,
	// never Low while one is unmanaged or unclassified.
	Class     occupancy.Priority
	Requested uint64 // the memory its shares were given
	Used      uint64 // its processes' memory on the GPU
}

// SharePreemption is one sharer a shared row chose.
type SharePreemption struct {
	Sharer int    // its index in the input
	Rule   string // the row that chose it
}

// DecideShared is the shared rows' pure function: which sharers of one GPU
// to preempt for the memory sharers within their share were given and
// have not used yet (their need), when the GPU's free memory does not
// cover it.
//
//   - Any sharer's need (the "shared"/low row, also for unmanaged and
//     unclassified sharers): the low sharers over their share, largest
//     overage first, until what they use covers the whole need.
//   - A high sharer's need (the "shared"/high row): the same first; then,
//     while the high sharers' need is not covered, the low sharers within
//     their share, the largest user first.
//
// High, unmanaged and unclassified sharers are never chosen, nor sharers
// using no memory. The rule of a choice is the high row while the high
// sharers' need is not covered by the free memory, else the low row.
func DecideShared(sharers []Sharer, free uint64) (need uint64, chosen []SharePreemption) {
	var highNeed uint64
	for _, s := range sharers {
		if s.Used < s.Requested {
			need = addSat(need, s.Requested-s.Used)
			if s.Class == occupancy.High {
				highNeed = addSat(highNeed, s.Requested-s.Used)
			}
		}
	}
	if free >= need {
		return need, nil
	}
	row := Decide(Holding{Shared: true}, occupancy.Low)
	if highNeed > free {
		row = Decide(Holding{Shared: true}, occupancy.High)
	}
	var over, within []int
	for i, s := range sharers {
		switch {
		case s.Class != occupancy.Low || s.Used == 0:
		case s.Used > s.Requested:
			over = append(over, i)
		default:
			within = append(within, i)
		}
	}
	slices.SortFunc(over, func(x, y int) int {
		a, b := sharers[x], sharers[y]
		return cmp.Or(cmp.Compare(b.Used-b.Requested, a.Used-a.Requested), cmp.Compare(a.Key, b.Key))
	})
	var freed uint64
	for _, i := range over {
		if addSat(free, freed) >= need {
			break
		}
		freed = addSat(freed, sharers[i].Used)
		chosen = append(chosen, SharePreemption{Sharer: i, Rule: row.Rule})
	}
	if row.PreemptSharers != SharersLow {
		return need, chosen
	}
	slices.SortFunc(within, func(x, y int) int {
		a, b := sharers[x], sharers[y]
		return cmp.Or(cmp.Compare(b.Used, a.Used), cmp.Compare(a.Key, b.Key))
	})
	for _, i := range within {
		if addSat(free, freed) >= highNeed {
			break
		}
		freed = addSat(freed, sharers[i].Used)
		chosen = append(chosen, SharePreemption{Sharer: i, Rule: row.Rule})
	}
	return need, chosen
}

func addSat(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}
