package gate

import (
	"context"
	"time"
)

// takeOverWait bounds how long a restarted gpud lets the previous gate run
// while its workload sources list what exists: a source that does not
// answer (dockerd down) must not keep the old gate, whose heartbeat has
// stopped, in place until it fails open.
const takeOverWait = 10 * time.Second

// Pinned is a kernel side that found a previous gpud's gate pinned.
type Pinned interface {
	TakeOver() error
}

// TakeOver replaces the previous gpud's gate (found pinned) with this one's
// once this gpud knows what the old one knew: the GPUs and holders (the
// start-up resync) and the workloads' classes (a first full listing from
// each source, whose channels close then). Until then the old program keeps
// deciding with its own maps, so a restart opens no window where a
// low-priority open gets past a high-priority holder. It reports whether
// it replaced the old gate: the old program reported the opens it let
// through in between to the old gpud's ring, which nobody reads, so the
// caller reads /proc again then.
func (c *Controller) TakeOver(ctx context.Context, k Pinned, listed []chan struct{}) bool {
	if !c.awaitListed(ctx, listed, "taking over the gate") {
		return false
	}
	c.Sync()
	if err := k.TakeOver(); err != nil {
		c.Log.Error("replacing the previous gate", "error", err)
		return false
	}
	c.Log.Info("took over the gate from the previous gpud")
	return true
}

// awaitListed waits for every source's first listing, at most takeOverWait;
// false when ctx ended first.
func (c *Controller) awaitListed(ctx context.Context, listed []chan struct{}, what string) bool {
	deadline := time.After(takeOverWait)
	for _, ch := range listed {
		select {
		case <-ch:
		case <-deadline:
			c.Log.Warn(what+" before every workload source listed", "waited", takeOverWait)
			return true
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// JudgeWhenKnown starts judging holders after the fact (Judge) once the
// sources have listed (at most takeOverWait) and, with lending, once the
// loans are known (loans closes; nil without lending): without them, a
// borrower beside its idle owner would be taken for a low holder of a
// high-held GPU, so there is no bound on that wait.
func (c *Controller) JudgeWhenKnown(ctx context.Context, listed []chan struct{}, loans <-chan struct{}) {
	if !c.awaitListed(ctx, listed, "judging holders") {
		return
	}
	if loans != nil {
		select {
		case <-loans:
		case <-ctx.Done():
			return
		}
	}
	c.Judge()
}
