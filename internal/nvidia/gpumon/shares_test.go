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

// Busy sums every reading, each for the time since the one before: two
// readings between two looks are both counted (keeping the last one only,
// the first was lost and the second stood for both). A failed reading or
// a gap starts the sums again from a new from; a process not named for a
// minute is dropped.
func TestBusySumsEveryReading(t *testing.T) {
	f := newFake()
	m := fast(f)
	m.ShareGPUs = func(int) bool { return true }
	m.Open(gpus(1))
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	read := func(at time.Time, shares map[uint32]uint32) {
		m.apply(0, SrcShares, Reading{Failed: map[Source]error{}, Shares: shares, SharesAt: at}, at)
	}
	check := func(what string, want map[int32]time.Duration, from, through time.Time) {
		t.Helper()
		got, f, th, err := m.Busy(0)
		if err != nil || !maps.Equal(got, want) || !f.Equal(from) || !th.Equal(through) {
			t.Errorf("%s: busy %v from %v through %v (%v); want %v from %v through %v",
				what, got, f.Sub(t0), th.Sub(t0), err, want, from.Sub(t0), through.Sub(t0))
		}
	}
	read(ms(0), map[uint32]uint32{7: 50})
	if _, _, _, err := m.Busy(0); !errors.Is(err, ErrNoSample) {
		t.Errorf("one reading: %v, want ErrNoSample (it is where the sums start)", err)
	}
	read(ms(200), map[uint32]uint32{7: 100})
	read(ms(400), map[uint32]uint32{7: 0, 8: 100})
	check("two readings", map[int32]time.Duration{7: 200 * time.Millisecond, 8: 200 * time.Millisecond}, ms(0), ms(400))
	// No sample: nothing used the GPU; the sums reach the reading's time.
	m.apply(0, SrcShares, Reading{Failed: map[Source]error{}}, ms(600))
	read(ms(700), map[uint32]uint32{7: 50})
	check("an empty reading, then 100 ms at 50 %", map[int32]time.Duration{7: 250 * time.Millisecond, 8: 200 * time.Millisecond}, ms(0), ms(700))

	m.apply(0, SrcShares, Reading{Failed: map[Source]error{SrcShares: errors.New("unknown error")}}, ms(900))
	if _, _, _, err := m.Busy(0); err == nil {
		t.Error("a failing source has busy times")
	}
	read(ms(1100), map[uint32]uint32{7: 100})
	read(ms(1300), map[uint32]uint32{7: 100})
	check("after a failure", map[int32]time.Duration{7: 200 * time.Millisecond}, ms(1100), ms(1300))
	read(ms(2400), map[uint32]uint32{7: 100}) // 1.1 s later: a gap
	read(ms(2500), map[uint32]uint32{7: 100})
	check("after a gap", map[int32]time.Duration{7: 100 * time.Millisecond}, ms(2400), ms(2500))

	for i := 1; i <= 61; i++ {
		read(ms(2500+1000*i), map[uint32]uint32{9: 10})
	}
	check("a minute without 7", map[int32]time.Duration{9: 6100 * time.Millisecond}, ms(2400), ms(63500))
}
