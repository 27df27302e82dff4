package metrics

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A GPU's compute shares in the state document are gpud_share_compute_*
// series, one per pod, labelled by the GPU and the pod's namespace and
// name (never a PID), gone with the pod.
func TestShareComputeSeriesFromState(t *testing.T) {
	nvml := 3
	f := v1.StateFile{GPUs: []v1.StateGPU{{Index: 0, NVMLIndex: &nvml, UUID: "GPU-a", Device: "/dev/nvidia0", State: v1.Busy,
		ComputeShares: []v1.StateComputeShare{
			{PodNamespace: "team", PodName: "a", PodUID: "u1", TargetPercent: 30, UsedPercent: 29.5, ThrottledSeconds: 12.25, State: "waiting", Frozen: true},
			{PodNamespace: "team", PodName: "b", PodUID: "u2", TargetPercent: 70, HardCap: true, UsedPercent: 70.1, ThrottledSeconds: 3, State: "running"},
			{PodNamespace: "team", PodName: "b", PodUID: "u2", TargetPercent: 70}, // the same pod twice: one series
		}}}}
	var s Snapshot
	s.FromState(f, time.Unix(1000, 0), func(v1.StateHolder) (string, string, string) { return "", "", "" })
	m := New("v1", func() Snapshot { return s })
	want := `
# HELP gpud_share_compute_target_percent A pod's share of the GPU's compute its DRA claims asked (percent of the GPU), under gpud's time-slice scheduler.
# TYPE gpud_share_compute_target_percent gauge
gpud_share_compute_target_percent{UUID="GPU-a",device="nvidia0",gpu="3",namespace="team",pod="a"} 30
gpud_share_compute_target_percent{UUID="GPU-a",device="nvidia0",gpu="3",namespace="team",pod="b"} 70
# HELP gpud_share_compute_used_percent A pod's measured share of the GPU's compute (NVML per-process utilization, percent of the GPU), averaged over about a scheduling period.
# TYPE gpud_share_compute_used_percent gauge
gpud_share_compute_used_percent{UUID="GPU-a",device="nvidia0",gpu="3",namespace="team",pod="a"} 29.5
gpud_share_compute_used_percent{UUID="GPU-a",device="nvidia0",gpu="3",namespace="team",pod="b"} 70.1
# HELP gpud_share_compute_throttled_seconds_total Time the compute scheduler held the pod frozen on this GPU (since it began sharing it under this gpud).
# TYPE gpud_share_compute_throttled_seconds_total counter
gpud_share_compute_throttled_seconds_total{UUID="GPU-a",device="nvidia0",gpu="3",namespace="team",pod="a"} 12.25
gpud_share_compute_throttled_seconds_total{UUID="GPU-a",device="nvidia0",gpu="3",namespace="team",pod="b"} 3
# HELP gpud_share_compute_frozen 1 while the compute scheduler holds the pod frozen (waiting for its turn, or over its hard cap).
# TYPE gpud_share_compute_frozen gauge
gpud_share_compute_frozen{UUID="GPU-a",device="nvidia0",gpu="3",namespace="team",pod="a"} 1
gpud_share_compute_frozen{UUID="GPU-a",device="nvidia0",gpu="3",namespace="team",pod="b"} 0
`
	names := []string{"gpud_share_compute_target_percent", "gpud_share_compute_used_percent", "gpud_share_compute_throttled_seconds_total", "gpud_share_compute_frozen"}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	s = Snapshot{}
	s.FromState(v1.StateFile{GPUs: []v1.StateGPU{{Index: 0, UUID: "GPU-a", Device: "/dev/nvidia0"}}}, time.Unix(1000, 0), nil)
	if n := testutil.CollectAndCount(m.Registry(), names...); n != 0 {
		t.Errorf("%d compute series after the pods left", n)
	}
}
