package workload

import (
	"slices"

	"github.com/gpud/gpud/internal/occupancy"
)

// Classes known before a workload's cgroup exists. A source that learns a
// workload's class before its processes run (a Docker container's create
// event, a pod the informer sees before kubelet makes its cgroup) tells the
// registry the leaf names that cgroup will have; the OnExpect hook hands
// them to the kernel, which classifies the cgroup the moment it is made.
// The expectation follows the workload's class (label, default, lending
// override) and goes when the workload is removed.

// expectation is one workload's expected cgroup names and the class the
// hook was last given for them ("" for none).
type expectation struct {
	names []string
	sent  occupancy.Priority
}

// Expect records the leaf names of the cgroups the workload under key (a
// container id, or PodKey) will have, and tells OnExpect their class once
// the workload is known (Put). A later call replaces the names.
func (r *Registry) Expect(key string, names []string) {
	if key == "" {
		return
	}
	r.expMu.Lock()
	defer r.expMu.Unlock()
	r.mu.Lock()
	if r.expected == nil {
		r.expected = map[string]*expectation{}
	}
	old := r.expected[key]
	if old != nil && slices.Equal(old.names, names) {
		r.mu.Unlock()
		r.syncExpectLocked(key)
		return
	}
	r.expected[key] = &expectation{names: slices.Clone(names)}
	r.mu.Unlock()
	if old != nil && old.sent != "" && r.OnExpect != nil {
		r.OnExpect(old.names, "")
	}
	r.syncExpectLocked(key)
}

// Expected returns the cgroup names expected for key and the class the
// kernel was given for them ("" when none).
func (r *Registry) Expected(key string) ([]string, occupancy.Priority) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.expected[key]
	if e == nil {
		return nil, ""
	}
	return slices.Clone(e.names), e.sent
}

// syncExpect tells OnExpect the current class of the keys' expected
// cgroups where it changed.
func (r *Registry) syncExpect(keys ...string) {
	r.expMu.Lock()
	defer r.expMu.Unlock()
	for _, k := range keys {
		r.syncExpectLocked(k)
	}
}

// syncExpectLocked runs under expMu, which orders the hook's calls as the
// registry's changes: a removal's "" never overtakes an earlier class.
func (r *Registry) syncExpectLocked(key string) {
	r.mu.Lock()
	e := r.expected[key]
	if e == nil {
		r.mu.Unlock()
		return
	}
	var class occupancy.Priority
	if w, ok := r.byContainer[key]; ok {
		class = gateClass(r.effective(w))
	}
	if class == e.sent {
		r.mu.Unlock()
		return
	}
	e.sent = class
	names := e.names
	r.mu.Unlock()
	if r.OnExpect != nil {
		r.OnExpect(names, class)
	}
}

// dropExpect forgets key's expected cgroups (the workload is gone).
func (r *Registry) dropExpect(key string) {
	r.expMu.Lock()
	defer r.expMu.Unlock()
	r.mu.Lock()
	e := r.expected[key]
	delete(r.expected, key)
	r.mu.Unlock()
	if e != nil && e.sent != "" && r.OnExpect != nil {
		r.OnExpect(e.names, "")
	}
}
