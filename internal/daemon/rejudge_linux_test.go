package daemon_test

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// rejudgeEnv is an enforcing daemon with no Docker or CRI source: the
// tests put workloads in the registry as a source would.
func rejudgeEnv(t *testing.T) *env {
	e := sourcelessEnv(t)
	e.cfg.DefaultPriority = occupancy.Unmanaged
	e.start()
	return e
}

// holderIn starts a helper in a new container-like cgroup holding gpu; the
// container is known to gpud only by its cgroup (its class the default).
func containerHolder(t *testing.T, e *env, gpu int) (h *helper, id string, cgID uint64) {
	t.Helper()
	dir, id, cgID := testutil.ContainerCgroup(t)
	h = startHelper(t)
	testutil.JoinCgroup(t, dir, h.pid())
	h.doInt("open %s", e.gpus[gpu].Path)
	return h, id, cgID
}

// highHolder starts a high-priority holder of GPU 0.
func highHolder(t *testing.T, e *env, name string) (*helper, *workload.Registry) {
	t.Helper()
	reg := e.d.Registry()
	hi, _ := classified(t, reg, name, occupancy.High, name)
	hi.doInt("open %s", e.gpus[0].Path)
	return hi, reg
}

func waitDead(t *testing.T, e *env, pid int, what string) preempt.Record {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, what, func() bool { return !testutil.Alive(pid) })
	var rec preempt.Record
	testutil.Eventually(t, 10*time.Second, what+": its record", func() bool {
		for _, r := range records(e, preempt.ActionKill) {
			if r.Victim.PID == pid {
				rec = r
				return true
			}
		}
		return false
	})
	return rec
}

// A holder whose class becomes known (or changes) while it holds is judged
// in its new class: a low-priority holder beside a high-priority one is
// killed and recorded, whichever came first; the high one is untouched.
func TestRejudgeWhenClassChanges(t *testing.T) {
	e := rejudgeEnv(t)
	// GPU 0: a high holder first, then a holder whose class is not known
	// yet (it got past the gate unclassified).
	hi, reg := highHolder(t, e, "rejudge-high")
	late, lateID, lateCG := containerHolder(t, e, 0)
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		for _, h := range f.GPUs[0].Holders {
			if h.PID == late.pid() {
				return h.Priority == occupancy.Unmanaged && h.OpenedBeforeClassified
			}
		}
		return false
	})
	if ex, err := e.d.Explain(late.pid()); err != nil || !strings.Contains(ex.BeforeClassified, "before gpud knew its workload") {
		t.Fatalf("explain of the holder that got in unclassified: %+v, %v", ex, err)
	}
	time.Sleep(200 * time.Millisecond)
	if !testutil.Alive(late.pid()) {
		t.Fatal("an unmanaged holder beside a high one was killed")
	}
	// Its label arrives: low.
	start := time.Now()
	reg.Put(workload.Workload{ContainerID: lateID, CgroupID: lateCG, Name: "late", Priority: occupancy.Low})
	r := waitDead(t, e, late.pid(), "the late-classified low holder dies")
	t.Logf("class known -> holder dead and recorded: %v", time.Since(start))
	if !strings.Contains(r.Rule, "class known after the open") || r.Preemptor.PID != hi.pid() || r.Result != "done" {
		t.Errorf("record %+v", r)
	}
	if !testutil.Alive(hi.pid()) {
		t.Fatal("the high holder died")
	}
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return len(f.Preemptions) > 0 })
	if !strings.Contains(string(f.Preemptions[len(f.Preemptions)-1]), "class known after the open") {
		t.Errorf("the state file's last preemption does not say why: %s", f.Preemptions[len(f.Preemptions)-1])
	}

	// GPU 1: a low holder first; then another holder of GPU 1 turns out to
	// be high (its label changed from low to high): the low one dies.
	lo, loID, loCG := containerHolder(t, e, 1)
	reg.Put(workload.Workload{ContainerID: loID, CgroupID: loCG, Name: "lo", Priority: occupancy.Low})
	up, upID, upCG := containerHolder(t, e, 1)
	reg.Put(workload.Workload{ContainerID: upID, CgroupID: upCG, Name: "up", Priority: occupancy.Low})
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return testutil.HolderPriority(f, 1, lo.pid()) == occupancy.Low && testutil.HolderPriority(f, 1, up.pid()) == occupancy.Low
	})
	time.Sleep(200 * time.Millisecond)
	if !testutil.Alive(lo.pid()) || !testutil.Alive(up.pid()) {
		t.Fatal("two low holders of one GPU: one was killed")
	}
	reg.Put(workload.Workload{ContainerID: upID, CgroupID: upCG, Name: "up", Priority: occupancy.High})
	r = waitDead(t, e, lo.pid(), "the low holder beside a holder relabelled high dies")
	if r.Preemptor.PID != up.pid() {
		t.Errorf("record names preemptor %d, want %d", r.Preemptor.PID, up.pid())
	}
	if !testutil.Alive(up.pid()) {
		t.Fatal("the relabelled high holder died")
	}
}

// A new default class re-judges the holders that take it: an unlabelled
// container's holder beside a high one dies when the default becomes low.
func TestRejudgeWhenDefaultChanges(t *testing.T) {
	e := rejudgeEnv(t)
	hi, reg := highHolder(t, e, "rejudge-default-high")
	plain, id, cg := containerHolder(t, e, 0)
	reg.Put(workload.Workload{ContainerID: id, CgroupID: cg, Name: "unlabelled", Priority: reg.Classify(id, nil)})
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return testutil.HolderPriority(f, 0, plain.pid()) == occupancy.Unmanaged })

	if err := e.d.Reload(daemon.Reloadable{IdleAfter: time.Minute, DefaultPriority: occupancy.Low}); err != nil {
		t.Fatal(err)
	}
	waitDead(t, e, plain.pid(), "the unlabelled holder, low by the new default, dies")
	if !testutil.Alive(hi.pid()) {
		t.Fatal("the high holder died")
	}
}

// Monitoring off turns the rules off too, and says so (state file,
// metric); a low holder that got in meanwhile beside a high one is judged
// when monitoring comes back on.
func TestMonitoringOffAndBackOn(t *testing.T) {
	e := rejudgeEnv(t)
	reg := e.d.Registry()
	hi, _ := highHolder(t, e, "monitoring-high")
	lo, _ := classified(t, reg, "monitoring-low", occupancy.Low, "monitoring-low")
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return f.Enforcing && testutil.HolderPriority(f, 0, hi.pid()) == occupancy.High
	})
	if got := tryOpen(lo, e.gpus[0].Path); got != "operation not permitted" {
		t.Fatalf("low open of a high-held GPU with monitoring on: %s", got)
	}

	if err := e.d.SetMonitoring(false); err != nil {
		t.Fatal(err)
	}
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return !f.Monitoring })
	if f.Enforcing {
		t.Error("state file says enforcing with monitoring off")
	}
	if v := gauge(t, e, "gpud_enforcing"); v != 0 {
		t.Errorf("gpud_enforcing = %v with monitoring off, want 0", v)
	}
	// Off means off: the open gets through, as the state file says.
	lo.doInt("open %s", e.gpus[0].Path)
	time.Sleep(200 * time.Millisecond)
	if !testutil.Alive(lo.pid()) {
		t.Fatal("a holder was killed while monitoring was off")
	}

	if err := e.d.SetMonitoring(true); err != nil {
		t.Fatal(err)
	}
	waitDead(t, e, lo.pid(), "the low holder that got in while monitoring was off dies when it is back on")
	if !testutil.Alive(hi.pid()) {
		t.Fatal("the high holder died")
	}
	if v := gauge(t, e, "gpud_enforcing"); v != 1 {
		t.Errorf("gpud_enforcing = %v with monitoring back on, want 1", v)
	}
}

// gauge reads one unlabelled gauge from the daemon's registry.
func gauge(t *testing.T, e *env, name string) float64 {
	t.Helper()
	mfs, err := e.d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// A gpud that starts (or restarts) on a GPU shared by a high and a low
// container judges them once its sources have listed: the low holder dies,
// the high one lives.
func TestRejudgeAtStart(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimNone)
	low := runContainer(t, e, "start-low", "gpud.io/priority=low")
	high := runContainer(t, e, "start-high", "gpud.io/priority=high")
	hp, lp := high.hold(0), low.hold(0)
	e.start()
	r := waitDead(t, e, lp, "the low holder beside a high one when gpud starts")
	if r.Preemptor.PID != hp || !testutil.Alive(hp) {
		t.Fatalf("record %+v; high holder alive %v", r, testutil.Alive(hp))
	}
}
