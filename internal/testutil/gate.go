package testutil

import (
	"os"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/gpud/gpud/internal/cgroups"
)

// DeviceGates lists the device-cgroup programs attached at the cgroup v2
// root, by id: a test that stops gpud checks that its gate went (or stayed).
func DeviceGates(tb testing.TB) []ebpf.ProgramID {
	tb.Helper()
	root, _, err := cgroups.V2Root()
	if err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(root)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		tb.Fatal(err)
	}
	var ids []ebpf.ProgramID
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	slices.Sort(ids)
	return ids
}
