//go:build k8s

package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// killRecords reads gpud's kill records (victim pid → latency in ms) from
// its status, inside its pod.
func killRecords(t *testing.T, gp string) map[int]float64 {
	out, _ := kubectl(t, "-n", "gpud-system", "exec", gp, "--", "/gpud", "status", "-o", "json")
	var st struct {
		Preemptions []struct {
			Action    string  `json:"action"`
			LatencyMS float64 `json:"latency_ms"`
			Result    string  `json:"result"`
			Victim    struct {
				PID int `json:"pid"`
			} `json:"victim"`
		} `json:"preemptions"`
	}
	got := map[int]float64{}
	if json.Unmarshal([]byte(out), &st) == nil {
		for _, r := range st.Preemptions {
			if r.Action == "kill" && r.Result == "done" {
				got[r.Victim.PID] = r.LatencyMS
			}
		}
	}
	return got
}

// (Its file sorts after lend_test.go: TestPodAdmittedBeforeRegistrationIsReported
// must run before any test registers gpud.io/idle-gpu with this kubelet.)
//
// Repeated loans and take-backs, gpud in its DaemonSet pod (reclaim off, so
// that the borrower stays to try again): each time the owner's open kills
// the borrower's holder, gpud's record gives decision → victim confirmed
// dead, and the borrower's next open is refused (the loan is over even
// though kubelet still lists the borrower). The p50/p99 over the trials
// is the figure (goal p99 ≤ 5 ms, in docs/benchmarks.md).
// GPUD_LEND_TRIALS sets the count.
func TestLendTakeBackLatency(t *testing.T) {
	trials := 15
	if n, err := strconv.Atoi(os.Getenv("GPUD_LEND_TRIALS")); err == nil && n > 0 {
		trials = n
	}
	dev, gpu := fakeGPU(t)
	startStandin(t, gpu)

	podRes := filepath.Join(env(t, "KUBELET_ROOT"), "pod-resources")
	gp := deployGpud(t, dev,
		fmt.Sprintf("{op: replace, path: /spec/template/spec/volumes/4/hostPath/path, value: %s}", podRes),
		"{op: add, path: /spec/template/spec/containers/0/args/-, value: --device-plugin}",
		fmt.Sprintf("{op: add, path: /spec/template/spec/containers/0/args/-, value: --host-dev-dir=%s}", dev),
		"{op: add, path: /spec/template/spec/containers/0/args/-, value: --idle-after=1s}",
		"{op: add, path: /spec/template/spec/containers/0/args/-, value: --reclaim=none}")
	testutil.Eventually(t, 30*time.Second, "kubelet lists the owner's resource", func() bool { return allocatable(t, "nvidia.com/gpu") == "1" })
	health := watchHealth(t, filepath.Join(env(t, "DEVICE_PLUGINS_DIR"), "gpud.sock"), "gpu-0")

	resourcePod(t, "lowner", "nvidia.com/gpu")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/lowner", "--timeout=60s")
	hold(t, podHolders(t, gp), "lowner")

	var lat []float64
	for i := 0; i < trials; i++ {
		waitHealth(t, health, pluginapi.Healthy, 20*time.Second)
		name := fmt.Sprintf("lborrower%d", i)
		resourcePod(t, name, "gpud.io/idle-gpu")
		mustKubectl(t, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=60s")
		victim := hold(t, podHolders(t, gp), name)

		// The owner comes back for a second, then goes idle again.
		if out := mustKubectl(t, "exec", "lowner", "--", "sh", "-c", "exec 4<>/dev/nvidia0 && echo back && sleep 1"); out != "back" {
			t.Fatalf("trial %d: owner's open: %q", i, out)
		}
		var ms float64
		testutil.Eventually(t, 10*time.Second, "a kill record for the borrower", func() bool {
			v, ok := killRecords(t, gp)[victim]
			ms = v
			return ok
		})
		if testutil.Alive(victim) {
			t.Fatalf("trial %d: the borrower's holder is alive after its kill record", i)
		}
		lat = append(lat, ms)
		// The loan is over: the borrower, still listed by kubelet, is refused.
		if out, _ := kubectl(t, "exec", name, "--", "sh", "-c", "exec 3<>/dev/nvidia0 && echo opened"); !strings.Contains(out, "Operation not permitted") {
			t.Fatalf("trial %d: the borrower's open after the take-back: %q, want EPERM", i, out)
		}
		kubectl(t, "delete", "pod", name, "--grace-period=0", "--force", "--wait=true")
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	t.Logf("owner's open → borrower dead over %d trials (gpud's records): p50 %.2f ms, p99 %.2f ms, max %.2f ms",
		len(lat), q(0.50), q(0.99), lat[len(lat)-1])
	// The figure is reported, not asserted at 5 ms (a shared 2-core CI
	// machine is noisy: tens of ms under load); the bound catches a
	// take-back that waits for a periodic tick (1 s) instead of acting on
	// the open.
	if p99 := q(0.99); p99 > 250 {
		t.Errorf("p99 %.2f ms: the take-back is not acting on the open: %v", p99, lat)
	}
}
