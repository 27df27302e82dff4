package daemon_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpud/gpud/bpf"
)

// TestBareProgramOnOpen: the freeze benchmark's floor (bare.c) freezes on
// an open of its FIFO, not before, and runs at gpud's
// preempting thread's class (SCHED_FIFO 1) when asked. A v1-style
// freezer.state in a plain directory stands in for a cgroup: the write
// and the read back are all the program does with it.
func TestBareProgramOnOpen(t *testing.T) {
	p := startBare(t)
	if os.Geteuid() == 0 {
		p.do(t, "rt")
		attr, err := unix.SchedGetAttr(p.cmd.Process.Pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		if attr.Policy != unix.SCHED_FIFO || attr.Priority != 1 {
			t.Fatalf("after rt: policy %d priority %d, want SCHED_FIFO 1", attr.Policy, attr.Priority)
		}
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "freezer.state")
	node := filepath.Join(dir, "nvidia0")
	if err := os.WriteFile(state, []byte("THAWED"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(node, 0o644); err != nil {
		t.Fatal(err)
	}
	p.do(t, "onopen %s freezev1 %s", node, dir)
	// The second answer read apart (no t.Fatal off the test's goroutine).
	done := make(chan string, 1)
	go func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.out.Scan()
		done <- p.out.Text()
	}()
	if b, _ := os.ReadFile(state); string(b) != "THAWED" {
		t.Fatalf("frozen before the node was opened: %q", b)
	}
	select {
	case <-done:
		t.Fatal("answered before the node was opened")
	case <-time.After(100 * time.Millisecond):
	}
	opened := uint64(bpf.MonotonicNow())
	f, err := os.OpenFile(node, os.O_RDWR, 0) // as the helper's opentimed
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	select {
	case ans := <-done:
		f := strings.Fields(ans)
		if len(f) != 2 {
			t.Fatalf("onopen freezev1: answered %q, want NS START", ans)
		}
		ns, err1 := strconv.ParseInt(f[0], 10, 64)
		start, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil || ns <= 0 || start < opened {
			t.Fatalf("onopen freezev1: answered %q, want its write → frozen in ns and its start (after the open at %d)", ans, opened)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no freeze 10 s after the open")
	}
	if b, _ := os.ReadFile(state); string(b) != "FROZEN" {
		t.Fatalf("after the open: freezer.state %q, want FROZEN", b)
	}
}
