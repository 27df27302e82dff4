//go:build cgo

package nvidia

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpud/gpud/internal/nvidia/gpumon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// Samples keep arriving while gpud asks for them, as a busy GPU's do: one
// landing between go-nvml's count query and its fetch made the fetch answer
// INSUFFICIENT_SIZE with a larger count, and go-nvml sliced past its buffer
// (a panic that stopped gpud). The slow call (200 ms before each of the
// two) puts a new sample between them every time.
func TestNVMLSamplesArrivingDuringTheQuery(t *testing.T) {
	double := testutil.NewNVMLDouble(t, "", doubleGPUs()...)
	lib := New(Load{Library: double.Library})
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lib.Shutdown)
	lib.Annotate([]occupancy.GPU{{Index: 0, Device: "/dev/nvidia0", Minor: 0}, {Index: 1, Device: "/dev/nvidia1", Minor: 1}})
	double.Compute(t, 1, 4242, 50) // NVML index 1 is minor 0
	double.Slow(t, "nvmlDeviceGetProcessUtilization", 1, 200)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				double.Compute(t, 1, 4242, 50)
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	for i := 0; i < 3; i++ {
		// A sample newer than the last round's: the count query finds
		// one even when the goroutine above is starved (a CPU hog), so
		// the answer is never "no samples since".
		double.Compute(t, 1, 4242, 50)
		r := lib.SampleGPU(0, gpumon.SrcUtilization)
		err := r.Failed[gpumon.SrcUtilization]
		t.Logf("round %d: pids %v, error %v", i, r.PIDs, err)
		switch {
		case err == nil && !slices.Equal(r.PIDs, []uint32{4242}):
			t.Errorf("round %d: active pids %v, want 4242", i, r.PIDs)
		case err != nil && !strings.Contains(err.Error(), nvml.ERROR_INSUFFICIENT_SIZE.Error()):
			// Every retry met a new sample: the answer is "ask again",
			// never another error (nor a panic).
			t.Errorf("round %d: %v, want the samples or INSUFFICIENT_SIZE", i, err)
		}
	}
}
