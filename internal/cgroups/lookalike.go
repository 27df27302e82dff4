package cgroups

import (
	"log/slog"
	"sync"
	"sync/atomic"
)

// lookalikeSeen bounds the cgroups remembered as reported: a user who can
// make cgroups can make any number, and past this the set starts afresh
// (a cgroup may then be logged and counted again, never a memory cost).
const lookalikeSeen = 4096

// Lookalikes counts and logs the look-alike cgroups processes are found in
// (Info.Lookalike), each once: a cgroup carrying a workload's name where
// no runtime made it, taken for a host process's.
type Lookalikes struct {
	Log   *slog.Logger
	Count atomic.Uint64 // distinct look-alike cgroups seen

	mu   sync.Mutex
	seen map[string]bool
}

// Saw reports a process in a look-alike cgroup (its v2 path, its pid).
func (l *Lookalikes) Saw(v2Path string, pid int) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if l.seen[v2Path] {
		l.mu.Unlock()
		return
	}
	if l.seen == nil || len(l.seen) >= lookalikeSeen {
		l.seen = map[string]bool{}
	}
	l.seen[v2Path] = true
	l.mu.Unlock()
	n := l.Count.Add(1)
	if l.Log != nil {
		l.Log.Warn("a cgroup named like a workload's is not where its runtime makes one, or not root's: its processes are host processes",
			"cgroup", v2Path, "pid", pid, "lookalikes", n,
			"if_a_runtime_made_it", "add the cgroup its runtime or kubelet makes workloads in to --cgroup-parents (GPUD_CGROUP_PARENTS, chart gpud.cgroupParents)")
	}
}
