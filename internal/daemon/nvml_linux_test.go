//go:build cgo

// The NVML double is go-nvml's own mock, which needs cgo (as the NVIDIA
// package does): without cgo gpud has no NVML, and nothing to test here.

package daemon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// NVML failing: activity falls back to GPU opens, and gpud says so once,
// not once a second.
func TestNVMLFailingFallsBackToOpens(t *testing.T) {
	e := newEnv(t)
	lib := dgxa100.New()
	for i, d := range lib.Devices {
		md := d.(*dgxa100.Device)
		md.Minor = int(e.gpus[0].Minor) // device 0 answers for fake GPU 0
		if i > 0 {
			md.Minor = 1000 + i
		}
		md.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
	}
	e.cfg.NVML = &nvidia.NVML{Lib: lib}
	e.cfg.IdleAfter = time.Second
	e.start()
	h := startHelper(t)
	h.doInt("open %s", e.gpus[0].Path)
	time.Sleep(3500 * time.Millisecond) // three or more failing samples
	if n := strings.Count(e.logs.String(), "NVML sampling failing"); n != 1 {
		t.Fatalf("NVML failure reported %d times, want once:\n%s", n, e.logs.String())
	}
	// Opens still count as activity: a new open makes the idle GPU busy.
	st := e.d.Ledger().Snapshot(time.Now())
	if st.GPUs[0].State != occupancy.Idle {
		t.Fatalf("GPU 0 is %s after idle-after with no activity, want idle", st.GPUs[0].State)
	}
	h.doInt("open %s", e.gpus[0].Path)
	testutil.Eventually(t, 10*time.Second, "an open makes GPU 0 busy again", func() bool {
		return e.d.Ledger().Snapshot(time.Now()).GPUs[0].State == occupancy.Busy
	})
}
