package occupancy

import (
	"slices"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
)

// A process whose thread-group leader exited (a zombie without an fd table)
// while another thread keeps the GPU open still holds the GPU: the targeted
// read and the scan of every process both find it. Before, /proc/<pid>/fd
// was empty and the holder was dropped at the next resync.
func TestGPUFDsLeaderExited(t *testing.T) {
	gpus := fakeGPUs(t)
	h := testutil.StartThreadHolder(t, gpus[1].Device, false, nil)
	p := &ProcFS{Root: "/proc", Devs: Devs(gpus)}
	fds, err := p.GPUFDs(h.PID())
	if err != nil {
		t.Fatal(err)
	}
	if got := fds[1]; !slices.Equal(got, []int32{int32(h.FD)}) {
		t.Fatalf("GPUFDs of a process whose leader exited = %v, want GPU 1: [%d]", fds, h.FD)
	}
	all, err := p.ScanAll()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, pf := range all {
		if pf.Info.PID == h.PID() {
			found = true
			if !slices.Equal(pf.FDs[1], []int32{int32(h.FD)}) || pf.Info.StartTime == 0 {
				t.Errorf("scan: %+v", pf)
			}
		}
	}
	if !found {
		t.Fatalf("the scan of every process missed pid %d (leader exited, a thread holds GPU 1)", h.PID())
	}
}

// A thread that unshared its fd table holds the GPU its leader closed: the
// targeted read (events, kills, the resync's second look at known holders)
// finds it in the thread's table.
func TestGPUFDsUnsharedThreadTable(t *testing.T) {
	gpus := fakeGPUs(t)
	h := testutil.StartThreadHolder(t, gpus[0].Device, true, nil)
	p := &ProcFS{Root: "/proc", Devs: Devs(gpus)}
	fds, err := p.GPUFDs(h.PID())
	if err != nil {
		t.Fatal(err)
	}
	if got := fds[0]; !slices.Equal(got, []int32{int32(h.FD)}) {
		t.Fatalf("GPUFDs = %v, want GPU 0: [%d] from the thread's own table", fds, h.FD)
	}
	// The resync keeps it: the ledger knew it, the scan misses it (its
	// leader's table is not empty), the second look finds it.
	l := NewLedger(gpus, 0)
	tr := &Tracker{Ledger: l, Proc: p}
	l.SetProcess(ProcFDs{Info: ProcInfo{PID: h.PID()}, FDs: fds}, time.Now())
	if err := tr.Resync(); err != nil {
		t.Fatal(err)
	}
	if got := l.FDTable()[h.PID()]; !slices.Equal(got[0], []int32{int32(h.FD)}) {
		t.Fatalf("after a resync the ledger has %v for pid %d, want GPU 0 kept", got, h.PID())
	}
}

// fakeGPUs makes two fake GPU nodes and returns them as the ledger's GPUs
// (discovery is internal/nvidia's, which imports this package).
func fakeGPUs(t *testing.T) []GPU {
	_, fakes := testutil.MakeFakeGPUs(t, 2)
	var gpus []GPU
	for _, f := range fakes {
		gpus = append(gpus, GPU{Index: f.Index, Device: f.Path, Major: f.Major, Minor: f.Minor})
	}
	return gpus
}
