package gate

import (
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
)

// Counting returns the tracker's hooks into the gate (Opened for a
// recorded open, HandleEvent for the gate's events), each open counted by
// verdict first: count(gpu, true) for a recorded open, count(gpu, false)
// for one the gate refused (bpf.EventDeny).
func (c *Controller) Counting(count func(gpu int, allowed bool)) (opened func(occupancy.ProcInfo, int, *bpf.Event), handle func(*bpf.Event)) {
	opened = func(info occupancy.ProcInfo, gpu int, ev *bpf.Event) {
		count(gpu, true)
		c.Opened(info, gpu, ev)
	}
	handle = func(ev *bpf.Event) {
		if ev.Type == bpf.EventDeny {
			count(int(ev.GPU), false)
		}
		c.HandleEvent(ev)
	}
	return opened, handle
}
