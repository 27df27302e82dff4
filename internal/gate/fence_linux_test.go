package gate

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
)

func gpuSet(gpus ...int) bpf.GPUSet {
	var s bpf.GPUSet
	for _, g := range gpus {
		s.Add(g)
	}
	return s
}

func TestFenceSharesFencesPodsThenSharesTheGPU(t *testing.T) {
	r := newRig(t, 0, 1, 2)
	r.ledger.hold(1, r.pod(200, 20, occupancy.High), r.pod(101, 11, occupancy.Low))
	r.c.Drained(1000)
	if p, _ := r.kernel.gpuPolicy(1); p != (bpf.GPUPolicy{High: 1, Low: 1}) {
		t.Fatalf("GPU 1 before sharing: %+v", p)
	}

	r.c.FenceShares([]int{1}, map[uint64][]int{11: {1, 2}, 10: {1}})
	if ops := r.kernel.ops(); !slices.Equal(ops, []string{"fence 10 1", "fence 11 2"}) {
		t.Fatalf("kernel fence operations %v", ops)
	}
	if r.kernel.fenced[11] != gpuSet(1, 2) || r.kernel.fenced[10] != gpuSet(1) {
		t.Fatalf("fences %v", r.kernel.fenced)
	}
	if r.kernel.newFenceOnShared != 0 {
		t.Fatal("a claimant was fenced in after its GPU was shared: the kernel refused it meanwhile")
	}
	// Its holders are together whatever their class: the share rule judges.
	if p, _ := r.kernel.gpuPolicy(1); p != (bpf.GPUPolicy{Shared: true}) {
		t.Fatalf("GPU 1 shared: %+v", p)
	}
	if p, _ := r.kernel.gpuPolicy(0); p.Shared {
		t.Fatal("GPU 0 shared")
	}

	// The same again: nothing reaches the kernel.
	pushes := r.kernel.pushCount()
	r.c.FenceShares([]int{1}, map[uint64][]int{10: {1}, 11: {1, 2}})
	if ops := r.kernel.ops(); len(ops) != 0 || r.kernel.pushCount() != pushes {
		t.Fatalf("unchanged fences: operations %v, %d policy pushes", ops, r.kernel.pushCount()-pushes)
	}

	// Pod 11's share on GPU 2 gone.
	r.c.FenceShares([]int{1}, map[uint64][]int{10: {1}, 11: {1}})
	if ops := r.kernel.ops(); !slices.Equal(ops, []string{"fence 11 2"}) || r.kernel.fenced[11] != gpuSet(1) {
		t.Fatalf("kernel fence operations %v, fence %v", ops, r.kernel.fenced[11])
	}

	// Pod 10 gone, GPU 1 no longer shared.
	r.c.FenceShares(nil, map[uint64][]int{11: {1}})
	if ops := r.kernel.ops(); !slices.Equal(ops, []string{"unfence 10 1"}) {
		t.Fatalf("kernel fence operations %v", ops)
	}
	if p, _ := r.kernel.gpuPolicy(1); p != (bpf.GPUPolicy{High: 1, Low: 1}) {
		t.Fatalf("GPU 1 no longer shared: %+v", p)
	}
}

func TestFenceRefusedByTheKernelIsTriedAgain(t *testing.T) {
	r := newRig(t, 0)
	r.kernel.failFence[12] = true
	r.c.FenceShares([]int{0}, map[uint64][]int{12: {0}})
	r.c.FenceShares([]int{0}, map[uint64][]int{12: {0}})
	if ops := r.kernel.ops(); !slices.Equal(ops, []string{"fence 12 1", "fence 12 1"}) {
		t.Fatalf("kernel fence operations %v: want the failed fence tried at the next judgement", ops)
	}
	if !strings.Contains(r.logs.String(), "fencing a sharing pod to its GPUs") {
		t.Fatalf("the failure is not said: %s", r.logs)
	}
}

func TestSharedGPUIsNotJudgedByTheTable(t *testing.T) {
	r := newRig(t, 0)
	high, low := r.pod(200, 20, occupancy.High), r.pod(101, 11, occupancy.Low)
	r.ledger.hold(0, high, low)
	var opened []int
	r.c.SharedOpened = func(gpu int) { opened = append(opened, gpu) }
	r.c.FenceShares([]int{0}, map[uint64][]int{20: {0}, 11: {0}})
	r.c.Judge()

	r.c.HandleEvent(event(bpf.EventGateHigh, 0, high, 1000))
	r.c.Opened(low, 0, event(bpf.EventOpen, 0, low, 1000))
	r.c.Opened(high, 0, event(bpf.EventOpen, 0, high, 1000))
	r.c.Rejudge("x")
	r.noPreemption()
	if !slices.Equal(opened, []int{0, 0}) {
		t.Fatalf("share judgement asked for %v, want GPU 0 at each open", opened)
	}
	if got := r.loans.takeBacks(); len(got) != 0 {
		t.Fatalf("take-backs %v on a shared GPU", got)
	}

	// A workload without a share is refused by the kernel: counted every
	// time, logged once, never queued for the GPU.
	intruder := r.pod(301, 31, occupancy.Low)
	r.c.HandleEvent(event(bpf.EventDeny, 0, intruder, 2000))
	r.c.HandleEvent(event(bpf.EventDeny, 0, intruder, 3000))
	if n := r.c.ShareRefusals.Load(); n != 2 {
		t.Fatalf("share refusals %d, want 2", n)
	}
	if n := strings.Count(r.logs.String(), "refused a shared GPU"); n != 1 {
		t.Fatalf("logged %d times, want once", n)
	}
	if len(r.exec.refusals()) != 0 || r.c.Denials.Load() != 0 {
		t.Fatal("a share refusal was recorded as a table refusal")
	}
	r.ledger.release(0)
	r.c.Drained(10_000)
	if _, ok := r.c.Reservation(0); ok {
		t.Fatal("a shared GPU was reserved for a workload without a share")
	}
}

func TestPreemptIntrudersSparesAgentsAndHost(t *testing.T) {
	r := newRig(t, 0)
	pod := r.pod(200, 20, occupancy.High)
	host := occupancy.ProcInfo{PID: 9, Comm: "python", Priority: occupancy.Unclassified}
	agent := occupancy.ProcInfo{PID: 7, ContainerID: "dcgm", Agent: true}
	if n := r.c.PreemptIntruders(0, []occupancy.ProcInfo{host, pod, agent}); n != 1 {
		t.Fatalf("PreemptIntruders: %d, want 1", n)
	}
	if p := r.onePreemption(); p.rule != IntruderRule || !slices.Equal(p.pids(), []int{200}) {
		t.Fatalf("preemption %+v: want the pod without a share, whatever its class", p)
	}
	if n := r.c.PreemptIntruders(0, []occupancy.ProcInfo{pod}); n != 0 {
		t.Fatalf("PreemptIntruders again: %d new", n)
	}
}
