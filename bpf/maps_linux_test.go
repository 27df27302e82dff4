package bpf_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/testutil"
)

// nobody is the unprivileged user the tests act as.
const nobody = 65534

func usageOf(t *testing.T, m *bpf.Monitor, name string) bpf.MapUsage {
	t.Helper()
	us, err := m.MapUsage()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(us, func(u bpf.MapUsage) bool { return u.Name == name })
	if i < 0 {
		t.Fatalf("MapUsage has no %s: %+v", name, us)
	}
	return us[i]
}

// An unprivileged user in a cgroup v2 subtree delegated to it makes
// thousands of cgroups named as a workload gpud expects: none takes an
// entry of cgroup_prio (only the runtime's cgroup, made by root under the
// runtime's parent, does), so no user can fill it.
func TestMapsLookalikeCgroupsTakeNoEntry(t *testing.T) {
	testutil.RequireRoot(t)
	_, gpus := testutil.MakeFakeGPUs(t, 1)
	m := loadMonitor(t, gpus)
	if err := m.MkdirHook(); err != nil {
		t.Fatalf("cgroup_mkdir programs not attached: %v", err)
	}
	runtime, runtimeID := cgroupDir(t, "", "runtime")
	name := fmt.Sprintf("docker-%064d.scope", os.Getpid())
	if err := m.ExpectCgroup(name, bpf.PrioHigh, []uint64{runtimeID}); err != nil {
		t.Fatal(err)
	}
	before := usageOf(t, m, bpf.MapCgroupPrio).Entries

	// The delegated subtree, as systemd hands user@UID.service's: the
	// directory and its interface files belong to the user.
	deleg, _ := cgroupDir(t, "", "delegated")
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
		if err := os.Chown(filepath.Join(deleg, f), nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	const n = 2000
	dirs := []string{filepath.Join(deleg, name)}
	for i := 0; i < n; i++ {
		d := filepath.Join(deleg, fmt.Sprintf("d%d", i))
		dirs = append(dirs, d, filepath.Join(d, name))
	}
	t.Cleanup(func() {
		for _, d := range slices.Backward(dirs) {
			os.Remove(d)
		}
	})
	cmd := exec.Command("mkdir", dirs...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mkdir as uid %d: %v: %s", nobody, err, out)
	}
	t.Logf("uid %d made %d cgroups, %d named %s, in %v", nobody, len(dirs), n+1, name, time.Since(start))
	if got := usageOf(t, m, bpf.MapCgroupPrio).Entries; got != before {
		t.Errorf("cgroup_prio: %d entries after the look-alikes, %d before", got, before)
	}

	// The real one, made by root under the runtime's parent, is classified:
	// the name was expected, the look-alikes were not taken for it.
	real := filepath.Join(runtime, name)
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(real) })
	if got := usageOf(t, m, bpf.MapCgroupPrio).Entries; got != before+1 {
		t.Errorf("cgroup_prio: %d entries after the runtime's cgroup, want %d", got, before+1)
	}
}

// MapUsage reports a map as full as it is: cgroup_prio filled to its
// capacity reads full (and is timed: gpud samples it every few seconds),
// and holder_tgids takes more processes than the 65536 of the hash it
// replaced.
func TestMapUsageReportsFilledMap(t *testing.T) {
	testutil.RequireRoot(t)
	_, gpus := testutil.MakeFakeGPUs(t, 1)
	m := loadMonitor(t, gpus)
	u := usageOf(t, m, bpf.MapCgroupPrio)
	if u.Capacity != 65536 {
		t.Fatalf("cgroup_prio capacity %d, want 65536", u.Capacity)
	}
	base := u.Entries
	start := time.Now()
	if _, err := m.MapUsage(); err != nil {
		t.Fatal(err)
	}
	t.Logf("MapUsage with the maps (nearly) empty took %v", time.Since(start))
	// Ids no cgroup has: the gate never meets them.
	for i := 0; i < u.Capacity-base; i++ {
		if err := m.SetCgroupPriority(1<<48+uint64(i), bpf.PrioLow); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	if err := m.SetCgroupPriority(1<<49, bpf.PrioLow); err == nil {
		t.Error("cgroup_prio took an entry past its capacity")
	}
	start = time.Now()
	us, err := m.MapUsage()
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MapUsage with a full 65536-entry cgroup_prio took %v: %+v", took, us)
	u = usageOf(t, m, bpf.MapCgroupPrio)
	if u.Entries != u.Capacity || !u.Full(0.8) {
		t.Errorf("full cgroup_prio reads %+v (full at 80%%: %v)", u, u.Full(0.8))
	}
	if took > time.Second {
		t.Errorf("MapUsage took %v: too slow to sample every few seconds", took)
	}

	hb := usageOf(t, m, bpf.MapHolders).Entries
	const procs = 70000
	for i := 0; i < procs; i++ {
		if err := m.WatchProcess(uint32(4_000_000 + i)); err != nil {
			t.Fatalf("holder %d of %d: %v", i, procs, err)
		}
	}
	if h := usageOf(t, m, bpf.MapHolders); h.Entries != hb+procs || h.Full(0.8) {
		t.Errorf("holder_tgids after %d more processes: %+v, want %d entries and not full", procs, h, hb+procs)
	}
}

// A full pending map loses no GPU open: the gate reports the open itself
// (fd unknown, as under --hooks driver) and counts it. On a kernel that
// refuses the gate nothing marks opens (the openat-exit observer checks
// every new fd itself): the open is still reported, with its fd.
func TestGatePendingFullReportsOpen(t *testing.T) {
	testutil.RequireRoot(t)
	_, gpus := testutil.MakeFakeGPUs(t, 1)
	m := loadMonitor(t, gpus)
	gate := m.GateErr() == nil
	n := bpf.FillPending(t, m)
	if u := usageOf(t, m, bpf.MapPending); u.Entries != u.Capacity || n != u.Capacity {
		t.Fatalf("pending after filling %d: %+v", n, u)
	}
	f, err := os.OpenFile(gpus[0].Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ev, ok := nextEvent(t, m, 2*time.Second)
	if !gate {
		t.Logf("the kernel refuses the gate (observe-only): %v", m.GateErr())
		if !ok || ev.Type != bpf.EventOpen || ev.GPU != 0 || ev.FD != int32(f.Fd()) {
			t.Fatalf("open with pending full, no gate: %+v ok=%v, want an open of GPU 0 at fd %d", ev, ok, f.Fd())
		}
		return
	}
	if !ok || ev.Type != bpf.EventOpen || ev.GPU != 0 || ev.FD != bpf.FDUnknown {
		t.Fatalf("open with pending full: %+v ok=%v, want an open of GPU 0 with its fd unknown", ev, ok)
	}
	if c, err := m.PendingFull(); err != nil || c == 0 {
		t.Errorf("pending_full = %d, %v; want the open counted", c, err)
	}
}
