package daemon_test

import (
	"bytes"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/status"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// try runs one helper command and returns its answer, error answers
// included ("err ...").
func (h *helper) try(format string, args ...any) string {
	h.t.Helper()
	h.send(format, args...)
	if !h.out.Scan() {
		h.t.Fatalf("helper %d: no answer to %q", h.pid(), fmt.Sprintf(format, args...))
	}
	return h.out.Text()
}

// startOddDaemon starts an enforcing daemon on devDir, with a high and a
// low cgroup classified, and returns it with a helper in each.
func startOddDaemon(t *testing.T, devDir, prefix, metricsAddr string) (*daemon.Daemon, string, *helper, *helper) {
	t.Helper()
	dir := t.TempDir()
	cfg := daemon.Config{Run: config.Run{DevDir: devDir, StateFile: filepath.Join(dir, "state.json"), StateDir: dir,
		IdleAfter: time.Minute, NodeName: "odd", Enforce: true, FailOpenAfter: 30 * time.Second, Hooks: testHooks(),
		DockerHost: "none", CRIEndpoint: "none", Reclaim: preempt.ReclaimNone, ReservationTTL: 30 * time.Second,
		MetricsAddr: metricsAddr}}
	logs := &testutil.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gpud's log:\n%s", logs.String())
		}
	})
	d, _ := runDaemon(t, cfg, debugLog(logs))
	waitReady(t, d)
	high, low := highAndLow(t, d.Registry(), prefix, "")
	return d, cfg.StateFile, high, low
}

// Device nodes as an operator may have them (issue 14, item 3):
//   - nvidia7 is a second name of nvidia0's device (same 1:7): one GPU,
//     index 0, with nvidia7 among its aliases; a process holding it through
//     nvidia7 makes GPU 0 busy (at the old code it was a GPU 7 of its own,
//     and GPU 0 showed free while held: lendable while in use);
//   - nvidia300's index is past the gate's old 256-entry arrays: held by
//     high priority, a low open of it is refused (EPERM). At the old code
//     every policy update for it failed (an error line per second) and the
//     low open succeeded.
func TestGateOddDeviceNodes(t *testing.T) {
	testutil.RequireRoot(t)
	devDir := t.TempDir()
	for _, n := range []struct {
		name         string
		major, minor uint32
	}{{"nvidia0", 1, 7}, {"nvidia7", 1, 7}, {"nvidia300", 10, 229}} {
		if err := unix.Mknod(filepath.Join(devDir, n.name), unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			t.Fatal(err)
		}
	}
	d, stateFile, high, low := startOddDaemon(t, devDir, "odd", "")

	f := testutil.WaitStateFile(t, stateFile, 3*time.Second, func(f *v1.StateFile) bool { return len(f.GPUs) > 0 })
	var idx []int
	for _, g := range f.GPUs {
		idx = append(idx, g.Index)
	}
	if len(f.GPUs) != 2 || f.GPUs[0].Index != 0 || f.GPUs[1].Index != 300 {
		t.Fatalf("GPUs %v, want [0 300] (nvidia7 is nvidia0's device)", idx)
	}
	if a := f.GPUs[0].Aliases; len(a) != 1 || filepath.Base(a[0]) != "nvidia7" {
		t.Errorf("GPU 0 aliases %v, want [.../nvidia7]", a)
	}
	// A kernel that refuses the gate runs gpud observe-only: no GPU is
	// enforced and nothing is refused (gpud says so in the state file).
	enforcing := !observeOnly(f)
	for _, g := range f.GPUs {
		if g.Enforced == nil || *g.Enforced != enforcing {
			t.Errorf("GPU %d: enforced %v, want %v (hooks %+v)", g.Index, g.Enforced, enforcing, f.Hooks)
		}
	}

	// Held through the alias: GPU 0 is busy, by the low holder.
	lfd := low.doInt("open %s", filepath.Join(devDir, "nvidia7"))
	testutil.WaitStateFile(t, stateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs) == 2 && f.GPUs[0].State == occupancy.Busy && holderIn(f.GPUs[0], low.pid())
	})
	low.do("close %d", lfd)

	// GPU 300 held by high priority: a low open is refused by the gate.
	high.doInt("open %s", filepath.Join(devDir, "nvidia300"))
	testutil.Eventually(t, 5*time.Second, "the condition", func() bool { return d.Ledger().Counts()[300].High == 1 })
	time.Sleep(5 * time.Millisecond) // the gate's confirmation (every ms)
	ans := low.try("open %s", filepath.Join(devDir, "nvidia300"))
	if refused := strings.Contains(ans, "operation not permitted"); refused != enforcing {
		t.Fatalf("low open of GPU 300 held by high priority: %q, want refused=%v", ans, enforcing)
	}
}

// observeOnly reports whether gpud says it runs without the gate (the
// kernel refuses it): rules not enforced, the gate among the missing hooks.
func observeOnly(f *v1.StateFile) bool {
	return !f.Enforcing && f.Hooks != nil && slices.ContainsFunc(f.Hooks.Missing, func(m string) bool {
		return strings.HasPrefix(m, "gate (observe-only: the kernel refuses the gate")
	})
}

// A GPU the gate cannot protect is shown, never silently open (issue 14,
// item 3): with more GPUs than the gate's maps hold (256), the one left out
// is marked "enforced": false in the state file, gpud_gpu_enforced is 0
// for it (1 for the rest), and gpud status names it. At the old code the
// state file, the metrics and gpud status had no such mark: the GPU looked
// like every other.
func TestGateUnprotectableGPUShown(t *testing.T) {
	testutil.RequireRoot(t)
	devDir := t.TempDir()
	const n = 257
	for i := 0; i < n; i++ {
		// Major 240 (local/experimental use): nobody opens these.
		if err := unix.Mknod(filepath.Join(devDir, fmt.Sprintf("nvidia%d", i)), unix.S_IFCHR|0o666, int(unix.Mkdev(240, uint32(i)))); err != nil {
			t.Fatal(err)
		}
	}
	addr := freeAddr(t)
	_, stateFile, _, _ := startOddDaemon(t, devDir, "unprot", addr)
	f := testutil.WaitStateFile(t, stateFile, 3*time.Second, func(f *v1.StateFile) bool { return len(f.GPUs) == n })
	var off []int
	for _, g := range f.GPUs {
		if g.Enforced == nil {
			t.Fatalf("GPU %d: no enforced mark in the state file", g.Index)
		}
		if !*g.Enforced {
			off = append(off, g.Index)
		}
	}
	if len(off) != 1 {
		t.Fatalf("GPUs marked not enforced: %v, want exactly one (the gate holds %d)", off, n-1)
	}
	var out bytes.Buffer
	if err := status.Render(&out, f, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("NOT ENFORCED (the priority rules are not applied to their opens): GPU %d", off[0])) {
		t.Errorf("gpud status does not name GPU %d as not enforced:\n%s", off[0], out.String())
	}
	code, body, _ := testutil.HTTPGet("http://" + addr + "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	zeros, ones := 0, 0
	for i := 0; i < n; i++ {
		v, ok := sample(body, "gpud_gpu_enforced", fmt.Sprintf(`gpu="%d"`, i))
		switch {
		case !ok:
			t.Fatalf("no gpud_gpu_enforced for GPU %d", i)
		case v == 0 && i == off[0]:
			zeros++
		case v == 1:
			ones++
		}
	}
	if zeros != 1 || ones != n-1 {
		t.Errorf("gpud_gpu_enforced: %d GPUs at 0 (want GPU %d alone), %d at 1 (want %d)", zeros, off[0], ones, n-1)
	}
}
