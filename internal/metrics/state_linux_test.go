package metrics

import (
	"slices"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSnapshotFromState(t *testing.T) {
	now := time.Unix(1000, 0)
	idle := now.Add(-30 * time.Second)
	f := v1.StateFile{
		Monitoring: true, Enforcing: true,
		GPUs: []v1.StateGPU{
			{Index: 0, State: v1.Lent, Holders: []v1.StateHolder{{PID: 7, Priority: "low", PodUID: "u1"}}},
			{Index: 1, State: v1.Idle, IdleSince: &idle},
		},
		Hooks: &v1.StateHooks{Mode: "driver", Complete: true, PassedFDs: bpf.PassedBySock},
		LeftAlone: []v1.StateLeftAlone{
			{Device: "/dev/nvidia2", Reason: "MIG enabled: the parent of 2 slices, each judged and lent as a GPU of its own"},
			{Device: "/dev/nvidia3", Reason: "MIG enabled: its slices could not be mapped: open /proc/driver/nvidia-caps/mig-minors: no such file or directory"},
		},
	}
	var s Snapshot
	s.FromState(f, now, func(h v1.StateHolder) (string, string, string) { return "ml", "pod-" + h.PodUID, "main" })
	if len(s.GPUs) != 2 || s.Lent != 1 || s.GPUs[1].IdleSeconds != 30 {
		t.Fatalf("GPUs %+v, lent %d: want both GPUs, one lent, GPU 1 idle 30 s", s.GPUs, s.Lent)
	}
	if h := s.GPUs[0].Holders; len(h) != 1 || h[0].Pod != "pod-u1" || h[0].Container != "main" {
		t.Fatalf("holders %+v: want named by names", h)
	}
	if !s.Monitoring || !s.Enforcing || s.HooksMode != "driver" || !s.HooksComplete || s.HooksPassedFDs != "sock" {
		t.Fatalf("switches and hooks %+v", s)
	}
	if len(s.LeftAlone) != 1 || s.LeftAlone["MIG enabled"] != 2 {
		t.Fatalf("left alone %v, want one reason, \"MIG enabled\": 2 (the details are not a label)", s.LeftAlone)
	}
	var none Snapshot
	none.FromState(v1.StateFile{}, now, nil)
	if none.HooksMode != "" || none.LeftAlone == nil || len(none.LeftAlone) != 0 {
		t.Fatalf("an empty document: %+v", none)
	}
}

func TestKernelMapsOf(t *testing.T) {
	got := KernelMapsOf([]bpf.MapUsage{{Name: "cgroup_prio", Entries: 3, Capacity: 8}})
	if !slices.Equal(got, []KernelMap{{Name: "cgroup_prio", Entries: 3, Capacity: 8}}) {
		t.Fatalf("kernel maps %+v", got)
	}
}

func TestRecordedObservesDoneKillsOnly(t *testing.T) {
	m := New("v1", func() Snapshot { return Snapshot{} })
	m.Recorded(v1.ActionKill, "done", 4)
	m.Recorded(v1.ActionKill, "failed", 9)
	m.Recorded("freeze", "done", 9)
	if n := testutil.ToFloat64(m.preemptions.WithLabelValues(v1.ActionKill)); n != 2 {
		t.Fatalf("kills counted %v, want 2", n)
	}
	if got := latencies(t, m); got != 1 {
		t.Fatalf("latencies observed %d, want 1 (the done kill's)", got)
	}
}

// latencies is how many preemption latencies m observed.
func latencies(t *testing.T, m *Metrics) uint64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == Namespace+"_preemption_latency_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no latency histogram")
	return 0
}
