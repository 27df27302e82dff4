package daemon

import (
	"slices"
	"sync"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
)

// kernelMapsEvery is how often the kernel maps' use is read: a few batch
// lookups and a 4 MiB scan (bpf.Monitor.MapUsage, about a millisecond),
// never on the event path nor at each state write.
const kernelMapsEvery = 5 * time.Second

// kernelMapNearlyFull is the share of a map's capacity from which gpud
// says so (state file, gpud status, a warning; the alert uses the same).
const kernelMapNearlyFull = 0.8

// kernelMapFull says, per map, how gpud fails safe when it is full
// (bpf/gpud.bpf.c says the same at each map).
var kernelMapFull = map[string]string{
	bpf.MapCgroupPrio:   "new workloads are not classified in the kernel: the gate lets their opens through and gpud's after-the-fact rule judges them",
	bpf.MapExpectCgroup: "new workloads are not classified as their cgroup is made: their first opens are judged after the fact",
	bpf.MapShareFence:   "new sharing pods are not fenced in the kernel: the share rule judges them after the fact",
	bpf.MapPending:      "the gate reports GPU opens itself and gpud reads each opener's fds (nothing lost, more work)",
	bpf.MapHolders:      "cannot fill: a byte for every possible process",
}

// kernelMaps is the last reading of the kernel maps' use.
type kernelMaps struct {
	mu     sync.Mutex
	last   time.Time
	maps   []bpf.MapUsage
	warned map[string]bool // maps nearly full at the last reading
}

// sampleKernelMaps reads the maps' use every kernelMapsEvery, and warns
// once each time a map becomes nearly full (and says when it is no longer).
func (d *Daemon) sampleKernelMaps(now time.Time) {
	k := &d.kmaps
	k.mu.Lock()
	if now.Sub(k.last) < kernelMapsEvery {
		k.mu.Unlock()
		return
	}
	k.last = now
	k.mu.Unlock()
	us, err := d.mon.MapUsage()
	if err != nil {
		d.log.Warn("reading the kernel maps' use", "error", err)
	}
	changed := false
	k.mu.Lock()
	k.maps = us
	if k.warned == nil {
		k.warned = map[string]bool{}
	}
	for _, u := range us {
		full := u.Full(kernelMapNearlyFull)
		switch {
		case full && !k.warned[u.Name]:
			d.log.Warn("kernel map nearly full", "map", u.Name, "entries", u.Entries, "capacity", u.Capacity, "when_full", kernelMapFull[u.Name])
		case !full && k.warned[u.Name]:
			d.log.Info("kernel map no longer nearly full", "map", u.Name, "entries", u.Entries, "capacity", u.Capacity)
		}
		changed = changed || full != k.warned[u.Name]
		k.warned[u.Name] = full
	}
	k.mu.Unlock()
	if changed {
		d.writer.Kick() // the state file's kernel_maps
	}
}

// usage is the last reading (nil before the first).
func (k *kernelMaps) usage() []bpf.MapUsage {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.maps)
}

// nearlyFull are the maps of the last reading that are nearly full, as
// the state file shows them.
func (k *kernelMaps) nearlyFull() []v1.StateKernelMap {
	var out []v1.StateKernelMap
	for _, u := range k.usage() {
		if u.Full(kernelMapNearlyFull) {
			out = append(out, v1.StateKernelMap{Name: u.Name, Entries: u.Entries, Capacity: u.Capacity, Full: kernelMapFull[u.Name]})
		}
	}
	return out
}
