package gate

import (
	"maps"
	"slices"
	"sync"

	"github.com/gpud/gpud/bpf"
)

// fences is what the gate was told of sharing pods: the GPUs each pod's
// cgroup may open, and which GPUs are shared.
type fences struct {
	mu     sync.Mutex
	set    map[uint64]bpf.GPUSet
	shared map[int]bool
}

// shared reports whether gpu is shared by memory (it has DRA shares): the
// rule table does not apply to it, the share rule does. In the kernel, a
// sharing pod opening its share's GPU skips the table too.
func (c *Controller) shared(gpu int) bool {
	c.fences.mu.Lock()
	defer c.fences.mu.Unlock()
	return c.fences.shared[gpu]
}

// SetShared records the GPUs shared by memory and, when that changed,
// pushes their policy to the kernel at once: called as claims are
// prepared, before their pods' containers start, so that no open of a
// shared GPU is judged by the table.
func (c *Controller) SetShared(shared []int) {
	c.fences.mu.Lock()
	now := map[int]bool{}
	for _, g := range shared {
		now[g] = true
	}
	changed := !maps.Equal(now, c.fences.shared)
	c.fences.shared = now
	c.fences.mu.Unlock()
	if changed {
		c.Sync()
	}
}

// FenceShares records the shared GPUs and makes the kernel's share fence
// want: each cgroup (a pod's with GPU memory shares) may open only the
// GPUs listed for it, while the gate enforces; a cgroup not in want is not
// fenced. Only the changes reach the kernel.
func (c *Controller) FenceShares(shared []int, want map[uint64][]int) {
	c.fences.mu.Lock()
	defer c.fences.mu.Unlock()
	c.fences.shared = map[int]bool{}
	for _, g := range shared {
		c.fences.shared[g] = true
	}
	if c.fences.set == nil {
		c.fences.set = map[uint64]bpf.GPUSet{}
	}
	sets := make(map[uint64]bpf.GPUSet, len(want))
	for cg, gpus := range want {
		var s bpf.GPUSet
		for _, g := range gpus {
			s.Add(g)
		}
		sets[cg] = s
	}
	for _, cg := range slices.Sorted(maps.Keys(c.fences.set)) {
		if _, ok := sets[cg]; ok {
			continue
		}
		delete(c.fences.set, cg)
		if err := c.Kernel.UnfenceCgroup(cg, len(c.fences.set)); err != nil {
			c.Log.Warn("lifting a pod's share fence", "cgroup_id", cg, "error", err)
		}
	}
	for _, cg := range slices.Sorted(maps.Keys(sets)) {
		s := sets[cg]
		if old, ok := c.fences.set[cg]; ok && old == s {
			continue
		}
		c.fences.set[cg] = s
		if err := c.Kernel.FenceCgroup(cg, s, len(c.fences.set)); err != nil {
			delete(c.fences.set, cg) // tried again at the next judgement
			c.Log.Warn("fencing a sharing pod to its GPUs: it may open other GPUs", "cgroup_id", cg, "error", err)
		}
	}
}
