package occupancy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"golang.org/x/sys/unix"
)

// nullGPU stands /dev/null in for GPU 0, and zeroGPU /dev/zero (for child
// processes, whose standard streams are /dev/null): the opens and fd tables
// are real, no privilege is needed.
func nullGPU() []GPU { return []GPU{{Index: 0, Device: "/dev/null", Major: 1, Minor: 3}} }
func zeroGPU() []GPU { return []GPU{{Index: 0, Device: "/dev/zero", Major: 1, Minor: 5}} }

func openEvent(tgid, tid int) *bpf.Event {
	return &bpf.Event{Type: bpf.EventOpen, TGID: uint32(tgid), PID: uint32(tid), FD: bpf.FDUnknown, GPU: 0, Mono: bpf.MonotonicNow()}
}

// An open the gate reported before its fd existed (--hooks driver): found
// in the fd table, the process is recorded with its fd.
func TestPendingOpenFoundInFDTable(t *testing.T) {
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gpus := nullGPU()
	l := NewLedger(gpus, time.Minute)
	opened := 0
	tr := &Tracker{Ledger: l, Proc: &ProcFS{Root: "/proc", Devs: Devs(gpus)}, Opened: func(ProcInfo, int, *bpf.Event) { opened++ }}
	ev := openEvent(os.Getpid(), unix.Gettid())
	tr.Handle(ev)
	fds := l.FDs(os.Getpid(), 0)
	if len(fds) == 0 || opened != 1 {
		t.Fatalf("ledger fds %v, Opened called %d times: want the process with its fds, once", fds, opened)
	}
	if got := tr.confirmable(ev.Mono + 10); got != ev.Mono+10 || len(tr.opening) != 0 {
		t.Errorf("resolved open still pending (%d) or capping confirmations (%d)", len(tr.opening), got)
	}
}

// An open whose thread is still inside the open syscall stays pending and,
// when the gate counted it high, holds the gate's confirmations back; once the thread is out of it with
// no GPU fd (the open failed, or it was closed at once), it is dropped
// without waiting for the retries to run out.
func TestPendingOpenWaitsForTheOpener(t *testing.T) {
	// The shell blocks in openat on the FIFO until a writer comes.
	pid, fifo, proc := blockedOpener(t, "exec sleep 600")
	gpus := zeroGPU()
	tr := &Tracker{Ledger: NewLedger(gpus, time.Minute), Proc: proc}
	ev := openEvent(pid, pid)
	ev.PPID = bpf.OpenMarkedHigh
	tr.Handle(ev)
	if len(tr.opening) != 1 {
		t.Fatalf("open of a thread still in openat: %d pending, want 1", len(tr.opening))
	}
	if got := tr.confirmable(ev.Mono + 10); got != ev.Mono-1 {
		t.Errorf("confirmable = %d, want %d (just before the pending open)", got, ev.Mono-1)
	}
	// The same open, not counted high by the gate, holds nothing back.
	other := &Tracker{Ledger: NewLedger(gpus, time.Minute), Proc: proc}
	other.Handle(openEvent(pid, pid))
	if len(other.opening) != 1 || other.confirmable(ev.Mono+10) != ev.Mono+10 {
		t.Errorf("an open not marked high: %d pending, confirmable %d, want 1 pending and no cap", len(other.opening), other.confirmable(ev.Mono+10))
	}
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for deadline := time.Now().Add(10 * time.Second); len(tr.opening) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pending open never dropped after %d tries", tr.opening[0].tries)
		}
		tr.resolveDue(time.Now().Add(time.Hour)) // every retry due
	}
	if tr.OpenGiveUps.Load() != 1 || len(tr.Ledger.FDTable()) != 0 {
		t.Errorf("give-ups %d, ledger %v: want the open dropped, nothing held", tr.OpenGiveUps.Load(), tr.Ledger.FDTable())
	}
	if got := tr.confirmable(ev.Mono + 10); got != ev.Mono+10 {
		t.Errorf("confirmable = %d after the open was dropped, want %d", got, ev.Mono+10)
	}
}

// inSyscall: pid's thread is blocked in a syscall (not "running").
func inSyscall(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "syscall"))
	return err == nil && !strings.HasPrefix(string(b), "running")
}

// Opens of one thread reported while an earlier one of the same GPU waits
// are folded into it (one fd-table read answers for all of them): the
// pending list stays at one entry, the earliest high open still caps the
// confirmations, an open of another kind (not marked high) stays apart,
// and the fd found resolves them together.
func TestPendingOpensOfOneThreadCoalesce(t *testing.T) {
	// The shell blocks in openat on the FIFO, then opens /dev/zero (the
	// stand-in GPU) and keeps it.
	pid, fifo, proc := blockedOpener(t, "exec 4</dev/zero; exec sleep 600")
	gpus := zeroGPU()
	opened := 0
	tr := &Tracker{Ledger: NewLedger(gpus, time.Minute), Proc: proc, Opened: func(ProcInfo, int, *bpf.Event) { opened++ }}
	first := openEvent(pid, pid)
	first.PPID = bpf.OpenMarkedHigh
	tr.Handle(first)
	for i := 0; i < 100; i++ {
		ev := openEvent(pid, pid)
		ev.PPID = bpf.OpenMarkedHigh
		tr.Handle(ev)
	}
	if len(tr.opening) != 1 || tr.OpenCoalesced.Load() != 100 {
		t.Fatalf("101 opens of one thread: %d pending, %d coalesced; want 1 and 100", len(tr.opening), tr.OpenCoalesced.Load())
	}
	if got := tr.confirmable(first.Mono + 1e9); got != first.Mono-1 {
		t.Errorf("confirmable = %d, want %d (just before the earliest high open)", got, first.Mono-1)
	}
	plain := openEvent(pid, pid)
	tr.Handle(plain)
	if len(tr.opening) != 2 {
		t.Fatalf("an open not marked high was folded into a high one: %d pending, want 2", len(tr.opening))
	}
	other := openEvent(pid, pid+1) // a thread the process does not have: resolved (dropped) on its own
	other.PPID = bpf.OpenMarkedHigh
	tr.Handle(other)
	if tr.OpenCoalesced.Load() != 100 || tr.OpenGiveUps.Load() != 1 {
		t.Fatalf("another thread's open: %d coalesced, %d given up; want it on its own (100, 1)", tr.OpenCoalesced.Load(), tr.OpenGiveUps.Load())
	}
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for deadline := time.Now().Add(10 * time.Second); len(tr.Ledger.FDs(pid, 0)) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the fd never resolved the coalesced opens (%d pending)", len(tr.opening))
		}
		tr.resolveDue(time.Now().Add(time.Hour))
	}
	if opened == 0 || opened > 2 {
		t.Errorf("Opened called %d times for 102 opens in 2 pending entries: want 1 or 2", opened)
	}
}

// blockedOpener starts a shell blocked in its open of a FIFO (until a
// writer opens it), which then runs then; it returns the shell's PID, the
// FIFO and a ProcFS for the stand-in GPU /dev/zero.
func blockedOpener(t *testing.T, then string) (int, string, *ProcFS) {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "exec 3<"+fifo+"; "+then)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	proc := &ProcFS{Root: "/proc", Devs: Devs(zeroGPU())}
	for deadline := time.Now().Add(10 * time.Second); !proc.Opening(pid, pid) || !inSyscall(pid); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the shell never blocked in its open")
		}
	}
	return pid, fifo, proc
}
