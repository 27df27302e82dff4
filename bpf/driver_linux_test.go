package bpf_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

func loadDriverMonitor(t *testing.T, gpus []testutil.FakeGPU) *bpf.Monitor {
	t.Helper()
	root, _, err := cgroups.V2Root()
	if err != nil {
		t.Fatal(err)
	}
	syms, err := bpf.ParseDriverSymbols(testutil.FakeDriverSymbols)
	if err != nil {
		t.Fatal(err)
	}
	m, err := bpf.Load(bpf.Options{CgroupRoot: root, Hooks: bpf.HooksDriver, Driver: syms})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	devs := map[uint32]uint32{}
	for _, g := range gpus {
		dev, _ := bpf.KernelDev(g.Major, g.Minor)
		devs[dev] = uint32(g.Index)
	}
	if err := m.SetGPUs(devs); err != nil {
		t.Fatal(err)
	}
	return m
}

// In driver mode the gate reports every GPU open (no fd yet), whatever the
// route; a close says nothing unless the driver's release can be probed,
// and then only the last close of the file does.
func TestDriverHooksOpenRelease(t *testing.T) {
	_, gpus := testutil.MakeFakeDriverGPUs(t, 2)
	m := loadDriverMonitor(t, gpus)
	st := m.Hooks()
	if st.Mode != bpf.HooksDriver || st.Err != nil {
		t.Fatalf("hooks = %+v, want driver mode", st)
	}
	if slices.Contains(st.Attached, "tp_btf/sys_enter") || slices.Contains(st.Attached, "tp_btf/sys_exit") {
		t.Errorf("driver mode attached a syscall hook: %v", st.Attached)
	}
	release := slices.Contains(st.Attached, "kprobe/release:fuse_dev_release")
	if !release && (st.Complete || len(st.Missing) == 0) {
		t.Errorf("release not hooked, yet hooks = %+v", st)
	}
	// The gate is what reports opens in this mode: a kernel that refuses
	// it reports none, and says so.
	gate := m.GateErr() == nil
	if !gate && (st.Complete || !missingHas(st, "opens (the kernel refuses the gate")) {
		t.Errorf("gate refused (%v), yet hooks = %+v", m.GateErr(), st)
	}
	t.Logf("hooks: %+v", st)

	for _, g := range gpus {
		f, err := os.OpenFile(g.Path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		ev, ok := nextEvent(t, m, 2*time.Second)
		switch {
		case gate && (!ok || ev.Type != bpf.EventOpen || ev.GPU != int32(g.Index) || ev.FD != bpf.FDUnknown):
			t.Fatalf("after open of GPU %d: %+v ok=%v, want open with an unknown fd", g.Index, ev, ok)
		case !gate && ok:
			t.Fatalf("event after an open without the gate: %+v", ev)
		}
		dup, err := unix.Dup(int(f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		if ev, ok := nextEvent(t, m, 200*time.Millisecond); ok {
			t.Fatalf("event for the close of one of two references: %+v", ev)
		}
		unix.Close(dup)
		ev, ok = nextEvent(t, m, 500*time.Millisecond)
		switch {
		case release && (!ok || ev.Type != bpf.EventRelease || ev.GPU != int32(g.Index)):
			t.Fatalf("after the last close of GPU %d: %+v ok=%v, want release", g.Index, ev, ok)
		case !release && ok:
			t.Fatalf("event after a close without release hook: %+v", ev)
		}
	}
	// Other files, devices included, say nothing.
	for _, p := range []string{"/dev/null", "/proc/self/status"} {
		g, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
	}
	if ev, ok := nextEvent(t, m, 200*time.Millisecond); ok {
		t.Fatalf("unexpected event for a non-GPU file: %+v", ev)
	}
	if n, _ := m.PendingMarks(); n != 0 {
		t.Errorf("pending marks = %d: the gate marked openers in driver mode", n)
	}
}

// A driver that is not there (a CPU node, a module loaded later) leaves
// the mode incomplete and says which roles are missing; nothing fails.
func TestDriverHooksMissingSymbols(t *testing.T) {
	testutil.RequireRoot(t)
	root, _, err := cgroups.V2Root()
	if err != nil {
		t.Fatal(err)
	}
	m, err := bpf.Load(bpf.Options{CgroupRoot: root, Hooks: bpf.HooksDriver,
		Driver: bpf.DriverSymbols{Release: []string{"gpud_no_such_release"}, Receive: []string{"gpud_no_such_receive"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st := m.Hooks()
	roles := slices.DeleteFunc(slices.Clone(st.Missing), func(s string) bool {
		return !strings.HasPrefix(s, bpf.RoleRelease+" ") && !strings.HasPrefix(s, bpf.RoleReceive+" ")
	})
	if st.Complete || len(roles) != 2 || !strings.Contains(roles[0], "gpud_no_such_release") {
		t.Fatalf("hooks = %+v, want incomplete with release and receive missing", st)
	}
	if m.AttachDriver() {
		t.Error("AttachDriver found symbols that do not exist")
	}
}

func TestParseDriverSymbols(t *testing.T) {
	d, err := bpf.ParseDriverSymbols(testutil.FakeDriverSymbols)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Release, []string{"fuse_dev_release", "devkmsg_release"}) || !slices.Equal(d.Receive, bpf.DefaultDriverSymbols().Receive) {
		t.Errorf("parsed %+v", d)
	}
	if d, err := bpf.ParseDriverSymbols(""); err != nil || d.String() != bpf.DefaultDriverSymbols().String() {
		t.Errorf("empty: %+v, %v", d, err)
	}
	for _, bad := range []string{"release", "open=nvidia_open", "release=a;release=b", "release=a b", "release=", "receive=../x"} {
		if _, err := bpf.ParseDriverSymbols(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A driver upgrade unloads the driver's module and loads it again: the
// kprobe on the old module's release is gone with it, so AttachDriver
// drops it and hooks the reloaded module, whose last closes are reported
// again. The kernel matrix's guests do it with fuse, the stand-in driver
// of GPU 0 (GPUD_TEST_FUSE_KO names its module file there). Elsewhere the
// test unloads nothing (the host's fuse may be in use): it checks that
// nothing is taken for a reload, and TestDropUnloaded covers the rest.
func TestDriverHooksModuleReload(t *testing.T) {
	_, gpus := testutil.MakeFakeDriverGPUs(t, 1)
	m := loadDriverMonitor(t, gpus)
	const fuse = "kprobe/release:fuse_dev_release"
	hooked := func() bool { return slices.Contains(m.Hooks().Attached, fuse) }
	ko := os.Getenv("GPUD_TEST_FUSE_KO")
	if ko == "" {
		if m.DriverModulesChanged() || m.AttachDriver() {
			t.Fatalf("a reload seen where none happened: %+v", m.Hooks())
		}
		_, err := os.Stat("/sys/module/fuse/initstate")
		t.Logf("fuse hooked: %v, fuse a loadable module: %v; the reload runs in the kernel matrix's guests where fuse is a module (GPUD_TEST_FUSE_KO)", hooked(), err == nil)
		return
	}
	if !hooked() {
		t.Fatalf("%s not attached: %+v", fuse, m.Hooks())
	}
	released := func(what string) {
		t.Helper()
		f, err := os.OpenFile(gpus[0].Path, os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		f.Close()
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
			if ev, ok := nextEvent(t, m, time.Until(deadline)); ok && ev.Type == bpf.EventRelease && ev.GPU == 0 {
				return
			}
		}
		t.Fatalf("%s: no release event for GPU 0", what)
	}
	released("before the reload")

	load := testutil.UnloadModule(t, "fuse", ko, nil)
	if !m.DriverModulesChanged() {
		t.Fatal("fuse unloaded, yet no driver module changed")
	}
	if !m.AttachDriver() || hooked() {
		t.Fatalf("fuse unloaded, yet its kprobe is still listed: %+v", m.Hooks())
	}
	load()
	if !m.AttachDriver() || !hooked() {
		t.Fatalf("fuse reloaded, yet its release is not hooked again: %+v", m.Hooks())
	}
	if m.DriverModulesChanged() {
		t.Fatal("changed right after the new attach")
	}
	released("after the reload")
	t.Logf("fuse unloaded and reloaded: its release dropped, hooked again, reported: %v", m.Hooks().Attached)
}
