//go:build cgo

package daemon_test

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/testutil"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

// Two pods sharing GPU 0's compute 30/70, busy at once, are shown: in the
// state file (target, measured share, throttled time, one of them frozen
// by the scheduler at a time), in explain for each one's process, and as
// gpud_share_compute_* series named by pod.
func TestComputeShareShown(t *testing.T) {
	testutil.RequireRoot(t)
	e, double, book := computeEnv(t)
	a := e.computePod(double, book, "a", 30, false)
	b := e.computePod(double, book, "b", 70, false)
	byName := func() map[string]v1.StateComputeShare {
		out := map[string]v1.StateComputeShare{}
		for _, s := range e.d.State().GPUs[0].ComputeShares {
			out[s.PodName] = s
		}
		return out
	}
	testutil.Eventually(t, 10*time.Second, "both pods throttled and measured near their targets", func() bool {
		s := byName()
		return len(s) == 2 && s["a"].TargetPercent == 30 && s["b"].TargetPercent == 70 &&
			s["a"].ThrottledSeconds > 0 && s["b"].ThrottledSeconds > 0 && s["a"].UsedPercent > 15 && s["b"].UsedPercent > 45 &&
			s["a"].PodNamespace == "team" && s["a"].PodUID == a.uid
	})
	testutil.Eventually(t, 5*time.Second, "one pod frozen, saying why", func() bool {
		s := byName()
		return s["a"].Frozen != s["b"].Frozen && (s["a"].Frozen && strings.HasPrefix(s["a"].Why, "waiting for its turn") ||
			s["b"].Frozen && strings.HasPrefix(s["b"].Why, "waiting for its turn"))
	})
	testutil.Eventually(t, 5*time.Second, "explain says b's compute share and, once, that it is frozen", func() bool {
		x, err := e.d.Explain(b.work.PID)
		if err != nil {
			t.Fatal(err)
		}
		c := x.GPUs[0].Compute
		return c != nil && c.TargetPercent == 70 && c.PodUID == b.uid && c.Frozen && c.Why != ""
	})
	if n := promtest.CollectAndCount(e.d.Metrics().Registry(), "gpud_share_compute_target_percent", "gpud_share_compute_used_percent",
		"gpud_share_compute_throttled_seconds_total", "gpud_share_compute_frozen"); n != 8 {
		t.Errorf("%d gpud_share_compute_* series, want 4 per pod", n)
	}
}
