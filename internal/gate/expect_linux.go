package gate

import (
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
)

// CgroupExpecter is the kernel's side of classes known before a cgroup
// exists (bpf.Monitor): the cgroup_mkdir program applies them.
type CgroupExpecter interface {
	ExpectCgroup(name string, prio uint32) error
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
	Log    *slog.Logger

	Failures atomic.Uint64 // names the kernel was not told
}

// Set is workload.Registry.OnExpect.
func (e *Expectations) Set(names []string, p occupancy.Priority) {
	for _, n := range names {
		var err error
		switch p {
		case occupancy.High:
			err = e.Kernel.ExpectCgroup(n, bpf.PrioHigh)
		case occupancy.Low:
			err = e.Kernel.ExpectCgroup(n, bpf.PrioLow)
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
