package bpf

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
)

// MapUsage is how full one kernel map is.
type MapUsage struct {
	Name     string // the map's name in gpud.bpf.c
	Entries  int
	Capacity int
}

// Full reports whether the map is at least frac full (0.8: 80 %).
func (u MapUsage) Full(frac float64) bool {
	return u.Capacity > 0 && float64(u.Entries) >= frac*float64(u.Capacity)
}

// Maps whose use MapUsage reports: every map that grows with the node's
// workloads or processes. The per-GPU maps are bounded by SetGPUs, the
// LRUs forget safely (gpud.bpf.c says why at each map), and the ring
// buffer reports its drops.
const (
	MapCgroupPrio   = "cgroup_prio"
	MapExpectCgroup = "expect_cgroup"
	MapShareFence   = "share_fence"
	MapPending      = "pending"
	MapHolders      = "holder_tgids"
)

// holderSlot is HOLDER_SLOT of gpud.bpf.c: the tgids of one entry of
// holder_tgids, a byte each.
const holderSlot = len(gpudHolderSlot{}.Tgid)

// MapUsage counts the entries of the maps that grow with the node's
// workloads and processes (the Map* names). A hash map is read in batches
// (a few system calls for a full 65536-entry map); holder_tgids, a byte per
// tgid, through its memory mapping. A map that cannot be read is left out
// and its error joined into err.
func (m *Monitor) MapUsage() (out []MapUsage, err error) {
	var errs []error
	for _, e := range []struct {
		name string
		mp   *ebpf.Map
	}{
		{MapCgroupPrio, m.objs.CgroupPrio},
		{MapExpectCgroup, m.objs.ExpectCgroup},
		{MapShareFence, m.objs.ShareFence},
		{MapPending, m.objs.Pending},
	} {
		n, err := countEntries(e.mp)
		if err != nil {
			errs = append(errs, fmt.Errorf("bpf: counting %s: %w", e.name, err))
			continue
		}
		out = append(out, MapUsage{Name: e.name, Entries: n, Capacity: int(e.mp.MaxEntries())})
	}
	n, err := m.countHolders()
	if err != nil {
		errs = append(errs, fmt.Errorf("bpf: counting %s: %w", MapHolders, err))
	} else {
		out = append(out, MapUsage{Name: MapHolders, Entries: n, Capacity: int(m.objs.HolderTgids.MaxEntries()) * holderSlot})
	}
	return out, errors.Join(errs...)
}

// countBatch is how many entries one batch lookup reads.
const countBatch = 4096

// countEntries counts a hash map's entries: batch lookups where the kernel
// has them (5.6), else key by key.
func countEntries(mp *ebpf.Map) (int, error) {
	// BatchLookup wants slices of the key and value types: byte arrays of
	// their sizes.
	keys := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(int(mp.KeySize()), reflect.TypeFor[byte]())), countBatch, countBatch).Interface()
	vals := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(int(mp.ValueSize()), reflect.TypeFor[byte]())), countBatch, countBatch).Interface()
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := mp.BatchLookup(&cursor, keys, vals, nil)
		total += n
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return total, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			return countKeys(mp)
		case err != nil:
			return 0, err
		}
	}
}

// countKeys counts a map's keys one system call each.
func countKeys(mp *ebpf.Map) (int, error) {
	key, val := make([]byte, mp.KeySize()), make([]byte, mp.ValueSize())
	it := mp.Iterate()
	n := 0
	for it.Next(&key, &val) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, err
	}
	return n, nil
}

// holderMemory is holder_tgids' memory mapping: byte tgid is that
// process's mark.
func (m *Monitor) holderMemory() (*ebpf.Memory, error) {
	mem, err := m.objs.HolderTgids.Memory()
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", MapHolders, err)
	}
	return mem, nil
}

// countHolders counts the processes holder_tgids marks.
func (m *Monitor) countHolders() (int, error) {
	mem, err := m.holderMemory()
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 64<<10)
	n := 0
	for off := int64(0); off < int64(mem.Size()); off += int64(len(buf)) {
		if _, err := mem.ReadAt(buf, off); err != nil {
			return 0, fmt.Errorf("reading %s: %w", MapHolders, err)
		}
		n += len(buf) - bytes.Count(buf, []byte{0})
	}
	return n, nil
}

// PendingFull returns how many GPU opens the gate reported itself because
// the pending map had no room for their mark (each read from the opener's
// fd table, as under --hooks driver: nothing is lost, it costs more).
func (m *Monitor) PendingFull() (uint64, error) {
	var v uint64
	if err := m.objs.PendingFull.Get(&v); err != nil {
		return 0, fmt.Errorf("bpf: reading pending_full: %w", err)
	}
	return v, nil
}
