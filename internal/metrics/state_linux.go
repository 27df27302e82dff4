package metrics

import (
	"strings"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
)

// FromState fills what a scrape shows of the state document: its GPUs
// and loans (each holder named by names), the switches, how GPU fds are
// observed, and the GPUs left alone by reason. The parts' own counters
// are set by the caller.
func (s *Snapshot) FromState(f v1.StateFile, now time.Time, names func(v1.StateHolder) (namespace, pod, container string)) {
	s.GPUs, s.Lent = GPUsOf(f, now, names)
	s.Monitoring, s.Enforcing = f.Monitoring, f.Enforcing
	if f.Hooks != nil {
		s.HooksMode, s.HooksComplete = f.Hooks.Mode, f.Hooks.Complete
		s.HooksPassedFDs = bpf.PassedLabel(f.Hooks.PassedFDs)
	}
	s.LeftAlone = map[string]int{}
	for _, g := range f.LeftAlone {
		// The label is the reason's kind, before its first colon ("MIG
		// enabled"): the details after it (a slice count, an error's text)
		// would make a new series for every GPU and error.
		kind, _, _ := strings.Cut(g.Reason, ":")
		s.LeftAlone[strings.TrimSpace(kind)]++
	}
}

// KernelMapsOf is the kernel maps' use as the gauges show it.
func KernelMapsOf(usage []bpf.MapUsage) []KernelMap {
	var out []KernelMap
	for _, u := range usage {
		out = append(out, KernelMap{Name: u.Name, Entries: u.Entries, Capacity: u.Capacity})
	}
	return out
}
