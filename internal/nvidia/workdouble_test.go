//go:build cgo

package nvidia

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// Fake GPU work on the NVML double (issue 30 item 7, no root): two busy
// processes on one GPU share it about evenly, the sum within 100 and the
// device's utilization their sum; a stopped one (it gets no CPU time, as
// a frozen one) drops out of the samples within a second and the other
// takes the GPU; a process listed without work has no samples; a
// MIG-enabled GPU answers NOT_SUPPORTED to both calls.
func TestNVMLDoubleWorkFollowsCPUTime(t *testing.T) {
	double := testutil.NewNVMLDouble(t, "", testutil.NVMLGPU{Index: 0, Minor: 0, UUID: "GPU-w", MemoryTotal: 16 << 30})
	lib := New(Load{Library: double.Library})
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lib.Shutdown)
	if unknown := lib.Annotate([]occupancy.GPU{{Index: 0, Device: "/dev/nvidia0", Minor: 0}}); len(unknown) != 0 {
		t.Fatalf("unknown = %v", unknown)
	}
	a := testutil.StartGPUWork(t, double, 0, "", "", 1<<30)
	b := testutil.StartGPUWork(t, double, 0, "", "", 1<<30)
	pa, pb := uint32(a.PID), uint32(b.PID)
	dev := lib.(*NVML).devices[0]

	var last map[uint32]uint32
	shares := func() map[uint32]uint32 {
		r := lib.SampleGPU(0, gpumon.SrcShares)
		if err := r.Failed[gpumon.SrcShares]; err != nil {
			t.Fatal(err)
		}
		last = r.Shares
		sum := uint32(0)
		for _, pct := range r.Shares {
			sum += pct
		}
		if sum > 100 {
			t.Fatalf("shares %v sum to %d %%, over the GPU's 100", r.Shares, sum)
		}
		return r.Shares
	}
	within := func(what string, d time.Duration, ok func(map[uint32]uint32) bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !ok(shares()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v; last shares %v (A %d, B %d)", what, d, last, pa, pb)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	even := func(s map[uint32]uint32) bool {
		return s[pa] >= 35 && s[pa] <= 65 && s[pb] >= 35 && s[pb] <= 65
	}
	within("A and B about 50/50", 10*time.Second, even)
	if u, ret := dev.GetUtilizationRates(); ret != nvml.SUCCESS || u.Gpu < 70 || u.Gpu > 100 {
		t.Errorf("device utilization = %+v (%v), want the shares' sum, 70..100", u, ret)
	}

	syscall.Kill(a.PID, syscall.SIGSTOP)
	t.Cleanup(func() { syscall.Kill(a.PID, syscall.SIGCONT) })
	within("A stopped: 0, B the whole GPU", time.Second, func(s map[uint32]uint32) bool {
		_, on := s[pa]
		return !on && s[pb] >= 85
	})
	syscall.Kill(a.PID, syscall.SIGCONT)
	within("A going again: 50/50", 5*time.Second, even)

	// Listed without work: memory, no utilization.
	double.SetProcesses(t, testutil.NVMLProcess{GPU: 0, PID: a.PID, Memory: 1 << 30})
	within("A listed without work: no samples", 2*time.Second, func(s map[uint32]uint32) bool {
		_, on := s[pa]
		return !on && s[pb] == 0
	})

	double.Update(t, 0, func(g *testutil.NVMLGPU) { g.MIG = true })
	r := lib.SampleGPU(0, gpumon.SrcShares)
	if err := r.Failed[gpumon.SrcShares]; !errors.Is(err, gpumon.ErrNotSupported) {
		t.Errorf("shares of a MIG-enabled GPU: %v, want not supported", err)
	}
	if _, ret := dev.GetUtilizationRates(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("utilization rates of a MIG-enabled GPU: %v, want NOT_SUPPORTED", fmt.Sprint(ret))
	}
}
