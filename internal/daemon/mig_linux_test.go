//go:build cgo

// MIG slices are GPUs (issue 28 item 3): on a GPU in MIG mode each GPU
// instance is a unit of occupancy and of the rule table, keyed by its
// capability node (/dev/nvidia-caps/nvidia-capM, numbered in mig-minors),
// and the parent, whose /dev/nvidiaN every slice's processes open, stays
// out of the rules. Fake capability nodes, a fake mig-minors file and the
// NVML double's MIG answers stand in for the driver.

package daemon_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

const (
	migParentUUID = "GPU-6d2a0c51-0000-4000-8000-0000000000aa"
	migUUIDA      = "MIG-8c1d4c2a-0000-4000-8000-00000000000a"
	migUUIDB      = "MIG-8c1d4c2a-0000-4000-8000-00000000000b"
)

// migEnv is an enforcing daemon (no workload source: the tests classify
// cgroups) on one H100 in MIG mode with two slices: GPU instance 1
// (3g.40gb, capability node fm.Caps[0]) and 2 (1g.10gb, fm.Caps[1]).
func migEnv(t *testing.T) (*env, testutil.FakeMIG) {
	fm := testutil.MakeFakeMIG(t)
	dir := t.TempDir()
	e := &env{t: t, dir: dir, logs: &testutil.Buffer{}, settleFor: 3 * time.Second}
	e.cfg = daemon.Config{Run: config.Run{
		DevDir: fm.DevDir, StateFile: filepath.Join(dir, "state.json"), StateDir: dir,
		IdleAfter: time.Minute, NodeName: "test-node", Hooks: testHooks(), DriverSymbols: testutil.FakeDriverSymbols,
		Enforce: true, DockerHost: "none", CRIEndpoint: "none", Reclaim: "none",
		MIGMinorsFile: fm.MinorsFile,
	}}
	double := testutil.NewNVMLDouble(t, "", testutil.NVMLGPU{Index: 0, Minor: int(fm.Parent.Minor), UUID: migParentUUID,
		Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30, MIG: true})
	double.SetMIG(t,
		testutil.NVMLMIG{GPU: 0, GI: 1, CI: 0, UUID: migUUIDA, Profile: "3g.40gb", MemoryTotal: 40 << 30},
		testutil.NVMLMIG{GPU: 0, GI: 2, CI: 0, UUID: migUUIDB, Profile: "1g.10gb", MemoryTotal: 10 << 30})
	e.cfg.UseNVML = true
	e.cfg.NVMLLibrary = double.Library
	return e, fm
}

// sliceIndex is gpud's index of the slice whose capability node is
// nvidia-capM.
func sliceIndex(fm testutil.FakeMIG, slice int) int { return gpumon.MIGIndexBase + fm.CapMinors[slice] }

// Each slice is a GPU in the state file, with its parent, profile and MIG
// UUID; the parent is listed as left alone. A high holder of slice A and
// a low holder of slice B (both holding the parent's node too, as CUDA
// does) are both holders, neither preempted; a low open of the high-held
// slice A is refused in the kernel, while the parent's node stays open to
// it.
func TestMIGSlicesHoldersAndRefusal(t *testing.T) {
	e, fm := migEnv(t)
	e.start()
	waitReady(t, e.d)
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool { return len(f.GPUs) == 2 })
	want := []struct {
		uuid, profile string
		gi            int
	}{{migUUIDA, "3g.40gb", 1}, {migUUIDB, "1g.10gb", 2}}
	for i, w := range want {
		g := f.GPUs[i]
		if g.Index != sliceIndex(fm, i) || g.Device != fm.Caps[i].Path || g.UUID != w.uuid {
			t.Errorf("slice %d: index %d device %s uuid %s; want %d %s %s", i, g.Index, g.Device, g.UUID, sliceIndex(fm, i), fm.Caps[i].Path, w.uuid)
		}
		if m := g.MIG; m == nil || m.Parent != 0 || m.ParentUUID != migParentUUID || m.ParentDevice != fm.Parent.Path ||
			m.GI != w.gi || m.CI != 0 || m.Profile != w.profile {
			t.Errorf("slice %d: mig %+v, want parent 0 %s %s, gi %d ci 0, %s", i, g.MIG, migParentUUID, fm.Parent.Path, w.gi, w.profile)
		}
		if g.Enforced == nil || !*g.Enforced {
			t.Errorf("slice %d not enforced", i)
		}
	}
	if len(f.LeftAlone) != 1 || f.LeftAlone[0].Device != fm.Parent.Path || !strings.Contains(f.LeftAlone[0].Reason, "2 slices") {
		t.Errorf("left alone: %+v, want the parent, its slices judged", f.LeftAlone)
	}

	reg := e.d.Registry()
	hi, _ := classified(t, reg, "mighigh", occupancy.High, "mig-high")
	lo, _ := classified(t, reg, "miglow", occupancy.Low, "mig-low")
	hi.doInt("open %s", fm.Parent.Path)
	hi.doInt("open %s", fm.Caps[0].Path)
	lo.doInt("open %s", fm.Parent.Path)
	lo.doInt("open %s", fm.Caps[1].Path)
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		return testutil.HolderPriority(f, 0, hi.pid()) == occupancy.High && testutil.HolderPriority(f, 1, lo.pid()) == occupancy.Low
	})
	time.Sleep(time.Second) // a wrong kill would come now
	if !testutil.Alive(hi.pid()) || !testutil.Alive(lo.pid()) {
		t.Fatalf("a holder of another slice was preempted: high alive %v, low alive %v", testutil.Alive(hi.pid()), testutil.Alive(lo.pid()))
	}

	lo2, _ := classified(t, reg, "miglow2", occupancy.Low, "mig-low2")
	if got := tryOpen(lo2, fm.Parent.Path); got != "ok" {
		t.Errorf("low open of the MIG parent's node: %q, want ok (the parent is not judged)", got)
	}
	if got := tryOpen(lo2, fm.Caps[0].Path); got != "operation not permitted" {
		t.Errorf("low open of the high-held slice A: %q, want refused", got)
	}
	if got := tryOpen(lo2, fm.Caps[1].Path); got != "ok" {
		t.Errorf("low open of the low-held slice B: %q, want ok", got)
	}
	if !testutil.Alive(hi.pid()) || !testutil.Alive(lo.pid()) {
		t.Fatal("a holder was preempted by the refused open")
	}
	// gpud explain names the slices and judges each on its own.
	ex, err := e.d.Explain(lo2.pid())
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.GPUs) != 2 || ex.GPUs[0].Allow || !ex.GPUs[1].Allow || ex.GPUs[0].MIG != "GPU 0 gi1 3g.40gb "+migUUIDA || ex.GPUs[1].MIG != "GPU 0 gi2 1g.10gb "+migUUIDB {
		t.Errorf("explain: %+v, want slice A denied, slice B allowed, both named", ex.GPUs)
	}
}

// A high open of the low-held slice B kills slice B's low holder only: the
// low holder of slice A (another slice of the same GPU, the same parent
// node held) lives on, and the kill record names slice B.
func TestMIGHighOpenKillsLowOfItsSliceOnly(t *testing.T) {
	e, fm := migEnv(t)
	e.start()
	waitReady(t, e.d)
	testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool { return len(f.GPUs) == 2 })
	reg := e.d.Registry()
	loA, _ := classified(t, reg, "miglowa", occupancy.Low, "mig-low-a")
	loB, _ := classified(t, reg, "miglowb", occupancy.Low, "mig-low-b")
	for i, h := range []*helper{loA, loB} {
		h.doInt("open %s", fm.Parent.Path)
		h.doInt("open %s", fm.Caps[i].Path)
	}
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		return testutil.HolderPriority(f, 0, loA.pid()) == occupancy.Low && testutil.HolderPriority(f, 1, loB.pid()) == occupancy.Low
	})
	hi, _ := classified(t, reg, "mighigh", occupancy.High, "mig-high")
	hi.doInt("open %s", fm.Parent.Path)
	hi.doInt("open %s", fm.Caps[1].Path)
	testutil.Eventually(t, 10*time.Second, "slice B's low holder is dead", func() bool { return !testutil.Alive(loB.pid()) })
	testutil.Eventually(t, 10*time.Second, "a kill record", func() bool { return len(records(e, preempt.ActionKill)) > 0 })
	time.Sleep(time.Second)
	if !testutil.Alive(loA.pid()) || !testutil.Alive(hi.pid()) {
		t.Fatalf("slice A's low holder alive %v, the high opener alive %v: want both", testutil.Alive(loA.pid()), testutil.Alive(hi.pid()))
	}
	rs := records(e, preempt.ActionKill)
	if len(rs) != 1 || rs[0].Victim.PID != loB.pid() || rs[0].GPU != sliceIndex(fm, 1) {
		t.Errorf("kill records: %+v, want one: slice B's low holder", rs)
	}
}
