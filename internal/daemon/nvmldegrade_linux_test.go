//go:build cgo

// Each GPU degrades alone (issue 28 item 1), against the NVML double's
// awkward answers: a GPU lost at start, per-process utilization not
// supported on a MIG GPU, NVML_VALUE_NOT_AVAILABLE, event wait errors, a
// library/driver version mismatch, a slow call.

package daemon_test

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// A GPU lost before gpud starts (NVML's handle answers GPU_IS_LOST) does
// not turn NVML off for the node: the other GPU keeps its UUID, memory and
// health; the lost one is unhealthy and shown lost, with its reason, in
// the state file and the metrics.
func TestNVMLGPULostAtStart(t *testing.T) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	double.Update(t, nvmlIndex[1], func(g *testutil.NVMLGPU) { g.Lost = true })
	e.start()
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs) == 2 && f.GPUs[0].Memory != nil
	})
	if f.NVML == nil || f.NVML.Error != "" || f.NVML.Library != double.Library {
		t.Errorf("nvml = %+v, want loaded", f.NVML)
	}
	if g := f.GPUs[0]; g.UUID == "" || g.Health == nil || !g.Health.Healthy || g.NVML == nil || g.NVML.State != "ok" {
		t.Errorf("GPU 0 = uuid %q health %+v nvml %+v, want named, healthy, ok", g.UUID, g.Health, g.NVML)
	}
	g := f.GPUs[1]
	if g.Health == nil || g.Health.Healthy || !strings.Contains(g.Health.Reason, "fallen off the bus") {
		t.Errorf("GPU 1 health = %+v, want unhealthy: lost", g.Health)
	}
	if g.NVML == nil || g.NVML.State != "lost" || !strings.Contains(g.NVML.Reason, "fallen off the bus") {
		t.Errorf("GPU 1 nvml = %+v, want lost with its reason", g.NVML)
	}
	if body := scrape(t, e); !strings.Contains(body, `gpud_gpu_nvml_degraded{UUID="",device="nvidia1",gpu="1",source="device"} 1`) {
		t.Errorf("metrics lack GPU 1's lost device:\n%s", grepLines(body, "nvml"))
	}
}

// Per-process utilization NOT_SUPPORTED (a MIG-enabled GPU) does not turn
// compute activity off on the other GPU: a holder's second open of it is
// still no use.
func TestNVMLUtilizationNotSupportedOnOneGPU(t *testing.T) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	double.Update(t, nvmlIndex[1], func(g *testutil.NVMLGPU) { g.MIG = true })
	e.cfg.IdleAfter = 2 * time.Second
	e.start()
	h := startHelper(t)
	h.doInt("open %s", e.gpus[0].Path)
	testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs) == 1 && f.GPUs[0].State == occupancy.Idle && f.ActivitySource == "nvml"
	})
	time.Sleep(2500 * time.Millisecond) // samples of both GPUs
	h.doInt("open %s", e.gpus[0].Path)
	time.Sleep(1500 * time.Millisecond)
	st := e.d.State()
	if st.GPUs[0].State != occupancy.Idle || st.ActivitySource != "nvml" {
		t.Errorf("GPU 0 %s, activity source %q after a second open: want idle, nvml (GPU 1's NOT_SUPPORTED is GPU 1's)", st.GPUs[0].State, st.ActivitySource)
	}
}

// A process whose memory NVML does not know (NVML_VALUE_NOT_AVAILABLE)
// has no memory in the state file, not 2^64-1 bytes.
func TestNVMLProcessMemoryNotAvailable(t *testing.T) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	e.start()
	h := startHelper(t)
	h.doInt("open %s", e.gpus[0].Path)
	double.SetProcesses(t, testutil.NVMLProcess{GPU: nvmlIndex[0], PID: h.pid(), MemoryNA: true})
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs[0].Holders) == 1 && f.GPUs[0].Memory != nil
	})
	time.Sleep(2 * time.Second) // samples with the process listed
	st := e.d.State()
	if m := st.GPUs[0].Holders[0].MemoryBytes; m != nil {
		t.Errorf("holder memory = %d, want unknown (NVML_VALUE_NOT_AVAILABLE)", *m)
	}
	if m := f.GPUs[0].Memory; m.UsedBytes > m.TotalBytes {
		t.Errorf("GPU memory = %+v", m)
	}
}

// The health watch survives wait errors: timeouts, unknown errors
// (watched again with backoff, shown meanwhile), and a GPU_IS_LOST that
// names a GPU marks that GPU lost; an XID after them is still seen.
func TestNVMLHealthWatchSurvivesWaitErrors(t *testing.T) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	double.EventErr(t, "timeout", -1, 3)
	double.EventErr(t, "unknown", -1, 2)
	e.start()
	testutil.Eventually(t, 10*time.Second, "the wait errors shown", func() bool {
		return strings.Contains(e.logs.String(), "GPU health events not watched")
	})
	// One XID each half second: the double keeps 256 events, and a
	// watch backing off from its errors takes seconds to return.
	var last time.Time
	testutil.Eventually(t, 20*time.Second, "an XID after the wait errors", func() bool {
		if time.Since(last) > 500*time.Millisecond {
			last = time.Now()
			double.XID(t, nvmlIndex[0], 79)
		}
		g := e.d.State().GPUs[0]
		return g.Health != nil && !g.Health.Healthy && g.Health.Reason == "XID 79"
	})
	double.EventErr(t, "gpu_is_lost", nvmlIndex[1], 1)
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 20*time.Second, func(f *v1.StateFile) bool {
		return f.GPUs[1].NVML != nil && f.GPUs[1].NVML.State == "lost"
	})
	if h := f.GPUs[1].Health; h == nil || h.Healthy || !strings.Contains(h.Reason, "fallen off the bus") {
		t.Errorf("GPU 1 health = %+v, want lost", h)
	}
}

// NVML failing entirely (a library/driver version mismatch) leaves gpud
// running on GPU opens, each GPU shown degraded; Init is retried with
// backoff, and once it loads gpud starts again on it.
func TestNVMLVersionMismatchRetried(t *testing.T) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	double.SetMismatch(t, true)
	e.start()
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool { return len(f.GPUs) == 2 })
	if f.NVML == nil || !strings.Contains(f.NVML.Error, "mismatch") || f.ActivitySource != "opens" {
		t.Errorf("nvml = %+v, source %q; want the mismatch, opens", f.NVML, f.ActivitySource)
	}
	if n := f.GPUs[0].NVML; n == nil || n.State != "degraded" || !strings.Contains(n.Reason, "mismatch") {
		t.Errorf("GPU 0 nvml = %+v, want degraded: the mismatch", n)
	}
	if body := scrape(t, e); !strings.Contains(body, `source="library"} 1`) {
		t.Errorf("metrics lack the library source:\n%s", grepLines(body, "nvml"))
	}
	double.SetMismatch(t, false)
	testutil.Eventually(t, 20*time.Second, "NVML loads on a retry", func() bool {
		return strings.Contains(e.logs.String(), "NVML loads now")
	})
}

// One slow NVML call (2 s per call on one GPU, as on a loaded node) delays
// neither the other GPU's samples nor opens.
func TestNVMLSlowCallDelaysNothingElse(t *testing.T) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	e.start()
	testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool { return f.ActivitySource == "nvml" })
	for _, fn := range []string{"nvmlDeviceGetProcessUtilization", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetMigMode"} {
		double.Slow(t, fn, nvmlIndex[0], 2000)
	}
	time.Sleep(2 * time.Second) // GPU 0's samples are slow now
	h := startHelper(t)
	for i := 0; i < 3; i++ {
		start := time.Now()
		double.Compute(t, nvmlIndex[1], h.pid(), 60)
		testutil.Eventually(t, 15*time.Second, "GPU 1's sample", func() bool {
			return !e.d.Ledger().Snapshot(time.Now()).GPUs[1].LastActive.Before(start.Truncate(time.Microsecond))
		})
		if d := time.Since(start); d > 2500*time.Millisecond {
			t.Errorf("GPU 1's sample %d seen after %v, behind GPU 0's slow calls", i, d)
		}
		start = time.Now()
		h.doInt("open %s", e.gpus[0].Path)
		testutil.Eventually(t, 5*time.Second, "the open recorded", func() bool {
			hs := e.d.Ledger().Snapshot(time.Now()).GPUs[0].Holders
			return len(hs) == 1 && len(hs[0].FDs) == i+1
		})
		if d := time.Since(start); d > time.Second {
			t.Errorf("an open recorded after %v", d)
		}
	}
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
