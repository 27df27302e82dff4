package metrics

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestScrapeTimeGauges(t *testing.T) {
	snap := Snapshot{
		GPUs: []GPU{{Index: 0, UUID: "GPU-a", Device: "/dev/nvidia0", State: "busy", Holders: []Holder{
			{Namespace: "ml", Pod: "train", Container: "", Priority: "high"},
			{Namespace: "ml", Pod: "train", Container: "", Priority: "high"},
			{Container: "notebook", Priority: "low"},
		}}},
		Events:  map[string]uint64{"open": 3},
		Resyncs: map[string]uint64{"start": 1},
	}
	m := New("v1", func() Snapshot { return snap })
	m.Preemption("kill", 3*time.Millisecond)
	m.Opens(0, "GPU-a", VerdictDeny).Inc()

	want := `
# HELP gpud_gpu_holders Processes holding the GPU open, by priority class.
# TYPE gpud_gpu_holders gauge
gpud_gpu_holders{UUID="GPU-a",gpu="0",priority="high"} 2
gpud_gpu_holders{UUID="GPU-a",gpu="0",priority="low"} 1
gpud_gpu_holders{UUID="GPU-a",gpu="0",priority="unclassified"} 0
gpud_gpu_holders{UUID="GPU-a",gpu="0",priority="unmanaged"} 0
# HELP gpud_workload_gpu_holders Processes of a workload holding the GPU open (host processes have empty namespace, pod and container).
# TYPE gpud_workload_gpu_holders gauge
gpud_workload_gpu_holders{UUID="GPU-a",container="",gpu="0",namespace="ml",pod="train",priority="high"} 2
gpud_workload_gpu_holders{UUID="GPU-a",container="notebook",gpu="0",namespace="",pod="",priority="low"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "gpud_gpu_holders", "gpud_workload_gpu_holders"); err != nil {
		t.Fatal(err)
	}

	// The workload leaves and the GPU goes idle: no stale series remain.
	snap.GPUs[0].Holders = nil
	snap.GPUs[0].State = "idle"
	snap.GPUs[0].IdleSeconds = 42
	if n := testutil.CollectAndCount(m.Registry(), "gpud_workload_gpu_holders"); n != 0 {
		t.Errorf("workload series after the workload left: %d", n)
	}
	want = `
# HELP gpud_gpu_state 1 for the GPU's current state, 0 for the others (free, busy, idle, lent).
# TYPE gpud_gpu_state gauge
gpud_gpu_state{UUID="GPU-a",gpu="0",state="busy"} 0
gpud_gpu_state{UUID="GPU-a",gpu="0",state="free"} 0
gpud_gpu_state{UUID="GPU-a",gpu="0",state="idle"} 1
gpud_gpu_state{UUID="GPU-a",gpu="0",state="lent"} 0
# HELP gpud_gpu_idle_seconds Seconds since the GPU's last activity while it is idle; 0 otherwise.
# TYPE gpud_gpu_idle_seconds gauge
gpud_gpu_idle_seconds{UUID="GPU-a",gpu="0"} 42
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "gpud_gpu_state", "gpud_gpu_idle_seconds"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), "gpud_preemption_latency_seconds"); n != 1 {
		t.Errorf("latency histogram series: %d", n)
	}
}

func TestEndpoints(t *testing.T) {
	ready := false
	m := New("v1", func() Snapshot { return Snapshot{} })
	srv := httptest.NewServer(m.Handler(func() bool { return ready }))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before ready: %d", code)
	}
	ready = true
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz when ready: %d", code)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	code, body := get("/metrics")
	if code != http.StatusOK || !strings.Contains(body, `gpud_build_info{version="v1"} 1`) {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	// Lint with promtool where installed; make test installs it and the
	// daemon's end-to-end metrics test requires it.
	if promtool, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	}
}
