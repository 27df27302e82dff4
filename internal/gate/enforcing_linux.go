package gate

import (
	"context"

	v1 "github.com/gpud/gpud/api/v1"
)

// Protection is what the kernel says of the gate (bpf.Monitor): whether it
// loaded (nil), and whether it protects a GPU.
type Protection interface {
	GateErr() error
	Protected(gpu uint32) bool
}

// Enforcing reports whether the rules apply now: --enforce, and monitoring
// on (with monitoring off nothing is observed to rule on).
func (c *Controller) Enforcing() bool {
	return c.Enforce && (c.Monitoring == nil || c.Monitoring())
}

// Decorate shows in the state document whether the rules apply at open
// time (enforcing: a kernel that refuses the gate cannot, observe-only
// there, though the rules still apply after the fact) and, per GPU,
// whether the gate applies them to its opens now (enforced).
func (c *Controller) Decorate(f *v1.StateFile, k Protection) {
	on := c.Enforcing()
	f.Enforcing = on && k.GateErr() == nil
	for i := range f.GPUs {
		e := on && k.Protected(uint32(f.GPUs[i].Index))
		f.GPUs[i].Enforced = &e
	}
}

// TakeOverThenResync is TakeOver as a part that runs until ctx ends: the
// old gate reported the opens it let through to the previous gpud's ring,
// so, once it is replaced, their holders are found in /proc (resync, which
// judges them).
func (c *Controller) TakeOverThenResync(k Pinned, listed []chan struct{}, resync func() error) func(context.Context) {
	return func(ctx context.Context) {
		if c.TakeOver(ctx, k, listed) {
			if err := resync(); err != nil {
				c.Log.Error("resync after taking over the gate", "error", err)
			}
		}
	}
}
