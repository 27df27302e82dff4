package bpf

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
)

// FillPending fills the gate's pending map with marks of tasks that do not
// exist (as a user's many live threads that opened a GPU node would), until
// the kernel refuses another; it returns how many it put.
func FillPending(tb testing.TB, m *Monitor) int {
	tb.Helper()
	n := 0
	for task := uint64(1 << 63); ; task += 64 {
		err := m.objs.Pending.Update(task, uint32(1), ebpf.UpdateNoExist)
		if err != nil {
			if errors.Is(err, ebpf.ErrKeyExist) {
				continue
			}
			if n == 0 {
				tb.Fatalf("filling pending: %v", err)
			}
			return n
		}
		n++
	}
}
