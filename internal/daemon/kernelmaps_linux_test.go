package daemon_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/testutil"
)

// A kernel map the protection depends on, filled past 80 %, is reported:
// gpud_kernel_map_entries and _capacity on the metrics port, and the state
// file's kernel_maps (gpud status) with what a full one costs.
func TestKernelMapNearlyFullReported(t *testing.T) {
	testutil.RequireRoot(t)
	e := newEnv(t)
	addr := freeAddr(t)
	e.cfg.MetricsAddr = addr
	e.start()
	base := "http://" + addr
	testutil.Eventually(t, 15*time.Second, "gpud_kernel_map_capacity of cgroup_prio", func() bool {
		_, body, _ := testutil.HTTPGet(base + "/metrics")
		v, ok := sample(body, "gpud_kernel_map_capacity", `map="cgroup_prio"`)
		return ok && v == 65536
	})
	// Ids no cgroup has (as the node's own workloads would fill it: no
	// unprivileged user can, TestMapsLookalikeCgroupsTakeNoEntry).
	const fill = 60000
	mon := e.d.KernelMonitor()
	for i := 0; i < fill; i++ {
		if err := mon.SetCgroupPriority(1<<48+uint64(i), bpf.PrioLow); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	testutil.Eventually(t, 15*time.Second, "gpud_kernel_map_entries of cgroup_prio counts the fill", func() bool {
		_, body, _ := testutil.HTTPGet(base + "/metrics")
		v, ok := sample(body, "gpud_kernel_map_entries", `map="cgroup_prio"`)
		return ok && v >= fill
	})
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 15*time.Second, func(f *v1.StateFile) bool {
		return slices.ContainsFunc(f.KernelMaps, func(m v1.StateKernelMap) bool { return m.Name == bpf.MapCgroupPrio })
	})
	i := slices.IndexFunc(f.KernelMaps, func(m v1.StateKernelMap) bool { return m.Name == bpf.MapCgroupPrio })
	if m := f.KernelMaps[i]; m.Entries < fill || m.Capacity != 65536 || m.Full == "" {
		t.Errorf("state file's cgroup_prio: %+v", m)
	}
	if !testutil.Poll(time.Second, func() bool { return strings.Contains(e.logs.String(), "kernel map nearly full") }) {
		t.Errorf("no warning in the log:\n%s", e.logs.String())
	}
}
