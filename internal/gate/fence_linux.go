package gate

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
)

// fences is what the gate was told of sharing pods: the GPUs each pod's
// cgroup may open, and which GPUs are shared.
type fences struct {
	mu     sync.Mutex
	set    map[uint64]bpf.GPUSet
	shared map[int]bool
	// refused: the (cgroup, GPU) refusals of a shared GPU already logged;
	// bounded (cleared when full), so a workload retrying is logged once.
	refused map[[2]uint64]bool
}

// maxRefusedLogged bounds fences.refused.
const maxRefusedLogged = 1024

// shared reports whether gpu is shared by memory (it has DRA shares): the
// rule table does not apply to it, the share rule does. In the kernel, a
// sharing pod opening its share's GPU skips the table too.
func (c *Controller) shared(gpu int) bool {
	c.fences.mu.Lock()
	defer c.fences.mu.Unlock()
	return c.fences.shared[gpu]
}

// FenceShares records the shared GPUs and makes the kernel's share fence
// want: each cgroup (a pod's with GPU memory shares) may open only the
// GPUs listed for it, while the gate enforces; a cgroup not in want is not
// fenced. Only the changes reach the kernel.
//
// The fences go first and the shared GPUs' policy after them (pushed at
// once when it changed): a GPU becomes shared only once its claimants are
// fenced in, or the kernel would refuse them as workloads without a share.
func (c *Controller) FenceShares(shared []int, want map[uint64][]int) {
	c.fences.mu.Lock()
	c.fenceLocked(want)
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

func (c *Controller) fenceLocked(want map[uint64][]int) {
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

// sharerOf reports whether one of cgroups (a process's cgroup and its
// ancestors) is fenced in to gpu: it holds a share of it.
func (c *Controller) sharerOf(gpu int, cgroups []uint64) bool {
	var one bpf.GPUSet
	one.Add(gpu)
	c.fences.mu.Lock()
	defer c.fences.mu.Unlock()
	for _, cg := range cgroups {
		if s, ok := c.fences.set[cg]; ok {
			for i := range s {
				if s[i]&one[i] != 0 {
					return true
				}
			}
		}
	}
	return false
}

// shareRefused handles the kernel's refusal of a shared GPU to a workload
// without a share of it: counted, logged once per workload and GPU.
func (c *Controller) shareRefused(ev *bpf.Event) {
	c.ShareRefusals.Add(1)
	k := [2]uint64{ev.CgroupID, uint64(ev.GPU)}
	c.fences.mu.Lock()
	if c.fences.refused == nil || len(c.fences.refused) >= maxRefusedLogged {
		c.fences.refused = map[[2]uint64]bool{}
	}
	logged := c.fences.refused[k]
	c.fences.refused[k] = true
	c.fences.mu.Unlock()
	if logged {
		return
	}
	opener := c.opener(ev)
	c.Log.Warn("refused a shared GPU to a workload without a share of it",
		"gpu", ev.GPU, "cgroup_id", ev.CgroupID, "pid", opener.PID, "comm", opener.Comm,
		"container_id", opener.ContainerID, "pod_uid", opener.PodUID, "priority", string(opener.Priority))
}

// IntruderRule names, in preemption records, the rule that removes a
// workload without a share from a GPU shared by memory.
const IntruderRule = "a workload without a share holds a GPU shared by memory: kill"

// PreemptIntruders preempts holders of the shared GPU gpu that are
// workloads without a share of it (in before it became shared, or before
// the kernel knew their cgroup), whatever their class: the caller names
// them; agents and host processes are never taken. It returns how many
// were new.
func (c *Controller) PreemptIntruders(gpu int, holders []occupancy.ProcInfo) int {
	var victims []preempt.Victim
	for _, h := range holders {
		if h.Agent || (h.ContainerID == "" && h.PodUID == "") {
			continue
		}
		if v := c.victim(h, fmt.Sprintf("holds GPU %d, shared by memory, without a share of it", gpu)); !c.Exec.Handled(v) {
			victims = append(victims, v)
		}
	}
	if len(victims) > 0 {
		c.Exec.Preempt(c.context(), gpu, IntruderRule, preempt.Party{}, victims, time.Now(), nil)
	}
	return len(victims)
}
