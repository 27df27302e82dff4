package bpf_test

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/testutil"
)

// missingHas reports whether one of a HookStatus' Missing entries starts
// with prefix.
func missingHas(st bpf.HookStatus, prefix string) bool {
	return slices.ContainsFunc(st.Missing, func(s string) bool { return strings.HasPrefix(s, prefix) })
}

// The observe-only path, forced on this kernel (a kernel that refuses the
// gate, such as 5.10, takes it for real): Load succeeds, the refusal is
// reported, no GPU is protected and no open is ever refused, whatever the
// rules say; in syscalls mode sys_exit still reports each GPU open with
// its fd (check_opens), and in driver mode the hooks say that opens are
// missing.
func TestObserveOnly(t *testing.T) {
	bpf.RefuseGate(t, errors.New("pretended by the test"))
	_, gpus := testutil.MakeFakeGPUs(t, 2)
	m := loadMonitor(t, gpus)
	if err := m.GateErr(); err == nil || !strings.Contains(err.Error(), "the kernel refuses the gate: pretended by the test") {
		t.Fatalf("GateErr = %v, want the refusal", err)
	}
	st := m.Hooks()
	if !st.Complete || st.Gate == nil || !missingHas(st, "gate (observe-only: the kernel refuses the gate") {
		t.Errorf("syscalls-mode hooks without the gate = %+v, want complete, gate missing", st)
	}
	for i := range gpus {
		if m.Protected(uint32(i)) {
			t.Errorf("GPU %d protected without a gate", i)
		}
	}

	// Opens and closes are still observed, with their fds.
	f, _ := openObserved(t, m, gpus[1].Path, 1)
	fd := f.Fd()
	f.Close()
	if ev, ok := nextEvent(t, m, 2*time.Second); !ok || ev.Type != bpf.EventClose || ev.FD != int32(fd) {
		t.Fatalf("after close: %+v ok=%v, want close of fd %d", ev, ok, fd)
	}
	if g, err := os.Open("/dev/null"); err == nil {
		g.Close()
	}
	if ev, ok := nextEvent(t, m, 200*time.Millisecond); ok {
		t.Fatalf("event for a non-GPU file: %+v", ev)
	}

	// Rules that refuse on a kernel with the gate refuse nothing here.
	if err := m.Register(uint32(os.Getpid()), 0); err != nil {
		t.Fatal(err)
	}
	if err := m.SetEnforcing(true, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	lo, loID := cgroupDir(t, "", "observe")
	m.SetCgroupPriority(loID, bpf.PrioLow)
	m.SetGPUPolicy(0, bpf.GPUPolicy{High: 1}, bpf.MonotonicNow())
	if got := openFrom(t, lo, gpus[0].Path); got != "opened" {
		t.Errorf("low open of a high-held GPU without a gate: %q, want opened", got)
	}
	if n, _ := m.PendingMarks(); n != 0 {
		t.Errorf("pending marks = %d without a gate", n)
	}

	// Driver mode: gpud runs, the hooks say opens are missing and why.
	_, dgpus := testutil.MakeFakeDriverGPUs(t, 1)
	dm := loadDriverMonitor(t, dgpus)
	st = dm.Hooks()
	if st.Complete || !missingHas(st, "opens (the kernel refuses the gate: pretended by the test") || !missingHas(st, "gate (observe-only:") {
		t.Errorf("driver-mode hooks without the gate = %+v, want incomplete, opens and gate missing", st)
	}
	g, err := os.OpenFile(dgpus[0].Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if ev, ok := nextEvent(t, dm, 200*time.Millisecond); ok && ev.Type == bpf.EventOpen {
		t.Errorf("open event in driver mode without a gate (nothing reports it): %+v", ev)
	}
}
