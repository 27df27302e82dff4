package gate

import (
	"testing"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/workload"
)

// Explain gives a pod's process, on each GPU whose compute it shares, the
// compute scheduler's record of the pod (target, share, throttled time,
// frozen now and why); a GPU it does not share by compute has none.
func TestExplainComputeShare(t *testing.T) {
	const podUID = "1a2b3c4d-0000-1111-2222-333344445555"
	r := newRig(t, 0, 1)
	proc, cg := fakeProc(t, 4242, "train", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_333344445555.slice/cri-containerd-"+explainedCtr+".scope")
	r.c.Proc = proc
	r.reg.put(workload.Workload{PodUID: podUID, Namespace: "team", Name: "a", Priority: occupancy.Low, CgroupID: cg})
	want := v1.StateComputeShare{PodNamespace: "team", PodName: "a", PodUID: podUID, TargetPercent: 30, UsedPercent: 29.5,
		ThrottledSeconds: 4, State: "waiting", Frozen: true, Why: "waiting for its turn"}
	var asked []string
	r.c.ComputeShare = func(gpu int, uid string) (v1.StateComputeShare, bool) {
		asked = append(asked, uid)
		return want, gpu == 0
	}
	e, err := r.c.Explain(4242)
	if err != nil {
		t.Fatal(err)
	}
	if len(asked) == 0 || asked[0] != podUID {
		t.Fatalf("the scheduler was asked for pods %q, want %q", asked, podUID)
	}
	if g := e.GPUs[0]; g.Compute == nil || *g.Compute != want {
		t.Errorf("GPU 0's compute share: %+v, want %+v", g.Compute, want)
	}
	if g := e.GPUs[1]; g.Compute != nil {
		t.Errorf("GPU 1, not shared by compute, shows %+v", g.Compute)
	}
}
