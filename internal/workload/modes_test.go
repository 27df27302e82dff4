package workload

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/occupancy"
)

// Which preempt modes a workload may choose is the operator's (#32): a low
// pod's gpud.io/preempt-mode=freeze keeps its GPU memory only where
// --preempt-mode-namespaces allows freeze for its namespace; kill always
// counts; a Docker container (no namespace) only by
// --preempt-mode-containers. A refused choice is logged once and counted.
func TestPreemptModePolicy(t *testing.T) {
	var log bytes.Buffer
	r := &Registry{Default: occupancy.Low, Log: slog.New(slog.NewTextHandler(&log, nil)),
		Modes: PreemptModes{Namespaces: []string{"research=freeze", "*=checkpoint"}, Containers: []string{"checkpoint"}}}
	if err := r.Modes.Check(); err != nil {
		t.Fatal(err)
	}
	pod := func(ns, mode string) Workload {
		return Workload{PodUID: "11111111-1111-1111-1111-1111111111" + ns[:2], Namespace: ns, Name: "p", PreemptMode: mode}
	}
	ctr := func(mode string) Workload { return Workload{ContainerID: "c0ffee", Name: "c", PreemptMode: mode} }
	for _, tc := range []struct {
		w    Workload
		want string
	}{
		{pod("research", "freeze"), "freeze"},
		{pod("research", "checkpoint"), "checkpoint"}, // *=checkpoint
		{pod("team-a", "freeze"), ""},                 // not allowed: --preempt-mode
		{pod("team-a", "checkpoint"), "checkpoint"},
		{pod("team-a", "kill"), "kill"}, // always
		{pod("team-a", ""), ""},
		{pod("team-a", "Freeze"), "Freeze"}, // malformed: the caller's warning
		{ctr("freeze"), ""},
		{ctr("checkpoint"), "checkpoint"},
		{ctr("kill"), "kill"},
	} {
		if got := r.PreemptMode(tc.w); got != tc.want {
			t.Errorf("%s %q asking %q: %q, want %q", tc.w.Namespace, tc.w.ContainerID, tc.w.PreemptMode, got, tc.want)
		}
	}
	if n := r.ModesRefused.Load(); n != 2 {
		t.Errorf("refusals counted: %d, want 2", n)
	}
	r.PreemptMode(pod("team-a", "freeze")) // each preemption asks again: logged once
	if n := r.ModesRefused.Load(); n != 2 || strings.Count(log.String(), "may not choose") != 2 {
		t.Errorf("a refusal logged or counted twice: %d\n%s", n, log.String())
	}
	// Nothing allowed (the default): only kill counts.
	none := &Registry{}
	if got := none.PreemptMode(pod("research", "freeze")); got != "" {
		t.Errorf("no policy, freeze asked: %q", got)
	}
}

func TestPreemptModeChecks(t *testing.T) {
	for _, e := range []string{"research=freeze", "*=kill", "a-b=checkpoint"} {
		if err := CheckPreemptModeNamespace(e); err != nil {
			t.Errorf("%q: %v", e, err)
		}
	}
	for _, e := range []string{"research", "=freeze", "Research=freeze", "research=thaw", "research=", "a_b=kill"} {
		if err := CheckPreemptModeNamespace(e); err == nil {
			t.Errorf("%q accepted", e)
		}
	}
	if err := CheckPreemptModeChoice("sleep"); err == nil {
		t.Error("mode sleep accepted")
	}
}

// NRI and CRI carry the labels a pod was made with; the API server's are
// never older. A label changed since (the informer stored it) is not undone
// by the pod's next CreateContainer (#32): the newest label wins, and only
// a cgroup id the stored pod lacks is taken from the runtime's copy.
func TestRuntimeLabelsNeverOverruleTheAPIServer(t *testing.T) {
	const uid = "77777777-7777-7777-7777-777777777777"
	var told []occupancy.Priority
	r := &Registry{Default: occupancy.Low, OnChange: func(_ uint64, p occupancy.Priority) { told = append(told, p) }}
	// NRI first (creation-time label high), then the informer with the
	// newer label low, then NRI again at the next CreateContainer.
	r.Put(Workload{PodUID: uid, Namespace: "ns", Priority: occupancy.High, PreemptMode: "freeze"})
	r.Put(Workload{PodUID: uid, Namespace: "ns", Priority: occupancy.Low, LiveLabels: true})
	r.Put(Workload{PodUID: uid, Namespace: "ns", Priority: occupancy.High, PreemptMode: "freeze", CgroupID: 42})
	w, _ := r.Lookup(occupancy.ProcInfo{PodUID: uid})
	if w.Priority != occupancy.Low || w.PreemptMode != "" || w.CgroupID != 42 || !w.LiveLabels {
		t.Errorf("after NRI's stale labels: %+v, want the informer's low, no mode, cgroup 42", w)
	}
	if len(told) == 0 || told[len(told)-1] != occupancy.Low {
		t.Errorf("the gate was told %q, last want low", told)
	}
	// The informer itself updates it.
	r.Put(Workload{PodUID: uid, Namespace: "ns", Priority: occupancy.High, LiveLabels: true, CgroupID: 42})
	if w, _ := r.Lookup(occupancy.ProcInfo{PodUID: uid}); w.Priority != occupancy.High {
		t.Errorf("the informer's own update: %+v", w)
	}
}
