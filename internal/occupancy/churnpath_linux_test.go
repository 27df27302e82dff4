package occupancy

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
)

// TestSingleThreaded: the task directory's link count tells a process of
// one thread (its fd table is the only one) from a threaded one.
func TestSingleThreaded(t *testing.T) {
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	if !singleThreaded(fmt.Sprintf("/proc/%d", c.Process.Pid)) {
		t.Errorf("sleep (one thread): singleThreaded false")
	}
	if singleThreaded("/proc/self") {
		t.Errorf("the test process (Go: several threads): singleThreaded true")
	}
	if singleThreaded("/proc/" + strconv.Itoa(1<<30)) {
		t.Errorf("no such process: singleThreaded true")
	}
}

// TestOpeningReadsSyscall: a thread asleep outside any open is not
// opening; a thread that does not exist is not either.
func TestOpeningReadsSyscall(t *testing.T) {
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	p := &ProcFS{Root: "/proc"}
	if p.Opening(1<<30, 1<<30) {
		t.Errorf("no such thread: Opening true")
	}
	pid := c.Process.Pid
	var b [128]byte
	for i := 0; i < 1000; i++ { // until it sleeps (it may still be starting)
		n, err := readSmall(fmt.Sprintf("/proc/%d/syscall", pid), b[:])
		if err != nil {
			t.Fatalf("reading syscall: %v", err)
		}
		if s := string(b[:n]); s != "running\n" && !p.Opening(pid, pid) {
			return
		}
	}
	t.Errorf("sleep %d: Opening true after 1000 reads", pid)
}

// sleeping starts `sleep 60` (stdin from stdin, when set) and waits until
// it sleeps, out of any open.
func sleeping(t *testing.T, stdin *os.File) int {
	t.Helper()
	c := exec.Command("sleep", "60")
	c.Stdin = stdin
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	pid := c.Process.Pid
	p := &ProcFS{Root: "/proc"}
	for deadline := time.Now().Add(5 * time.Second); p.Opening(pid, pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sleep %d: never out of an open", pid)
		}
	}
	return pid
}

// TestOpensSettledByALaterRead: a burst of opens and closes of one thread
// (the big node's churn) costs one fd-table read: the opens gated before
// a read that found the thread out of any open and nothing held are
// given up without another; later opens, other threads' and those of a
// process that holds the GPU are read as before.
func TestOpensSettledByALaterRead(t *testing.T) {
	gpus := zeroGPU()
	pid := sleeping(t, nil)
	tr := &Tracker{Ledger: NewLedger(gpus, time.Minute), Proc: &ProcFS{Root: "/proc", Devs: Devs(gpus)}}
	first := openEvent(pid, pid)
	tr.Handle(first)
	before := *first
	before.Mono++ // gated after the first, before its read
	tr.Handle(&before)
	if n := tr.OpenSettled.Load(); n != 1 {
		t.Fatalf("an open gated before a read that found nothing: %d settled, want 1", n)
	}
	tr.Handle(openEvent(pid, pid+1)) // another thread (none: read, given up)
	tr.Handle(openEvent(pid, pid))   // gated after the read
	if n, g := tr.OpenSettled.Load(), tr.OpenGiveUps.Load(); n != 1 || g != 4 {
		t.Errorf("later opens: %d settled, %d given up, want 1 and 4", n, g)
	}
	if len(tr.opening) != 0 || tr.Ledger.Version() != 0 {
		t.Errorf("%d opens pending, ledger version %d: want nothing recorded", len(tr.opening), tr.Ledger.Version())
	}

	// A process holding the GPU (stdin /dev/zero): every open is read.
	z, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	holder := sleeping(t, z)
	opened := 0
	tr = &Tracker{Ledger: NewLedger(gpus, time.Minute), Proc: &ProcFS{Root: "/proc", Devs: Devs(gpus)},
		Opened: func(ProcInfo, int, *bpf.Event) { opened++ }}
	first = openEvent(holder, holder)
	tr.Handle(first)
	before = *first
	before.Mono++
	tr.Handle(&before)
	if n := tr.OpenSettled.Load(); n != 0 || opened != 2 || len(tr.Ledger.FDs(holder, 0)) == 0 {
		t.Errorf("a holder's opens: %d settled, Opened %d times, ledger fds %v: want 0, 2, its fd", n, opened, tr.Ledger.FDs(holder, 0))
	}
}
