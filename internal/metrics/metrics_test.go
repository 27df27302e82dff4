package metrics

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
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
	m.Opens(snap.GPUs[0].Labels(), VerdictDeny).Inc()

	want := `
# HELP gpud_gpu_holders Processes holding the GPU open, by priority class.
# TYPE gpud_gpu_holders gauge
gpud_gpu_holders{UUID="GPU-a",device="nvidia0",gpu="0",priority="high"} 2
gpud_gpu_holders{UUID="GPU-a",device="nvidia0",gpu="0",priority="low"} 1
gpud_gpu_holders{UUID="GPU-a",device="nvidia0",gpu="0",priority="unclassified"} 0
gpud_gpu_holders{UUID="GPU-a",device="nvidia0",gpu="0",priority="unmanaged"} 0
# HELP gpud_workload_gpu_holders Processes of a workload holding the GPU open (host processes have empty namespace, pod and container).
# TYPE gpud_workload_gpu_holders gauge
gpud_workload_gpu_holders{UUID="GPU-a",container="",device="nvidia0",gpu="0",namespace="ml",pod="train",priority="high"} 2
gpud_workload_gpu_holders{UUID="GPU-a",container="notebook",device="nvidia0",gpu="0",namespace="",pod="",priority="low"} 1
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
gpud_gpu_state{UUID="GPU-a",device="nvidia0",gpu="0",state="busy"} 0
gpud_gpu_state{UUID="GPU-a",device="nvidia0",gpu="0",state="free"} 0
gpud_gpu_state{UUID="GPU-a",device="nvidia0",gpu="0",state="idle"} 1
gpud_gpu_state{UUID="GPU-a",device="nvidia0",gpu="0",state="lent"} 0
# HELP gpud_gpu_idle_seconds Seconds since the GPU's last activity while it is idle; 0 otherwise.
# TYPE gpud_gpu_idle_seconds gauge
gpud_gpu_idle_seconds{UUID="GPU-a",device="nvidia0",gpu="0"} 42
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "gpud_gpu_state", "gpud_gpu_idle_seconds"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), "gpud_preemption_latency_seconds"); n != 1 {
		t.Errorf("latency histogram series: %d", n)
	}
}

// The gpu label is NVML's index (nvidia-smi's, dcgm-exporter's), which
// need not be N of /dev/nvidiaN; device is the node's name. Without NVML
// gpu falls back to gpud's index and UUID is empty.
func TestGPULabels(t *testing.T) {
	two := 2
	snap := Snapshot{GPUs: []GPU{
		{Index: 5, NVMLIndex: &two, UUID: "GPU-b", Device: "/host/dev/nvidia5", State: "idle"},
		{Index: 3, Device: "/dev/nvidia3", State: "free"},
	}}
	m := New("v1", func() Snapshot { return snap })
	m.Verdicts(map[int]GPULabels{5: snap.GPUs[0].Labels(), 3: snap.GPUs[1].Labels()}).Count(5, false)
	want := `
# HELP gpud_gpu_info Always 1 for each GPU gpud tracks. gpu is NVML's index (gpud's, N of /dev/nvidiaN, without NVML), device the node's name (nvidia3).
# TYPE gpud_gpu_info gauge
gpud_gpu_info{UUID="",device="nvidia3",gpu="3"} 1
gpud_gpu_info{UUID="GPU-b",device="nvidia5",gpu="2"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "gpud_gpu_info"); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(m.Opens(GPULabels{GPU: "2", UUID: "GPU-b", Device: "nvidia5"}, VerdictDeny)); v != 1 {
		t.Errorf("deny count of NVML GPU 2 (gpud's 5): %v, want 1", v)
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

// A claim with two requests on one GPU is one series per pod and claim
// (their shares added), never two series with the same labels.
func TestSharesOfOneSeriesPerPodAndClaim(t *testing.T) {
	got := sharesOf([]v1.StateShare{
		{ClaimNamespace: "ns", ClaimName: "c", Request: "a", PodNamespace: "ns", PodName: "p", RequestedBytes: 1 << 30, UsedBytes: 3 << 30, Over: true},
		{ClaimNamespace: "ns", ClaimName: "c", Request: "b", PodNamespace: "ns", PodName: "p", RequestedBytes: 2 << 30, UsedBytes: 3 << 30, Over: true},
		{ClaimNamespace: "other", ClaimName: "c", PodNamespace: "ns", PodName: "p", RequestedBytes: 4 << 30},
	})
	want := []Share{
		{Namespace: "ns", Pod: "p", Claim: "c", RequestedBytes: 3 << 30, UsedBytes: 3 << 30, Over: true},
		{Namespace: "ns", Pod: "p", Claim: "other/c", RequestedBytes: 4 << 30},
	}
	if len(got) != len(want) {
		t.Fatalf("shares %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("share %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// The kernel hooks' mode is one series, labelled with the mode, whether
// every change is reported, and when a passed GPU fd is seen; none before
// the daemon knows it.
func TestKernelHooksGauge(t *testing.T) {
	snap := Snapshot{}
	m := New("v1", func() Snapshot { return snap })
	if n := testutil.CollectAndCount(m.Registry(), "gpud_kernel_hooks"); n != 0 {
		t.Errorf("hooks series without a mode: %d", n)
	}
	snap.HooksMode, snap.HooksComplete, snap.HooksPassedFDs = "driver", false, "sock"
	want := `
# HELP gpud_kernel_hooks 1 for the way GPU fds are observed: mode driver (nothing on the syscall path) or syscalls (every syscall on the node pays); complete false: some changes are found only by re-reading holders' fd tables; passed_fds: when a GPU fd passed by SCM_RIGHTS is seen, at receipt (kprobe, sock, syscalls) or at the periodic sweep (sweep).
# TYPE gpud_kernel_hooks gauge
gpud_kernel_hooks{complete="false",mode="driver",passed_fds="sock"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "gpud_kernel_hooks"); err != nil {
		t.Fatal(err)
	}
}

func TestKernelMapGauges(t *testing.T) {
	snap := Snapshot{KernelMaps: []KernelMap{{Name: "cgroup_prio", Entries: 65536, Capacity: 65536}, {Name: "pending", Entries: 3, Capacity: 16384}}}
	m := New("v1", func() Snapshot { return snap })
	for _, c := range []struct{ metric, want string }{
		{"gpud_kernel_map_entries", `gpud_kernel_map_entries{map="cgroup_prio"} 65536
gpud_kernel_map_entries{map="pending"} 3`},
		{"gpud_kernel_map_capacity", `gpud_kernel_map_capacity{map="cgroup_prio"} 65536
gpud_kernel_map_capacity{map="pending"} 16384`},
	} {
		var help string
		switch c.metric {
		case "gpud_kernel_map_entries":
			help = "Entries of a kernel map the protection depends on (cgroup_prio, expect_cgroup, share_fence, pending, holder_tgids), read every few seconds; a full one fails safe as docs/reliability.md says."
		default:
			help = "The entries a kernel map can hold (see gpud_kernel_map_entries)."
		}
		want := "# HELP " + c.metric + " " + help + "\n# TYPE " + c.metric + " gauge\n" + c.want + "\n"
		if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), c.metric); err != nil {
			t.Error(err)
		}
	}
}

// A refused settings reload (SIGHUP) is counted, from 0: an alert can
// tell a node whose reloads stopped taking effect.
func TestConfigReloadsRefusedCounter(t *testing.T) {
	snap := Snapshot{}
	m := New("v1", func() Snapshot { return snap })
	for _, n := range []uint64{0, 2} {
		snap.ConfigReloadsRefused = n
		want := fmt.Sprintf(`
# HELP gpud_config_reloads_refused_total Settings reloads (SIGHUP) refused since gpud started: a bad value, or a settings file that is unreadable or that someone other than root could change; the running settings stay (see gpud's log).
# TYPE gpud_config_reloads_refused_total counter
gpud_config_reloads_refused_total %d
`, n)
		if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "gpud_config_reloads_refused_total"); err != nil {
			t.Error(err)
		}
	}
}
