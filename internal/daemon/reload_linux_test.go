package daemon_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// tryOpen opens path in h and returns "ok" or the error.
func tryOpen(h *helper, path string) string {
	h.t.Helper()
	h.send("open %s cloexec", path)
	if !h.out.Scan() {
		h.t.Fatalf("helper %d: no answer", h.pid())
	}
	ans := h.out.Text()
	if strings.HasPrefix(ans, "err ") {
		return strings.TrimPrefix(ans, "err ")
	}
	h.send("close %s", ans)
	h.out.Scan()
	return "ok"
}

// A reload changes idle-after, the default class (of holders and of the
// gate's cgroups) and the grace, on the running daemon.
func TestReloadAppliesAtRunTime(t *testing.T) {
	e := sourcelessEnv(t)
	e.cfg.IdleAfter = time.Hour
	e.cfg.DefaultPriority = occupancy.Unmanaged
	e.start()
	reg := e.d.Registry()

	// A high-priority holder of GPU 0.
	hi, _ := classified(t, reg, "high", occupancy.High, "reload-high")
	hi.doInt("open %s", e.gpus[0].Path)

	// A container without the label, known to gpud (its class is the
	// default), and a process in it holding GPU 1.
	ddir, did, dcg := testutil.ContainerCgroup(t)
	reg.Put(workload.Workload{ContainerID: did, CgroupID: dcg, Name: "unlabeled", Priority: reg.Classify(did, nil)})
	lo := startHelper(t)
	testutil.JoinCgroup(t, ddir, lo.pid())
	lo.doInt("open %s", e.gpus[1].Path)
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return testutil.HolderPriority(f, 1, lo.pid()) == occupancy.Unmanaged && f.GPUs[1].State == occupancy.Busy
	})
	if got := tryOpen(lo, e.gpus[0].Path); got != "ok" {
		t.Fatalf("unmanaged open of a high-held GPU: %s", got)
	}

	if err := e.d.Reload(daemon.Reloadable{IdleAfter: time.Second, DefaultPriority: occupancy.Low, PreemptGrace: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if got := reg.DefaultPriority(); got != occupancy.Low {
		t.Errorf("registry default %q", got)
	}
	// The holder is low now, and the gate refuses its open of the high-held GPU.
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return testutil.HolderPriority(f, 1, lo.pid()) == occupancy.Low })
	if got := tryOpen(lo, e.gpus[0].Path); got != "operation not permitted" {
		t.Errorf("low open of a high-held GPU after the reload: %s", got)
	}
	// idle-after 1s: GPU 1 (no activity since its open) goes idle.
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return f.GPUs[1].State == occupancy.Idle })
	if f.GPUs[1].IdleSince == nil {
		t.Error("idle without idle_since")
	}
	// Monitoring through the same path.
	off := false
	if err := e.d.Reload(daemon.Reloadable{IdleAfter: time.Second, DefaultPriority: occupancy.Low, Monitoring: &off}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return !f.Monitoring })
	on := true
	if err := e.d.Reload(daemon.Reloadable{IdleAfter: time.Second, DefaultPriority: occupancy.Unmanaged, Monitoring: &on}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return f.Monitoring && testutil.HolderPriority(f, 1, lo.pid()) == occupancy.Unmanaged
	})

	// Invalid settings change nothing.
	for _, bad := range []daemon.Reloadable{
		{IdleAfter: 0, DefaultPriority: occupancy.Low},
		{IdleAfter: time.Second, DefaultPriority: "medium"},
		{IdleAfter: time.Second, DefaultPriority: occupancy.Low, PreemptGrace: -time.Second},
	} {
		if err := e.d.Reload(bad); !errors.Is(err, daemon.ErrConfig) {
			t.Errorf("Reload(%+v) = %v, want ErrConfig", bad, err)
		}
	}
	if got := reg.DefaultPriority(); got != occupancy.Unmanaged {
		t.Errorf("a refused reload changed the default to %q", got)
	}
}
