package bpf

import (
	"testing"
	"time"
)

// TestPassedBoundAndLabel: the sweep's bound names the resync interval
// (or never), a hook's bound is its own, and each has its metric label.
func TestPassedBoundAndLabel(t *testing.T) {
	for _, tc := range []struct {
		st           HookStatus
		resync       time.Duration
		bound, label string
	}{
		{HookStatus{PassedFDs: PassedByKprobe}, time.Minute, PassedByKprobe, "kprobe"},
		{HookStatus{PassedFDs: PassedBySock}, 0, PassedBySock, "sock"},
		{HookStatus{PassedFDs: PassedBySyscalls}, 0, PassedBySyscalls, "syscalls"},
		{HookStatus{PassedFDs: PassedBySweep}, time.Minute, "sweep only: within 1m0s", "sweep"},
		{HookStatus{PassedFDs: PassedBySweep}, 0, "sweep only: never (--resync-interval 0)", "sweep"},
		{HookStatus{}, 0, "", ""},
	} {
		b := tc.st.PassedBound(tc.resync)
		if b != tc.bound || PassedLabel(b) != tc.label {
			t.Errorf("%+v, resync %s: bound %q label %q, want %q %q", tc.st, tc.resync, b, PassedLabel(b), tc.bound, tc.label)
		}
	}
}
