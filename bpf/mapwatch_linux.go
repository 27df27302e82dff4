package bpf

import (
	"log/slog"
	"slices"
	"sync"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// MapsEvery is how often MapWatch reads the kernel maps' use: a few batch
// lookups and a 4 MiB scan (Monitor.MapUsage, about a millisecond), never
// on the event path nor at each state write.
const MapsEvery = 5 * time.Second

// MapNearlyFull is the share of a map's capacity from which gpud says so
// (state file, gpud status, a warning; the alert uses the same).
const MapNearlyFull = 0.8

// mapWhenFull says, per map, how gpud fails safe when it is full
// (gpud.bpf.c says the same at each map).
var mapWhenFull = map[string]string{
	MapCgroupPrio:   "new workloads are not classified in the kernel: the gate lets their opens through and gpud's after-the-fact rule judges them",
	MapExpectCgroup: "new workloads are not classified as their cgroup is made: their first opens are judged after the fact",
	MapShareFence:   "new sharing pods are not fenced in the kernel: the share rule judges them after the fact",
	MapPending:      "the gate reports GPU opens itself and gpud reads each opener's fds (nothing lost, more work)",
	MapHolders:      "cannot fill: a byte for every possible process",
}

// MapWatch keeps the last reading of the kernel maps' use, and warns once
// each time a map becomes nearly full (and says when it no longer is).
type MapWatch struct {
	Read    func() ([]MapUsage, error) // Monitor.MapUsage
	Log     *slog.Logger
	Changed func() // a map became, or stopped being, nearly full

	mu     sync.Mutex
	last   time.Time
	maps   []MapUsage
	warned map[string]bool // maps nearly full at the last reading
}

// Sample reads the maps' use when MapsEvery has passed since the last
// reading.
func (k *MapWatch) Sample(now time.Time) {
	k.mu.Lock()
	if now.Sub(k.last) < MapsEvery {
		k.mu.Unlock()
		return
	}
	k.last = now
	k.mu.Unlock()
	us, err := k.Read()
	if err != nil {
		k.Log.Warn("reading the kernel maps' use", "error", err)
	}
	changed := false
	k.mu.Lock()
	k.maps = us
	if k.warned == nil {
		k.warned = map[string]bool{}
	}
	for _, u := range us {
		full := u.Full(MapNearlyFull)
		switch {
		case full && !k.warned[u.Name]:
			k.Log.Warn("kernel map nearly full", "map", u.Name, "entries", u.Entries, "capacity", u.Capacity, "when_full", mapWhenFull[u.Name])
		case !full && k.warned[u.Name]:
			k.Log.Info("kernel map no longer nearly full", "map", u.Name, "entries", u.Entries, "capacity", u.Capacity)
		}
		changed = changed || full != k.warned[u.Name]
		k.warned[u.Name] = full
	}
	k.mu.Unlock()
	if changed && k.Changed != nil {
		k.Changed() // the state file's kernel_maps
	}
}

// Usage is the last reading (nil before the first).
func (k *MapWatch) Usage() []MapUsage {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.maps)
}

// NearlyFull are the maps of the last reading that are nearly full, as
// the state file shows them.
func (k *MapWatch) NearlyFull() []v1.StateKernelMap {
	var out []v1.StateKernelMap
	for _, u := range k.Usage() {
		if u.Full(MapNearlyFull) {
			out = append(out, v1.StateKernelMap{Name: u.Name, Entries: u.Entries, Capacity: u.Capacity, Full: mapWhenFull[u.Name]})
		}
	}
	return out
}
