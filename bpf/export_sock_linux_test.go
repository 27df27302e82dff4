package bpf

import "testing"

// RefuseSock makes Loads during the test take err for the kernel's lack of
// the sock tracepoints.
func RefuseSock(t testing.TB, err error) {
	refuseSock = err
	t.Cleanup(func() { refuseSock = nil })
}
