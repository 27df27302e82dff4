package workload

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/occupancy"
)

func TestParseLabel(t *testing.T) {
	for in, want := range map[string]occupancy.Priority{"high": occupancy.High, "low": occupancy.Low} {
		if got, err := ParseLabel(in); err != nil || got != want {
			t.Errorf("ParseLabel(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "HIGH", "urgent", "unmanaged", strings.Repeat("x", 5000), "hi\x00gh",
		// Surrounding white space is not trimmed: exactly high or low.
		" low ", " high", "high\n", "low\r\n", "\thigh", "high ", "\u00a0low", "high\x00"} {
		_, err := ParseLabel(in)
		if !errors.Is(err, ErrBadLabel) {
			t.Errorf("ParseLabel(%q) err = %v, want ErrBadLabel", in, err)
		}
		if len(err.Error()) > 200 {
			t.Errorf("error for a huge label is %d bytes long", len(err.Error()))
		}
	}
}

func TestParseDefault(t *testing.T) {
	for _, ok := range []string{"high", "low", "unmanaged"} {
		if _, err := ParseDefault(ok); err != nil {
			t.Errorf("ParseDefault(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "unclassified", "medium"} {
		if _, err := ParseDefault(bad); err == nil {
			t.Errorf("ParseDefault(%q) accepted", bad)
		}
	}
}

func TestClassifyMalformedReportedOnce(t *testing.T) {
	var logs bytes.Buffer
	r := &Registry{Default: occupancy.Low, Log: slog.New(slog.NewTextHandler(&logs, nil))}
	for i := 0; i < 3; i++ {
		if got := r.Classify("c1", map[string]string{LabelPriority: "urgent"}); got != occupancy.Low {
			t.Fatalf("malformed label: %q, want the default", got)
		}
	}
	r.Classify("c2", map[string]string{LabelPriority: "bogus"})
	if n := r.MalformedSeen.Load(); n != 2 {
		t.Errorf("malformed seen = %d, want 2 (once per container)", n)
	}
	if n := strings.Count(logs.String(), "malformed priority label"); n != 2 {
		t.Errorf("logged %d times, want 2", n)
	}
	if got := r.Classify("c3", nil); got != occupancy.Low {
		t.Errorf("missing label: %q, want the default", got)
	}
	if got := (&Registry{}).Classify("c4", nil); got != occupancy.Unmanaged {
		t.Errorf("no default configured: %q, want unmanaged", got)
	}
}

func TestRegistryTracksCgroups(t *testing.T) {
	type change struct {
		id uint64
		p  occupancy.Priority
	}
	var changes []change
	r := &Registry{Default: occupancy.Unmanaged, OnChange: func(id uint64, p occupancy.Priority) { changes = append(changes, change{id, p}) }}
	r.Put(Workload{ContainerID: "a", Priority: occupancy.Low, CgroupID: 10, TaskID: "t"})
	r.Put(Workload{ContainerID: "b", Priority: occupancy.Unmanaged, CgroupID: 11})
	r.Put(Workload{ContainerID: "a", Priority: occupancy.High, CgroupID: 12}) // restarted: new cgroup
	r.Remove("a")
	r.Remove("missing")
	// An agent is never told to the kernel; an unmanaged workload is, as
	// a workload of no enforced class (a shared GPU refuses it).
	r.Put(Workload{ContainerID: "ag", Priority: occupancy.Unmanaged, Agent: true, CgroupID: 13})
	want := []change{{10, occupancy.Low}, {11, occupancy.Unmanaged}, {10, ""}, {12, occupancy.High}, {12, ""}, {13, ""}}
	if len(changes) != len(want) {
		t.Fatalf("changes %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("changes %v, want %v", changes, want)
		}
	}
}

func TestClassifyProc(t *testing.T) {
	r := &Registry{Default: occupancy.Low}
	r.Put(Workload{ContainerID: "hi", Priority: occupancy.High, CgroupID: 5})
	r.Put(Workload{Priority: occupancy.Low, CgroupID: 6}) // a bare cgroup (tests, static config)
	for _, tc := range []struct {
		info occupancy.ProcInfo
		want occupancy.Priority
	}{
		{occupancy.ProcInfo{ContainerID: "hi"}, occupancy.High},
		{occupancy.ProcInfo{CgroupID: 5}, occupancy.High},
		{occupancy.ProcInfo{CgroupID: 6}, occupancy.Low},
		{occupancy.ProcInfo{ContainerID: "unknown"}, occupancy.Low}, // default for containers
		{occupancy.ProcInfo{CgroupID: 1}, occupancy.Unmanaged},      // host process
	} {
		info := tc.info
		r.ClassifyProc(&info)
		if info.Priority != tc.want {
			t.Errorf("ClassifyProc(%+v) = %q, want %q", tc.info, info.Priority, tc.want)
		}
	}
}

// Lending forces a pod's class from kubelet's PodResources, which can list
// a pod before the informer has put it: the override applies to its
// processes all the same, and Explain says so.
func TestOverrideOfAPodNotYetKnown(t *testing.T) {
	r := &Registry{Default: occupancy.Unmanaged}
	r.Override("borrower-uid", occupancy.Low)
	info := occupancy.ProcInfo{PID: 7, PodUID: "borrower-uid", ContainerID: "c1"}
	r.ClassifyProc(&info)
	if info.Priority != occupancy.Low {
		t.Fatalf("class = %q, want low (the override)", info.Priority)
	}
	if _, ok, class, reason := r.Explain(info); ok || class != occupancy.Low || reason != ReasonOverride {
		t.Fatalf("Explain = ok %v, %q, %q; want not known, low, override", ok, class, reason)
	}
	other := occupancy.ProcInfo{PID: 8, PodUID: "other-uid"}
	r.ClassifyProc(&other)
	if other.Priority != occupancy.Unmanaged {
		t.Fatalf("another unknown pod = %q, want the default", other.Priority)
	}
	r.Override("borrower-uid", "")
	r.ClassifyProc(&info)
	if info.Priority != occupancy.Unmanaged {
		t.Fatalf("after the override is removed: %q, want the default", info.Priority)
	}
}

// A source skips a put only when the stored workload is the same: a label
// change must not hide behind a lending override of the same class (once
// the override goes, the new label's class must be there).
func TestHoldsComparesTheStoredClass(t *testing.T) {
	r := &Registry{Default: occupancy.Unmanaged}
	low := Workload{PodUID: "u", Namespace: "n", Name: "p", Priority: occupancy.Low}
	r.Put(low)
	r.Override("u", occupancy.High)
	high := low
	high.Priority = occupancy.High
	if r.Holds(high) {
		t.Fatal("Holds took the override for the stored class: a label change to high would be skipped")
	}
	if !r.Holds(low) {
		t.Fatal("Holds does not see the stored workload")
	}
	r.Put(high)
	r.Override("u", "")
	if w, _ := r.Lookup(occupancy.ProcInfo{PodUID: "u"}); w.Priority != occupancy.High {
		t.Fatalf("class %s after the override went, want the label's high", w.Priority)
	}
	if r.Holds(Workload{}) {
		t.Fatal("Holds of an empty workload")
	}
}

// A pod's liveness probe, known from the API server only, is kept when NRI
// or CRI puts the pod again without it.
func TestLivenessProbeKeptAcrossSources(t *testing.T) {
	r := &Registry{}
	r.Put(Workload{PodUID: "u1", Name: "p", Priority: occupancy.Low, LivenessProbe: true})
	r.Put(Workload{PodUID: "u1", Name: "p", Priority: occupancy.Low})
	if w, _ := r.Lookup(occupancy.ProcInfo{PodUID: "u1"}); !w.LivenessProbe {
		t.Error("the liveness probe was forgotten")
	}
	r.Put(Workload{ContainerID: "c1", Name: "d"})
	r.Put(Workload{PodUID: "u2", Name: "q"})
	if w, _ := r.Lookup(occupancy.ProcInfo{PodUID: "u2"}); w.LivenessProbe {
		t.Error("a pod without probes has one")
	}
}
