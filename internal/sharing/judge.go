package sharing

import (
	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/preempt"
)

// Proc is one process holding a shared GPU, as the judge sees it: its pod,
// its class and its memory on that GPU (NVML's process list).
type Proc struct {
	PID      int
	PodUID   string // "" for a process in no pod
	Priority v1.Priority
	Memory   uint64 // 0 when NVML does not name it
}

// Memory is a GPU's memory, as NVML reports it.
type Memory struct{ Total, Used uint64 }

// free is the memory not in use.
func (m Memory) free() uint64 {
	if m.Used >= m.Total {
		return 0
	}
	return m.Total - m.Used
}

// Input is one GPU as the judge needs it.
type Input struct {
	Shares []Share // the GPU's shares (Book.OnGPU)
	Procs  []Proc  // its holders, system agents left out
	// Memory is nil when NVML does not report the GPU's memory: then no
	// pod can be shown to need memory, and nothing is preempted.
	Memory *Memory
}

// Use is one share as judged: what its pods use against what it was given.
type Use struct {
	Share
	// Requested is the memory its account was given: its own Bytes, or,
	// when its pods are also named by other shares on this GPU, the sum of
	// those shares (one pod's memory cannot be told apart between its
	// claims, so they are judged together).
	Requested uint64
	Used      uint64 // its pods' processes' memory on the GPU
	Over      bool   // Used > Requested
	// Priority is its pods' class as their processes have it (High over
	// Unmanaged/Unclassified over Low); "" while none of them holds the GPU.
	Priority v1.Priority
	// Preempt: the rule chose its pods to be preempted now.
	Preempt bool
	// Rule names the row of the rule table that chose it ("" when none).
	Rule string
}

// Judgement is the verdict on one shared GPU.
type Judgement struct {
	Uses []Use // one per input share, in its order
	// Need is the memory the pods within their shares were promised and
	// have not used yet; Free the GPU's free memory (0 when unknown).
	Need, Free uint64
	// Preempt are the pod UIDs to preempt, in the order they were chosen
	// (preempt.DecideShared): low-priority pods, over their share first.
	Preempt []string
	// Rules names, for each pod UID in Preempt, the row that chose it.
	Rules map[string]string
	// Conflicts are holders that belong to no share: a whole-GPU owner
	// another device plugin gave the GPU, or a host process. Reported,
	// never preempted by the share rule.
	Conflicts []Proc
}

// Judge judges one shared GPU. The rule:
//
//   - A share's used memory is the sum of its pods' processes' memory on
//     the GPU; it is over when that exceeds what it was given.
//   - A pod "needs memory it is holding" when it is within its share
//     (used < requested) and the GPU's free memory is less than the sum,
//     over such shares, of what each was promised and has not used yet
//     (requested - used): that sum is Need.
//   - Then the rule table's shared rows choose (preempt.DecideShared): the
//     low-priority shares over their share, largest overage first, until
//     the memory they use (what preempting them is estimated to free)
//     covers Need - Free; for a high-priority share's need, then also the
//     low shares within theirs, the largest user first, until the high
//     shares' need is covered. A share with a high-priority, unmanaged or
//     unclassified process is never chosen: it is reported (Over), never
//     preempted.
//   - Holders in no share are Conflicts, never chosen.
//
// Judge is pure: data in, verdicts out.
func Judge(in Input) Judgement {
	j := Judgement{Uses: make([]Use, len(in.Shares))}
	acct := accounts(in.Shares)
	// Each account's requested bytes, used bytes and class.
	n := 0
	for _, a := range acct {
		n = max(n, a+1)
	}
	requested := make([]uint64, n)
	used := make([]uint64, n)
	class := make([]v1.Priority, n)
	pods := make([][]string, n)
	for i, s := range in.Shares {
		requested[acct[i]] = addSat(requested[acct[i]], s.Bytes)
	}
	podAcct := map[string]int{}
	for i, s := range in.Shares {
		for _, p := range s.Pods {
			if p.UID == "" {
				continue
			}
			if _, ok := podAcct[p.UID]; !ok {
				podAcct[p.UID] = acct[i]
				pods[acct[i]] = append(pods[acct[i]], p.UID)
			}
		}
	}
	for _, p := range in.Procs {
		a, ok := podAcct[p.PodUID]
		if !ok || p.PodUID == "" {
			j.Conflicts = append(j.Conflicts, p)
			continue
		}
		used[a] = addSat(used[a], p.Memory)
		prio := p.Priority
		if prio == "" {
			prio = v1.Unclassified // a class not known is never low
		}
		class[a] = stronger(class[a], prio)
	}
	for i, s := range in.Shares {
		a := acct[i]
		j.Uses[i] = Use{Share: s, Requested: requested[a], Used: used[a], Over: used[a] > requested[a], Priority: class[a]}
	}
	// The shared rows of the rule table choose, by class and overage.
	sharers := make([]preempt.Sharer, n)
	for a := range n {
		sharers[a] = preempt.Sharer{Class: class[a], Requested: requested[a], Used: used[a]}
		if len(pods[a]) > 0 {
			sharers[a].Key = pods[a][0]
		}
	}
	free := uint64(0)
	if in.Memory != nil {
		free = in.Memory.free()
	}
	need, picks := preempt.DecideShared(sharers, free)
	j.Need = need
	if in.Memory == nil {
		return j
	}
	j.Free = free
	chosen := map[int]string{}
	for _, p := range picks {
		chosen[p.Sharer] = p.Rule
		for _, uid := range pods[p.Sharer] {
			j.Preempt = append(j.Preempt, uid)
			if j.Rules == nil {
				j.Rules = map[string]string{}
			}
			j.Rules[uid] = p.Rule
		}
	}
	for i := range j.Uses {
		j.Uses[i].Rule = chosen[acct[i]]
		j.Uses[i].Preempt = j.Uses[i].Rule != ""
	}
	return j
}

// accounts numbers the shares' accounts: shares that name a common pod are
// one account (dense numbers from 0, in order of first appearance).
func accounts(shares []Share) []int {
	parent := make([]int, len(shares))
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	first := map[string]int{}
	for i, s := range shares {
		for _, p := range s.Pods {
			if p.UID == "" {
				continue
			}
			if k, ok := first[p.UID]; ok {
				parent[find(i)] = find(k)
			} else {
				first[p.UID] = i
			}
		}
	}
	out := make([]int, len(shares))
	dense := map[int]int{}
	for i := range shares {
		r := find(i)
		d, ok := dense[r]
		if !ok {
			d = len(dense)
			dense[r] = d
		}
		out[i] = d
	}
	return out
}

// rank orders classes for an account's class: any high-priority process
// makes it high, any unmanaged or unclassified one keeps it from being low
// (never preempted).
func rank(p v1.Priority) int {
	switch p {
	case v1.High:
		return 3
	case v1.Unmanaged, v1.Unclassified:
		return 2
	case v1.Low:
		return 1
	}
	return 2 // an unknown class is never taken for low
}

func stronger(a, b v1.Priority) v1.Priority {
	if a == "" || rank(b) > rank(a) {
		return b
	}
	return a
}

func addSat(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}

// Rule names the share rule for a low (or unmanaged) sharer's need in
// preemption records (their rule field); a high sharer's need is
// preempt.RuleSharedHigh.
const Rule = preempt.RuleSharedLow
