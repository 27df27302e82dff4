package gate

import (
	"errors"
	"log/slog"
	"path/filepath"
	"sync/atomic"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
)

// CgroupExpecter is the kernel's side of classes known before a cgroup
// exists (bpf.Monitor): the cgroup_mkdir program applies them.
type CgroupExpecter interface {
	ExpectCgroup(name string, prio uint32, parents []uint64) error
	UnexpectCgroup(name string) error
}

// Expectations carries the registry's OnExpect hook to the kernel: a
// workload classified before its cgroup is made (a Docker create event, a
// pod before kubelet makes its cgroup) is classified by the kernel the
// moment the cgroup is made, so the gate judges its first open. A failure
// (the kernel map full, the programs not attached) leaves that workload to
// the cgroup id found later and to the after-the-fact rule.
type Expectations struct {
	Kernel CgroupExpecter
	// CgroupRoot is the cgroup v2 mount: the runtime's parent cgroups a
	// name is expected in (cgroups.ExpectedParents) are looked up there.
	CgroupRoot string
	Log        *slog.Logger

	Failures atomic.Uint64 // names the kernel was not told
}

// Set is workload.Registry.OnExpect.
func (e *Expectations) Set(names []string, p occupancy.Priority) {
	for _, n := range names {
		var err error
		class, parents := p, e.parents(n)
		if len(parents) == 0 {
			// No runtime parent of this name exists (yet): nothing can
			// be made in its place, and the name anywhere else is a
			// look-alike. The workload is classified once user space
			// sees it start, as when the map is full.
			class = ""
		}
		switch class {
		case occupancy.High:
			err = e.Kernel.ExpectCgroup(n, bpf.PrioHigh, parents)
		case occupancy.Low:
			err = e.Kernel.ExpectCgroup(n, bpf.PrioLow, parents)
		case occupancy.Unmanaged, occupancy.Unclassified:
			err = e.Kernel.ExpectCgroup(n, bpf.PrioWorkload, parents)
		default:
			err = e.Kernel.UnexpectCgroup(n)
		}
		if err == nil || errors.Is(err, bpf.ErrNoMkdirHook) {
			continue // without the programs, start-up said so once
		}
		// The first failure and then one in a hundred: a full map fails
		// for every new workload.
		if f := e.Failures.Add(1); f%100 == 1 && e.Log != nil {
			e.Log.Warn("the kernel cannot classify a cgroup at creation: its first opens are judged after the fact",
				"cgroup_name", n, "priority", string(p), "error", err, "failures", f)
		}
	}
}

// parents returns the ids of the existing cgroups a runtime makes a cgroup
// of this leaf name in (at most bpf.ExpectParents): none for a name no
// runtime gives, or while none of its parents exists.
func (e *Expectations) parents(name string) []uint64 {
	var out []uint64
	for _, p := range cgroups.ExpectedParents(name) {
		if id, err := cgroups.ID(filepath.Join(e.CgroupRoot, p)); err == nil && len(out) < bpf.ExpectParents {
			out = append(out, id)
		}
	}
	return out
}
