//go:build cgo

package daemon_test

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// computePod is a pod sharing GPU 0 by compute: a claim with a compute
// target, and fake GPU work (a spinning process holding /dev/nvidia0,
// whose utilization in the NVML double follows the time it runs or waits
// to run) in its container.
type computePod struct {
	name string
	uid  string
	work *testutil.GPUWork
}

func (e *env) computePod(double *testutil.NVMLDouble, book *sharing.Book, name string, target int, hardCap bool) *computePod {
	e.t.Helper()
	uid, podID, ctr := testutil.PodCgroup(e.t, "burstable")
	e.d.Registry().Put(workload.Workload{PodUID: uid, Namespace: "team", Name: name, TaskID: "team/" + name, Priority: occupancy.Low, CgroupID: podID})
	book.Set("claim-"+uid, []sharing.Share{{ClaimUID: "claim-" + uid, ClaimNamespace: "team", ClaimName: name + "-gpu", Request: "gpu",
		GPU: 0, UUID: e.d.State().GPUs[0].UUID, Bytes: 1 << 30, Compute: target, HardCap: hardCap,
		Pods: []sharing.PodRef{{UID: uid, Namespace: "team", Name: name}}}})
	// The claim is prepared before the pod's containers start: its process
	// may open the shared GPU.
	testutil.Eventually(e.t, 10*time.Second, "the share known", func() bool {
		_, ok := shareOf(e.d.State().GPUs[0], uid)
		return ok
	})
	return &computePod{name: name, uid: uid, work: testutil.StartGPUWork(e.t, double, nvmlIndex[0], e.gpus[0].Path, ctr, 1<<30)}
}

// shares measures each pod's share of the GPU (percent of wall time it
// ran or waited to run) over n windows of w.
func shares(t *testing.T, pods []*computePod, n int, w time.Duration) [][]float64 {
	t.Helper()
	var out [][]float64
	prev := make([]int64, len(pods))
	for i, p := range pods {
		prev[i] = busyNS(t, p.work.PID)
	}
	at := time.Now()
	for range n {
		time.Sleep(w)
		now := time.Now()
		row := make([]float64, len(pods))
		for i, p := range pods {
			b := busyNS(t, p.work.PID)
			row[i] = 100 * float64(b-prev[i]) / float64(now.Sub(at).Nanoseconds())
			prev[i] = b
		}
		at = now
		out = append(out, row)
	}
	return out
}

// checkShares asserts n one-second windows within ±5 points of want and
// their mean within ±3.
func checkShares(t *testing.T, pods []*computePod, want []float64, n int) {
	t.Helper()
	rows := shares(t, pods, n, time.Second)
	defer func() {
		if t.Failed() {
			logFreezers(t, pods)
		}
	}()
	mean := make([]float64, len(pods))
	for w, row := range rows {
		for i, x := range row {
			mean[i] += x / float64(len(rows))
			if math.Abs(x-want[i]) > 5 {
				t.Errorf("second %d: %s has %.1f%% of the GPU, want %.0f±5 (all %v)", w, pods[i].name, x, want[i], rows)
			}
		}
	}
	for i, m := range mean {
		if math.Abs(m-want[i]) > 3 {
			t.Errorf("over %d s: %s has %.1f%% of the GPU, want %.0f±3", n, pods[i].name, m, want[i])
		}
	}
}

func computeEnv(t *testing.T) (*env, *testutil.NVMLDouble, *sharing.Book) {
	e, double, book := sharingEnv(t)
	e.start()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("compute scheduler: %+v", e.d.ComputeSnapshot())
			// The scheduler's own account of what it could not do (a
			// freezer write failed, a freeze not complete, a pod without
			// a freezer), at debug level in gpud's log.
			for _, line := range strings.Split(e.logs.String(), "\n") {
				if strings.Contains(line, "compute") || strings.Contains(line, "freez") {
					t.Log(line)
				}
			}
		}
	})
	return e, double, book
}

// The node test: targets 10/90, then 20/30/50, busy at once, each
// within ±3 points over 10 s and ±5 over each second, reached within 5 s
// of the last pod starting; one going idle gives its share to the others
// within 2 s.
func TestComputeShareTargetsHeld(t *testing.T) {
	testutil.RequireRoot(t)
	t.Run("10/90", func(t *testing.T) {
		e, double, book := computeEnv(t)
		a := e.computePod(double, book, "a", 10, false)
		b := e.computePod(double, book, "b", 90, false)
		time.Sleep(5 * time.Second)
		checkShares(t, []*computePod{a, b}, []float64{10, 90}, 10)
	})
	t.Run("20/30/50 and idle", func(t *testing.T) {
		e, double, book := computeEnv(t)
		a := e.computePod(double, book, "a", 20, false)
		b := e.computePod(double, book, "b", 30, false)
		c := e.computePod(double, book, "c", 50, false)
		pods := []*computePod{a, b, c}
		time.Sleep(5 * time.Second)
		checkShares(t, pods, []float64{20, 30, 50}, 10)
		// c stops (SIGSTOP: no work, as a pod waiting for requests):
		// within 2 s a and b share the GPU 40/60.
		if err := syscall.Kill(c.work.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		checkShares(t, pods, []float64{40, 60, 0}, 5)
		syscall.Kill(c.work.PID, syscall.SIGCONT)
	})
}

// A hard-capped pod alone on the GPU stays within its cap + 5 points.
func TestComputeShareHardCapAlone(t *testing.T) {
	testutil.RequireRoot(t)
	e, double, book := computeEnv(t)
	p := e.computePod(double, book, "capped", 30, true)
	time.Sleep(3 * time.Second)
	for w, row := range shares(t, []*computePod{p}, 8, time.Second) {
		if row[0] > 35 {
			t.Errorf("second %d: the capped pod has %.1f%% of the GPU, over its cap 30 + 5", w, row[0])
		}
	}
}

// logFreezers logs, for a failed check, where each pod's process is and
// what its cgroup and the pod's freezers say now: a process running while
// the scheduler holds it frozen has either left the frozen cgroup or was
// never frozen.
func logFreezers(t *testing.T, pods []*computePod) {
	t.Helper()
	root, _, err := cgroups.V2Root()
	if err != nil {
		t.Log(err)
		return
	}
	for _, p := range pods {
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.work.PID))
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.work.PID))
		t.Logf("%s: pid %d stat %q cgroup %q", p.name, p.work.PID, strings.TrimSpace(string(stat)), strings.TrimSpace(string(cg)))
		for _, line := range strings.Split(string(cg), "\n") {
			rel, ok := strings.CutPrefix(line, "0::")
			if !ok {
				continue
			}
			for dir := filepath.Join(root, rel); strings.Contains(dir, "kubepods"); dir = filepath.Dir(dir) {
				freeze, _ := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
				events, _ := os.ReadFile(filepath.Join(dir, "cgroup.events"))
				t.Logf("  %s: cgroup.freeze %q cgroup.events %q", dir, strings.TrimSpace(string(freeze)), strings.TrimSpace(string(events)))
			}
		}
	}
}

func busyNS(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := testutil.BusyNS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
