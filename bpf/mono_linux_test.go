package bpf

import (
	"testing"
)

// MonotonicNow is never ahead of CLOCK_MONOTONIC (the gate's confirmations
// rely on it) and keeps up with it.
func TestMonotonicNowNeverAhead(t *testing.T) {
	for i := 0; i < 100000; i++ {
		m := MonotonicNow()
		s := syscallMonotonic()
		if m > s {
			t.Fatalf("MonotonicNow %d is ahead of clock_gettime %d by %d ns", m, s, m-s)
		}
		if i%10000 == 0 && s-m > uint64(1e9) {
			// Generous: a preemption between the two reads.
			t.Fatalf("MonotonicNow %d behind clock_gettime %d by %d ns", m, s, s-m)
		}
	}
}
