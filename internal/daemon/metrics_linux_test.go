package daemon_test

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// sample returns the value of the series name{labels...} in a Prometheus
// text exposition (labels as k="v" pairs that must all appear), and
// whether it is there.
func sample(body, name string, labels ...string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		return v, err == nil
	}
	return 0, false
}

// TestMetricsEndpoint drives a preemption and a refusal through real
// containers and reads them back from /metrics, which promtool must find
// clean.
func TestMetricsEndpoint(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimStop)
	addr := freeAddr(t)
	e.cfg.MetricsAddr = addr
	e.cfg.Version = "test-1"
	e.start()
	base := "http://" + addr
	testutil.Eventually(t, 10*time.Second, "/readyz answers 200", func() bool {
		code, _, _ := testutil.HTTPGet(base + "/readyz")
		return code == http.StatusOK
	})
	if code, _, _ := testutil.HTTPGet(base + "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}

	low := e.container("mlow", "gpud.io/priority=low")
	lowPID := low.hold(0)
	high := e.container("mhigh", "gpud.io/priority=high")
	if got := high.tryOpen(0); got != "opened" {
		t.Fatalf("high open: %q", got)
	}
	testutil.Eventually(t, 10*time.Second, "the low holder is dead", func() bool { return !testutil.Alive(lowPID) })
	highPID := high.hold(0)
	late := e.container("mlate", "gpud.io/priority=low")
	if got := late.tryOpen(0); !strings.Contains(got, "Operation not permitted") {
		t.Fatalf("late low open: %q, want EPERM", got)
	}
	w, ok := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: high.id})
	if !ok || w.Name == "" {
		t.Fatalf("high container not in the registry: %+v", w)
	}

	var body string
	checks := []struct {
		name   string
		labels []string
		min    float64
	}{
		{"gpud_build_info", []string{`version="test-1"`}, 1},
		{"gpud_gpu_info", []string{`gpu="0"`, `device="` + filepath.Base(e.gpus[0].Path) + `"`}, 1},
		{"gpud_gpu_opens_total", []string{`gpu="0"`, `verdict="allow"`}, 2},
		{"gpud_gpu_opens_total", []string{`gpu="0"`, `verdict="deny"`}, 1},
		{"gpud_preemptions_total", []string{`action="kill"`}, 1},
		{"gpud_preemptions_total", []string{`action="deny"`}, 1},
		{"gpud_preemptions_total", []string{`action="reclaim"`}, 1},
		{"gpud_preemption_latency_seconds_count", nil, 1},
		{"gpud_gpu_holders", []string{`gpu="0"`, `priority="high"`}, 1},
		{"gpud_workload_gpu_holders", []string{`gpu="0"`, `container="` + w.Name + `"`, `priority="high"`}, 1},
		{"gpud_gpu_state", []string{`gpu="0"`, `state="busy"`}, 1},
		{"gpud_events_received_total", []string{`type="open"`}, 2},
		{"gpud_events_received_total", []string{`type="gate-high"`}, 1},
		{"gpud_resyncs_total", []string{`reason="start"`}, 1},
		{"gpud_enforcing", nil, 1},
		{"gpud_monitoring_enabled", nil, 1},
	}
	testutil.Eventually(t, 10*time.Second, "/metrics shows the preemption, the refusal and the holders", func() bool {
		_, body, _ = testutil.HTTPGet(base + "/metrics")
		for _, c := range checks {
			if v, ok := sample(body, c.name, c.labels...); !ok || v < c.min {
				return false
			}
		}
		return true
	})
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"gpud_gpu_holders", []string{`gpu="0"`, `priority="low"`}, 0},
		{"gpud_gpu_state", []string{`gpu="0"`, `state="idle"`}, 0},
		{"gpud_gpu_state", []string{`gpu="1"`, `state="free"`}, 1},
		{"gpud_events_dropped_total", nil, 0},
	} {
		if v, ok := sample(body, c.name, c.labels...); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if strings.Contains(body, strconv.Itoa(highPID)+`"`) {
		t.Errorf("a PID appears as a label value:\n%s", body)
	}

	// promtool's linter (Debian's prometheus package) must have nothing to say.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not installed (make test installs Debian's prometheus): %v", err)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader([]byte(body))
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
