//go:build cgo

// gpud loads the NVML double (internal/nvidia/nvmldouble) as it loads the
// driver's libnvidia-ml: --nvml-library, a checked file held open, dlopen.
// Without cgo gpud has no NVML, and nothing to test here.

package daemon_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/prometheus/common/expfmt"
)

// withNVMLDouble makes e's gpud load the double, which answers for e's
// two fake GPUs with NVML indexes that are not their device numbers (NVML
// index 1 is /dev/nvidia0), 16 GiB each.
func withNVMLDouble(e *env) *testutil.NVMLDouble {
	double := testutil.NewNVMLDouble(e.t, "",
		testutil.NVMLGPU{Index: 1, Minor: int(e.gpus[0].Minor), UUID: "GPU-6d2a0c51-0000-4000-8000-000000000000", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 16 << 30},
		testutil.NVMLGPU{Index: 0, Minor: int(e.gpus[1].Minor), UUID: "GPU-6d2a0c51-0000-4000-8000-000000000001", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 16 << 30},
	)
	e.cfg.UseNVML = true
	e.cfg.NVMLLibrary = double.Library
	return double
}

// nvmlIndex of fake GPU 0 and 1 in withNVMLDouble.
var nvmlIndex = map[int]int{0: 1, 1: 0}

// With NVML, activity is compute: a holder's first open starts its use,
// its later opens do not, NVML's samples naming it do. The state file
// says where NVML came from, each GPU's memory and each holder's memory
// and last activity.
func TestActivityIsComputeWithNVML(t *testing.T) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	e.cfg.IdleAfter = 2 * time.Second
	e.start()
	h := startHelper(t)
	h.doInt("open %s", e.gpus[0].Path)
	double.SetProcesses(t, testutil.NVMLProcess{GPU: nvmlIndex[0], PID: h.pid(), Memory: 5 << 30})
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs) == 2 && f.GPUs[0].State == occupancy.Idle && len(f.GPUs[0].Holders) == 1 &&
			f.GPUs[0].Holders[0].MemoryBytes != nil && f.ActivitySource == "nvml"
	})
	g := f.GPUs[0]
	if f.NVML == nil || f.NVML.Library != double.Library || f.NVML.DriverVersion != "570.86.15" {
		t.Errorf("nvml = %+v, want the double's library and version", f.NVML)
	}
	if g.UUID != "GPU-6d2a0c51-0000-4000-8000-000000000000" || g.Memory == nil || g.Memory.TotalBytes != 16<<30 || g.Memory.UsedBytes != 5<<30 || g.Memory.FreeBytes != 11<<30 {
		t.Errorf("GPU 0: uuid %s memory %+v, want 16 GiB with 5 used", g.UUID, g.Memory)
	}
	if hd := g.Holders[0]; *hd.MemoryBytes != 5<<30 || hd.LastActive == nil || hd.LastActive.Before(hd.OpenedAt.Add(-time.Second)) {
		t.Errorf("holder: %+v, want 5 GiB and its open as last activity", hd)
	}
	if g.Health == nil || !g.Health.Healthy {
		t.Errorf("health = %+v, want healthy", g.Health)
	}

	// Another open by the same process is no use of the GPU (a framework
	// probing its device): the GPU stays idle.
	h.doInt("open %s", e.gpus[0].Path)
	time.Sleep(1500 * time.Millisecond) // a sample or more
	if st := e.d.Ledger().Snapshot(time.Now()).GPUs[0].State; st != occupancy.Idle {
		t.Fatalf("GPU 0 is %s after a second open by its holder, want idle", st)
	}
	// Its compute is.
	double.Compute(t, nvmlIndex[0], h.pid(), 80)
	f = testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return f.GPUs[0].State == occupancy.Busy
	})
	if la := f.GPUs[0].Holders[0].LastActive; la == nil || time.Since(*la) > 5*time.Second {
		t.Errorf("holder's last activity %v, want the sample's", la)
	}
}

// NVML failing: activity falls back to GPU opens, and gpud says so once,
// not once a second.
func TestNVMLFailingFallsBackToOpens(t *testing.T) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	e.cfg.IdleAfter = time.Second
	e.start()
	// The driver goes away under the loaded library: every call fails.
	if err := os.Remove(filepath.Join(double.Dir, "nvml-double.txt")); err != nil {
		t.Fatal(err)
	}
	h := startHelper(t)
	h.doInt("open %s", e.gpus[0].Path)
	time.Sleep(3500 * time.Millisecond) // three or more failing samples
	// Each GPU's failing sources, once each (per GPU: each degrades
	// alone), not once a second.
	n := strings.Count(e.logs.String(), "NVML sampling failing")
	if n < 2 || n > 8 {
		t.Fatalf("NVML failure reported %d times, want once per GPU and source:\n%s", n, e.logs.String())
	}
	// Opens count as activity: a new open makes the idle GPU busy.
	st := e.d.Ledger().Snapshot(time.Now())
	if st.GPUs[0].State != occupancy.Idle {
		t.Fatalf("GPU 0 is %s after idle-after with no activity, want idle", st.GPUs[0].State)
	}
	h.doInt("open %s", e.gpus[0].Path)
	testutil.Eventually(t, 10*time.Second, "an open makes GPU 0 busy again", func() bool {
		return e.d.Ledger().Snapshot(time.Now()).GPUs[0].State == occupancy.Busy
	})
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool { return f.ActivitySource == "opens" })
	if again := strings.Count(e.logs.String(), "NVML sampling failing"); again != n {
		t.Errorf("NVML failure reported %d times, then %d: want no repeat while retried with backoff", n, again)
	}
}

// An XID that is a GPU's fault, a double-bit ECC error or a GPU fallen off
// the bus makes it unhealthy (shown, counted); an application's XID is
// counted only.
func TestGPUHealthFromNVMLEvents(t *testing.T) {
	e := newEnv(t)
	double := withNVMLDouble(e)
	e.start()
	// Events before gpud registered are not delivered (as NVML's): repeat.
	testutil.Eventually(t, 10*time.Second, "an application's XID is counted", func() bool {
		double.XID(t, nvmlIndex[1], 13)
		g := e.d.State().GPUs[1]
		return g.Health != nil && g.Health.Events > 0
	})
	// GPU 0's memory is sampled before it falls off the bus: a lost GPU
	// is not asked again, so on a slow machine an XID 79 that came first
	// would leave its memory unknown (and the metric rightly absent).
	memTotal := `gpud_gpu_memory_total_bytes{UUID="GPU-6d2a0c51-0000-4000-8000-000000000000",device="nvidia0",gpu="1"} 1.7179869184e+10`
	testutil.Eventually(t, 10*time.Second, "GPU 0's memory sampled", func() bool {
		return strings.Contains(scrape(t, e), memTotal)
	})
	double.XID(t, nvmlIndex[0], 79)
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return f.GPUs[0].Health != nil && !f.GPUs[0].Health.Healthy
	})
	if h := f.GPUs[0].Health; h.Reason != "XID 79" || h.Since == nil || h.Events != 1 {
		t.Errorf("GPU 0 health = %+v, want XID 79", h)
	}
	if h := f.GPUs[1].Health; !h.Healthy || h.Events == 0 {
		t.Errorf("GPU 1 health = %+v, want healthy with events counted (XID 13 is the application's)", h)
	}
	// A GPU fallen off the bus.
	double.Update(t, nvmlIndex[1], func(g *testutil.NVMLGPU) { g.Lost = true })
	f = testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return f.GPUs[1].Health != nil && !f.GPUs[1].Health.Healthy
	})
	if !strings.Contains(f.GPUs[1].Health.Reason, "fallen off the bus") {
		t.Errorf("GPU 1 health = %+v", f.GPUs[1].Health)
	}
	body := scrape(t, e)
	for _, want := range []string{`gpud_gpu_healthy{UUID="GPU-6d2a0c51-0000-4000-8000-000000000000",device="nvidia0",gpu="1"} 0`, `gpud_nvml_available 1`, memTotal} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// A GPU in MIG mode whose slices cannot be keyed (here: no mig-minors
// table; mig_linux_test.go has the slices) is left alone whole: its slices
// could not be mapped, so the gate does not judge its opens (a low
// open next to a high holder is allowed there, and refused on the other
// GPU), and it is shown.
func TestMIGGPULeftAlone(t *testing.T) {
	requireDocker(t)
	e := enforcingEnv(t, preempt.ReclaimNone)
	double := withNVMLDouble(e)
	double.Update(t, nvmlIndex[1], func(g *testutil.NVMLGPU) { g.MIG = true })
	e.start()
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool { return len(f.LeftAlone) == 1 })
	if len(f.GPUs) != 1 || f.GPUs[0].Index != 0 || f.LeftAlone[0].Device != e.gpus[1].Path || !strings.Contains(f.LeftAlone[0].Reason, "MIG") {
		t.Fatalf("gpus %+v left alone %+v, want GPU 1 left alone for MIG", f.GPUs, f.LeftAlone)
	}
	high := e.container("high", "gpud.io/priority=high")
	high.hold(0)
	high.hold(1)
	low := e.container("low", "gpud.io/priority=low")
	if got := low.tryOpen(1); got != "opened" {
		t.Errorf("low open of the MIG GPU a high holds: %q, want allowed", got)
	}
	if got := low.tryOpen(0); !strings.Contains(got, "Operation not permitted") {
		t.Errorf("low open of the managed GPU a high holds: %q, want EPERM", got)
	}
	if !strings.Contains(f.LeftAlone[0].Reason, "could not be mapped") || !strings.Contains(f.LeftAlone[0].Reason, "mig-minors") {
		t.Errorf("left alone for %q; want the slices not mapped, and why (no mig-minors table)", f.LeftAlone[0].Reason)
	}
	if !strings.Contains(scrape(t, e), `gpud_gpus_left_alone{reason="MIG enabled`) {
		t.Error("metrics lack gpud_gpus_left_alone")
	}
}

// scrape renders e's metrics as Prometheus' text format.
func scrape(t *testing.T, e *env) string {
	t.Helper()
	mfs, err := e.d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}
