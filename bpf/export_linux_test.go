package bpf

import "testing"

// RefuseGate makes Load, until the test ends, take err for the kernel's
// refusal of the gate: the observe-only path runs on a kernel that has
// everything.
func RefuseGate(t testing.TB, err error) {
	refuseGate = err
	t.Cleanup(func() { refuseGate = nil })
}
