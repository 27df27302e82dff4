//go:build cgo

package daemon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/gate"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// #32 class 5: a GPU shared by memory is opened by its claimants, agents
// and host processes only. A workload without a share of it (a pod
// labelled low, one labelled high, an unlabelled one under
// --default-priority unmanaged, a container given the device node) is
// refused in the kernel; the same workloads still open a GPU that is not
// shared.
func TestSharedGPURefusesWorkloadsWithoutAShare(t *testing.T) {
	e, _, book := sharingEnv(t)
	e.start()
	claimant := e.sharePod("claimant", occupancy.Low)
	book.Set("claim-"+claimant.uid, []sharing.Share{claimant.claim(e, 0, 4<<30)})
	testutil.Eventually(t, 10*time.Second, "GPU 0 shared", func() bool { return len(e.d.State().GPUs[0].Shares) == 1 })

	low := e.sharePod("low", occupancy.Low)
	high := e.sharePod("high", occupancy.High)
	unlabelled := e.sharePod("unlabelled", occupancy.Unmanaged)
	ctrDir, ctrID := testutil.Cgroup(t, "ctr")
	e.d.Registry().Put(workload.Workload{ContainerID: "c0ffee" + strings.Repeat("0", 58), Name: "docker-ctr", Priority: occupancy.Unmanaged, CgroupID: ctrID})
	ctr := startHelper(t)
	testutil.JoinCgroup(t, ctrDir, ctr.pid())
	for _, w := range []struct {
		name string
		h    *helper
	}{{"low pod", low.h}, {"high pod", high.h}, {"unlabelled pod", unlabelled.h}, {"unlabelled container", ctr}} {
		if got := tryOpen(w.h, e.gpus[0].Path); !strings.Contains(got, "operation not permitted") {
			t.Errorf("the %s (no share) opening the shared GPU 0: %s, want EPERM", w.name, got)
		}
		if got := tryOpen(w.h, e.gpus[1].Path); got != "ok" {
			t.Errorf("the %s opening GPU 1 (not shared): %s", w.name, got)
		}
	}
	testutil.Eventually(t, 5*time.Second, "the refusal logged", func() bool {
		return strings.Contains(e.logs.String(), "refused a shared GPU to a workload without a share of it")
	})
	if body := scrape(t, e); !strings.Contains(body, "gpud_gpu_share_refusals_total ") || strings.Contains(body, "gpud_gpu_share_refusals_total 0\n") {
		t.Errorf("gpud_gpu_share_refusals_total does not count the refusals")
	}

	// Its claimant, an agent pod and a host process open it.
	if got := tryOpen(claimant.h, e.gpus[0].Path); got != "ok" {
		t.Errorf("the claimant opening its shared GPU: %s", got)
	}
	uid, podID, agentCtr := testutil.PodCgroup(t, "burstable")
	e.d.Registry().Put(workload.Workload{PodUID: uid, Namespace: "gpu-operator", Name: "dcgm-exporter", Priority: occupancy.Unmanaged, Agent: true, CgroupID: podID})
	agent := startHelper(t)
	testutil.JoinCgroup(t, agentCtr, agent.pid())
	if got := tryOpen(agent, e.gpus[0].Path); got != "ok" {
		t.Errorf("an agent pod opening the shared GPU: %s", got)
	}
	host := startHelper(t)
	if got := tryOpen(host, e.gpus[0].Path); got != "ok" {
		t.Errorf("a host process opening the shared GPU: %s", got)
	}
}

// A workload that held a GPU before it became shared (whatever its class)
// is killed and journaled under the intruder rule once a claim shares it;
// a host process holding it stays (a conflict, shown), and so does the
// claimant.
func TestHolderWithoutAShareKilledWhenGPUBecomesShared(t *testing.T) {
	e, _, book := sharingEnv(t)
	e.start()
	low := e.sharePod("early-low", occupancy.Low)
	high := e.sharePod("early-high", occupancy.High)
	unlabelled := e.sharePod("early-unlabelled", occupancy.Unmanaged)
	host := startHelper(t)
	defer func() {
		if t.Failed() {
			t.Logf("holders %+v", e.d.State().GPUs[0].Holders)
		}
	}()
	// The high pod on GPU 1: beside it the low one would be the table's.
	for _, h := range []*helper{low.h, unlabelled.h, host} {
		h.doInt("open %s", e.gpus[0].Path)
	}
	high.h.doInt("open %s", e.gpus[1].Path)
	testutil.Eventually(t, 10*time.Second, "the holders", func() bool {
		s := e.d.State()
		return len(s.GPUs[0].Holders) == 3 && len(s.GPUs[1].Holders) == 1
	})

	// One claim with a share of each GPU.
	claimant := e.sharePod("claimant", occupancy.Low)
	book.Set("claim-"+claimant.uid, []sharing.Share{claimant.claim(e, 0, 4<<30), claimant.claim(e, 1, 4<<30)})
	defer func() {
		if t.Failed() {
			t.Log(e.logs.String())
		}
	}()
	testutil.Eventually(t, 10*time.Second, "the holders without a share killed", func() bool {
		return dead(low.h.pid()) && dead(high.h.pid()) && dead(unlabelled.h.pid())
	})
	var victims []string
	testutil.Eventually(t, 5*time.Second, "their kills journaled", func() bool {
		victims = victims[:0]
		for _, r := range records(e, preempt.ActionKill) {
			if r.Rule == gate.IntruderRule {
				victims = append(victims, r.Victim.PodUID)
			}
		}
		return len(victims) == 3
	})
	for _, p := range []*sharePod{low, high, unlabelled} {
		found := false
		for _, v := range victims {
			found = found || v == p.uid
		}
		if !found {
			t.Errorf("no kill record for %s (records for %v)", p.name, victims)
		}
	}
	if dead(host.pid()) || dead(claimant.h.pid()) {
		t.Fatalf("host process alive %v, claimant alive %v: want both", !dead(host.pid()), !dead(claimant.h.pid()))
	}
	if got := tryOpen(claimant.h, e.gpus[0].Path); got != "ok" {
		t.Errorf("the claimant opening its shared GPU: %s", got)
	}
}
