//go:build cgo

package gpumon_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// Fake GPU work measured as gpud measures a shared GPU (issue 30 item 7;
// root: cgroups and fake device nodes): two processes holding the fake
// /dev/nvidia0 open, each in its own cgroup, share GPU 0 about 50/50 in
// Monitor.Utilization; freezing one's cgroup (the freezer gpud's
// time-slicing uses) drops it to 0 and gives the other the GPU within a
// second, and thawing it shares the GPU again.
func TestGPUWorkFreezeOnTheDouble(t *testing.T) {
	testutil.RequireRoot(t)
	_, fake := testutil.MakeFakeGPUs(t, 1)
	double := testutil.NewNVMLDouble(t, "", testutil.NVMLGPU{Index: 0, Minor: 0, UUID: "GPU-work", MemoryTotal: 16 << 30})
	cgA, _ := testutil.Cgroup(t, "work-a")
	cgB, _ := testutil.Cgroup(t, "work-b")
	a := testutil.StartGPUWork(t, double, 0, fake[0].Path, cgA, 1<<30)
	b := testutil.StartGPUWork(t, double, 0, fake[0].Path, cgB, 1<<30)
	pa, pb := int32(a.PID), int32(b.PID)
	testutil.Eventually(t, 5*time.Second, "both holding the device node", func() bool {
		return holds(a.PID, fake[0].Path) && holds(b.PID, fake[0].Path)
	})

	m := &gpumon.Monitor{Lib: nvidia.New(nvidia.Load{Library: double.Library}), Log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
		ShareGPUs: func(gpu int) bool { return gpu == 0 }, ShareInterval: 100 * time.Millisecond}
	l := occupancy.NewLedger(m.Open([]occupancy.GPU{{Index: 0, Device: fake[0].Path, Minor: 0}}), time.Hour)
	m.Start(l)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	var last map[int32]uint32
	within := func(what string, d time.Duration, ok func(map[int32]uint32) bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			s, _, err := m.Utilization(0)
			if err == nil {
				last = s
				if s[pa]+s[pb] > 100 {
					t.Fatalf("shares %v over the GPU's 100 %%", s)
				}
				if ok(s) {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v; last shares %v (A %d, B %d), error %v", what, d, last, pa, pb, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	even := func(s map[int32]uint32) bool { return s[pa] >= 35 && s[pa] <= 65 && s[pb] >= 35 && s[pb] <= 65 }
	within("A and B about 50/50", 10*time.Second, even)

	frozen := time.Now()
	freeze(t, cgA, true)
	t.Cleanup(func() { freeze(t, cgA, false) })
	within("A frozen: A ~0, B ~100", time.Second, func(s map[int32]uint32) bool { return s[pa] == 0 && s[pb] >= 85 })
	t.Logf("A frozen: shares %v after %v", last, time.Since(frozen).Round(time.Millisecond))
	freeze(t, cgA, false)
	within("A thawed: 50/50 again", 5*time.Second, even)
}

func freeze(t *testing.T, cg string, on bool) {
	v := "0"
	if on {
		v = "1"
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.freeze"), []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
}

// holds reports whether process pid has path open.
func holds(pid int, path string) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if l, _ := os.Readlink(filepath.Join(dir, e.Name())); l == path {
			return true
		}
	}
	return false
}
