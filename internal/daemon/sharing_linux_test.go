//go:build cgo

package daemon_test

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// sharingEnv is an enforcing env with the NVML double (two GPUs of
// 16 GiB) and a share book, as gpud runs with its DRA driver on.
func sharingEnv(t *testing.T) (*env, *testutil.NVMLDouble, *sharing.Book) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	e.cfg.Enforce = true
	e.cfg.FailOpenAfter = 30 * time.Second
	e.cfg.Reclaim = preempt.ReclaimNone
	e.cfg.DefaultPriority = occupancy.Unmanaged
	book := sharing.NewBook()
	e.cfg.Shares = book
	return e, double, book
}

// sharePod is a pod in kubelet's cgroup layout, known to gpud as the API
// server source would make it known, with one process (a helper) in its
// container.
type sharePod struct {
	uid, name string
	h         *helper
}

func (e *env) sharePod(name string, prio occupancy.Priority) *sharePod {
	e.t.Helper()
	uid, podID, ctr := testutil.PodCgroup(e.t, "burstable")
	e.d.Registry().Put(workload.Workload{PodUID: uid, Namespace: "team", Name: name, TaskID: "team/" + name, Priority: prio, CgroupID: podID})
	h := startHelper(e.t)
	testutil.JoinCgroup(e.t, ctr, h.pid())
	return &sharePod{uid: uid, name: name, h: h}
}

// claim is a prepared claim's share of GPU gpu for p, as the DRA driver
// records it.
func (p *sharePod) claim(e *env, gpu int, bytes uint64) sharing.Share {
	return sharing.Share{ClaimUID: "claim-" + p.uid, ClaimNamespace: "team", ClaimName: p.name + "-gpu", Request: "gpu",
		GPU: gpu, UUID: e.d.State().GPUs[gpu].UUID, Bytes: bytes, Pods: []sharing.PodRef{{UID: p.uid, Namespace: "team", Name: p.name}}}
}

// dead: the process has exited (a zombie of the test, or gone).
func dead(pid int) bool { return !testutil.Alive(pid) }

func shareOf(g v1.StateGPU, podUID string) (v1.StateShare, bool) {
	for _, s := range g.Shares {
		if s.PodUID == podUID {
			return s, true
		}
	}
	return v1.StateShare{}, false
}

// The case: a low pod's process uses 6 GiB on a 4 GiB share: it is
// warned (log, state, metrics) and left running while nobody needs the
// memory; when a high pod on that GPU needs memory it was promised, the low
// pod is preempted (killed, journaled under the share rule) and the high
// one untouched. A high pod over its own share is reported, never killed.
func TestShareOverIsWarnedThenPreemptedForAPodWithinItsShare(t *testing.T) {
	e, double, book := sharingEnv(t)
	e.start()
	low := e.sharePod("low", occupancy.Low)
	high := e.sharePod("high", occupancy.High)
	book.Set("claim-"+low.uid, []sharing.Share{low.claim(e, 0, 4<<30)})
	book.Set("claim-"+high.uid, []sharing.Share{high.claim(e, 0, 8<<30)})
	// The DRA driver prepares claims before their pods' containers start.
	testutil.Eventually(t, 10*time.Second, "GPU 0 shared", func() bool { return len(e.d.State().GPUs[0].Shares) == 2 })
	low.h.doInt("open %s", e.gpus[0].Path)
	high.h.doInt("open %s", e.gpus[0].Path)
	double.SetProcesses(t,
		testutil.NVMLProcess{GPU: nvmlIndex[0], PID: low.h.pid(), Memory: 6 << 30},
		testutil.NVMLProcess{GPU: nvmlIndex[0], PID: high.h.pid(), Memory: 1 << 30})

	// Over: warned, shown; 9 GiB free cover the 7 GiB the high pod was
	// promised and has not used, so nobody is preempted.
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		s, ok := shareOf(f.GPUs[0], low.uid)
		return ok && s.Over
	})
	g := f.GPUs[0]
	ls, _ := shareOf(g, low.uid)
	hs, _ := shareOf(g, high.uid)
	if !g.Shared || ls.RequestedBytes != 4<<30 || ls.UsedBytes != 6<<30 || ls.Priority != v1.Low || ls.Preempted ||
		hs.Over || hs.UsedBytes != 1<<30 || hs.Priority != v1.High || ls.PodName != "low" || ls.ClaimName != "low-gpu" {
		t.Fatalf("GPU 0 shared %v, low share %+v, high share %+v", g.Shared, ls, hs)
	}
	if f.GPUs[1].Shared || len(f.GPUs[1].Shares) != 0 {
		t.Errorf("GPU 1 has no share, shown as %+v", f.GPUs[1])
	}
	testutil.Eventually(t, 5*time.Second, "the warning logged", func() bool {
		return strings.Contains(e.logs.String(), "a pod is over its GPU memory share")
	})
	body := scrape(t, e)
	for _, want := range []string{
		`gpud_gpu_memory_share_bytes{UUID="GPU-6d2a0c51-0000-4000-8000-000000000000",claim="low-gpu",device="nvidia0",gpu="1",kind="requested",namespace="team",pod="low"} 4.294967296e+09`,
		`gpud_gpu_memory_share_bytes{UUID="GPU-6d2a0c51-0000-4000-8000-000000000000",claim="low-gpu",device="nvidia0",gpu="1",kind="used",namespace="team",pod="low"} 6.442450944e+09`,
		`gpud_gpu_memory_share_over{UUID="GPU-6d2a0c51-0000-4000-8000-000000000000",claim="low-gpu",device="nvidia0",gpu="1",namespace="team",pod="low"} 1`,
		`gpud_gpu_memory_share_over{UUID="GPU-6d2a0c51-0000-4000-8000-000000000000",claim="high-gpu",device="nvidia0",gpu="1",namespace="team",pod="high"} 0`,
		`gpud_gpu_memory_share_overs_total 1`,
		`gpud_gpu_memory_share_preemptions_total 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	time.Sleep(2 * time.Second) // two samples or more: still nobody needs the memory
	if dead(low.h.pid()) || len(records(e, preempt.ActionKill)) != 0 {
		t.Fatalf("the low pod was preempted while free memory covered every share (records %+v)", e.d.Journal().Recent())
	}
	if n := strings.Count(e.logs.String(), "a pod is over its GPU memory share"); n != 1 {
		t.Errorf("warned %d times for one going over, want once", n)
	}

	// The high pod needs memory it was promised: the GPU's use rises (its
	// allocations under way, the driver's) until 4 GiB are free, less than
	// the 7 GiB it has not used yet. The low pod over its share goes.
	double.Update(t, nvmlIndex[0], func(g *testutil.NVMLGPU) { g.MemoryUsed = 12 << 30 })
	testutil.Eventually(t, 10*time.Second, "the low pod preempted", func() bool { return dead(low.h.pid()) })
	var kill preempt.Record
	testutil.Eventually(t, 5*time.Second, "its kill journaled", func() bool {
		for _, r := range records(e, preempt.ActionKill) {
			kill = r
			return true
		}
		return false
	})
	if kill.Rule != preempt.RuleSharedHigh || kill.Victim.PID != low.h.pid() || kill.Victim.PodUID != low.uid || kill.Preemptor.PodUID != high.uid || kill.GPU != 0 {
		t.Errorf("kill record %+v, want the low pod's process under the share rule, for the high pod", kill)
	}
	if dead(high.h.pid()) {
		t.Fatal("the high pod was killed")
	}
	testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		s, ok := shareOf(f.GPUs[0], low.uid)
		return ok && s.Preempted
	})
	if !strings.Contains(scrape(t, e), `gpud_gpu_memory_share_preemptions_total 1`) {
		t.Error("share preemptions not counted")
	}

	// A high pod over its share, a low pod within its own needing memory:
	// the high one is reported, never chosen.
	other := e.sharePod("other", occupancy.Low)
	book.Set("claim-"+other.uid, []sharing.Share{other.claim(e, 0, 2<<30)})
	testutil.Eventually(t, 10*time.Second, "the new share known", func() bool {
		_, ok := shareOf(e.d.State().GPUs[0], other.uid)
		return ok
	})
	other.h.doInt("open %s", e.gpus[0].Path)
	double.SetProcesses(t, testutil.NVMLProcess{GPU: nvmlIndex[0], PID: high.h.pid(), Memory: 10 << 30})
	double.Update(t, nvmlIndex[0], func(g *testutil.NVMLGPU) { g.MemoryUsed = 16 << 30 })
	testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		s, ok := shareOf(f.GPUs[0], high.uid)
		return ok && s.Over && s.UsedBytes == 10<<30
	})
	time.Sleep(2 * time.Second) // two judgements or more
	if dead(high.h.pid()) || dead(other.h.pid()) {
		t.Fatalf("high alive %v, other low (within its share) alive %v: want both alive", !dead(high.h.pid()), !dead(other.h.pid()))
	}
	if n := len(records(e, preempt.ActionKill)); n != 1 {
		t.Errorf("%d kills, want only the first low pod's", n)
	}
}

// A process of a pod with a share on GPU 0 that opens GPU 1 is refused in
// the kernel; the same pod opens GPU 0, and a pod with no share opens GPU
// 1 but not the shared GPU 0 (#32 class 5). A host process holding a
// shared GPU outside every share is shown as a conflict.
func TestSharePodFencedToItsGPUs(t *testing.T) {
	e, _, book := sharingEnv(t)
	e.start()
	p := e.sharePod("fenced", occupancy.Low)
	free := e.sharePod("whole", occupancy.Low)
	book.Set("claim-"+p.uid, []sharing.Share{p.claim(e, 0, 4<<30)})
	testutil.Eventually(t, 10*time.Second, "the pod fenced to GPU 0", func() bool {
		return strings.Contains(tryOpen(p.h, e.gpus[1].Path), "operation not permitted")
	})
	if got := tryOpen(p.h, e.gpus[0].Path); got != "ok" {
		t.Errorf("the pod's open of its shared GPU: %s", got)
	}
	if got := tryOpen(free.h, e.gpus[1].Path); got != "ok" {
		t.Errorf("a pod with no share opening GPU 1: %s", got)
	}
	if got := tryOpen(free.h, e.gpus[0].Path); !strings.Contains(got, "operation not permitted") {
		t.Errorf("a pod with no share opening the shared GPU 0: %s", got)
	}
	host := startHelper(t)
	host.doInt("open %s", e.gpus[0].Path) // a host process on the shared GPU
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs[0].ShareConflicts) == 1
	})
	if c := f.GPUs[0].ShareConflicts[0]; c.PID != host.pid() || c.PodUID != "" {
		t.Errorf("conflict %+v, want the host process", c)
	}
	testutil.Eventually(t, 5*time.Second, "the conflict logged", func() bool {
		return strings.Contains(e.logs.String(), "a process holds a shared GPU outside every share")
	})

	// The claim released: the fence is lifted.
	book.Remove("claim-" + p.uid)
	testutil.Eventually(t, 10*time.Second, "the fence lifted", func() bool {
		return tryOpen(p.h, e.gpus[1].Path) == "ok"
	})
}

// Under --enforce=false the share rule warns and shows, and preempts
// nobody, as the open rules.
func TestShareNotEnforcedPreemptsNobody(t *testing.T) {
	e, double, book := sharingEnv(t)
	e.cfg.Enforce = false
	e.start()
	low := e.sharePod("low", occupancy.Low)
	high := e.sharePod("high", occupancy.High)
	book.Set("claim-"+low.uid, []sharing.Share{low.claim(e, 0, 4<<30)})
	book.Set("claim-"+high.uid, []sharing.Share{high.claim(e, 0, 8<<30)})
	testutil.Eventually(t, 10*time.Second, "GPU 0 shared", func() bool { return len(e.d.State().GPUs[0].Shares) == 2 })
	low.h.doInt("open %s", e.gpus[0].Path)
	high.h.doInt("open %s", e.gpus[0].Path)
	double.SetProcesses(t, testutil.NVMLProcess{GPU: nvmlIndex[0], PID: low.h.pid(), Memory: 6 << 30})
	double.Update(t, nvmlIndex[0], func(g *testutil.NVMLGPU) { g.MemoryUsed = 14 << 30 }) // 2 GiB free, 8 owed
	testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		s, ok := shareOf(f.GPUs[0], low.uid)
		return ok && s.Over
	})
	time.Sleep(2 * time.Second) // two judgements or more
	if dead(low.h.pid()) || len(records(e, preempt.ActionKill)) != 0 {
		t.Fatal("a pod over its share was preempted with enforcement off")
	}
}
