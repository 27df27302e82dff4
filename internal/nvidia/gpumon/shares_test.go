package gpumon

import (
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
)

// Per-process utilization for the time-slice scheduler: sampled only for
// the GPUs ShareGPUs asks, apart from the activity source; NOT_SUPPORTED
// on one GPU (as on a MIG-enabled GPU) degrades that source for that GPU
// only: its Utilization says why, its state shows the source failing, it
// is retried with backoff, and the other GPU's shares go on.
func TestSharesNotSupportedDegradesOneGPU(t *testing.T) {
	f := newFake()
	f.shares = map[int]map[uint32]uint32{0: {42: 60, 43: 40}, 1: {7: 100}, 2: {9: 100}}
	f.failing[1] = map[Source]error{SrcShares: fmt.Errorf("shares of GPU 1: %w", ErrNotSupported)}
	m := fast(f)
	m.ShareInterval = 10 * time.Millisecond
	m.ShareGPUs = func(gpu int) bool { return gpu != 2 }
	_, managed := run(t, m, gpus(3))

	want := map[int32]uint32{42: 60, 43: 40}
	testutil.Eventually(t, 5*time.Second, "GPU 0's shares", func() bool {
		got, at, err := m.Utilization(0)
		return err == nil && maps.Equal(got, want) && time.Since(at) < time.Second
	})
	testutil.Eventually(t, 5*time.Second, "GPU 1's shares failing, GPU 0 all ok", func() bool {
		_, _, err := m.Utilization(1)
		st := state(m, managed)
		n0, n1 := st.GPUs[0].NVML, st.GPUs[1].NVML
		return errors.Is(err, ErrNotSupported) && n1.State == StateDegraded && len(n1.Failing) == 1 &&
			n1.Failing[0].Source == "shares" && n0.State == StateOK && n0.ActivitySource == "nvml"
	})
	if _, _, err := m.Utilization(2); err == nil {
		t.Errorf("GPU 2 (not asked) has a utilization")
	}
	time.Sleep(300 * time.Millisecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	count := func(gpu int) (n int) {
		for _, s := range f.asked[gpu] {
			if s&SrcShares != 0 {
				n++
			}
		}
		return n
	}
	// 50 ms, doubling to 400 ms: a handful of tries, not one per 10 ms.
	if c0, c1, c2 := count(0), count(1), count(2); c1 > 8 || c0 < 3*c1 || c2 != 0 {
		t.Errorf("shares asked of GPU 0, 1, 2: %d, %d, %d times; want GPU 1 backing off, GPU 2 never", c0, c1, c2)
	}
	for _, s := range f.asked[0] {
		if s&SrcShares != 0 && s != SrcShares {
			t.Errorf("shares asked with %v: want them sampled on their own", s)
		}
	}
}
