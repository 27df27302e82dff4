//go:build cgo

package daemon_test

import (
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
)

// Sharers are judged by class (the rule table's shared/high row): a high
// sharer that needs the memory of its share preempts the low sharer over
// its share and not the one within it while that is enough; when the high
// sharer needs more than the over-share sharers held, the low sharer
// within its share goes too. Journaled under the row, for the high pod.
func TestHighSharerNeedPreemptsLowSharersOverShareFirst(t *testing.T) {
	e, double, book := sharingEnv(t)
	e.start()
	in := e.sharePod("low-in", occupancy.Low)
	over := e.sharePod("low-over", occupancy.Low)
	high := e.sharePod("high", occupancy.High)
	book.Set("claim-"+in.uid, []sharing.Share{in.claim(e, 0, 4<<30)})
	book.Set("claim-"+over.uid, []sharing.Share{over.claim(e, 0, 4<<30)})
	book.Set("claim-"+high.uid, []sharing.Share{high.claim(e, 0, 8<<30)})
	testutil.Eventually(t, 10*time.Second, "GPU 0 shared", func() bool { return len(e.d.State().GPUs[0].Shares) == 3 })
	for _, p := range []*sharePod{in, over, high} {
		p.h.doInt("open %s", e.gpus[0].Path)
	}
	// The case: the low sharer 2 GiB over its share, the GPU full,
	// the high sharer 6 GiB short of its share.
	double.SetProcesses(t,
		testutil.NVMLProcess{GPU: nvmlIndex[0], PID: in.h.pid(), Memory: 4 << 30},
		testutil.NVMLProcess{GPU: nvmlIndex[0], PID: over.h.pid(), Memory: 6 << 30},
		testutil.NVMLProcess{GPU: nvmlIndex[0], PID: high.h.pid(), Memory: 2 << 30})
	double.Update(t, nvmlIndex[0], func(g *testutil.NVMLGPU) { g.MemoryUsed = 16 << 30 })
	testutil.Eventually(t, 10*time.Second, "the over-share low sharer preempted", func() bool { return dead(over.h.pid()) })
	// Its 6 GiB freed (NVML says so a sample later: the rule waits) cover
	// the need.
	double.SetProcesses(t,
		testutil.NVMLProcess{GPU: nvmlIndex[0], PID: in.h.pid(), Memory: 4 << 30},
		testutil.NVMLProcess{GPU: nvmlIndex[0], PID: high.h.pid(), Memory: 2 << 30})
	double.Update(t, nvmlIndex[0], func(g *testutil.NVMLGPU) { g.MemoryUsed = 10 << 30 })
	time.Sleep(3 * time.Second) // past the settling, two judgements or more
	if dead(in.h.pid()) || dead(high.h.pid()) {
		t.Fatalf("in-share low alive %v, high alive %v: want both alive", !dead(in.h.pid()), !dead(high.h.pid()))
	}
	kills := records(e, preempt.ActionKill)
	if len(kills) != 1 || kills[0].Rule != preempt.RuleSharedHigh || kills[0].Victim.PodUID != over.uid || kills[0].Preemptor.PodUID != high.uid {
		t.Fatalf("kills %+v, want the over-share low sharer's under %q, for the high sharer", kills, preempt.RuleSharedHigh)
	}

	// The high sharer needs 6 GiB again and no sharer is over its share
	// (the memory is used outside the shares): the low sharer within its
	// share goes now.
	double.Update(t, nvmlIndex[0], func(g *testutil.NVMLGPU) { g.MemoryUsed = 15 << 30 })
	testutil.Eventually(t, 10*time.Second, "the in-share low sharer preempted", func() bool { return dead(in.h.pid()) })
	if dead(high.h.pid()) {
		t.Fatal("the high sharer was killed")
	}
	testutil.Eventually(t, 5*time.Second, "its kill journaled", func() bool {
		for _, r := range records(e, preempt.ActionKill) {
			if r.Victim.PodUID == in.uid {
				return r.Rule == preempt.RuleSharedHigh && r.Preemptor.PodUID == high.uid
			}
		}
		return false
	})
}
