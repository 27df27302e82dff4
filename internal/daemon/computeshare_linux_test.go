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
	rows, _ := sharesAt(t, pods, n, w)
	return rows
}

// busyEvery is how often sharesAt reads the pods' busy time.
const busyEvery = 20 * time.Millisecond

// counted is what a read's increase d of a thread's busy time over wall
// time el counts: d, unless it passes el by more than busySlack (the
// kernel's charge of a frozen time at a thaw: then el). Within the slack,
// d counts as read: a running task's run time reaches its counter in
// lumps (at the scheduler's updates), so one read may pass the wall time
// and the next fall short by as much; clipping each at el lost a busy
// pod's lumps (a 50 % pod read 44 %).
func counted(d int64, el time.Duration) int64 {
	if d > (el + busySlack).Nanoseconds() {
		return el.Nanoseconds()
	}
	return d
}

// busySlack is how far past the wall time one read of a thread's busy
// time may go before it is taken for a frozen time charged at a thaw: a
// few scheduler ticks, far below the frozen times that shows (100 ms to 1 s).
const busySlack = 30 * time.Millisecond

// sharesAt is shares with the times the windows end, after the first's
// start. It reads each pod's busy time every busyEvery and counts at most
// the wall time since the last read: a thread cannot run or wait to run
// longer than that, but Linux 6.18 sometimes charges a task its whole
// frozen time as time waiting to run at its first run after a thaw (a pod
// frozen 0.9 s, 0 % busy at each read, then 911 ms more at once, read 50
// ms after its thaw): read once a second, a 10 % pod showed 99.7 %.
func sharesAt(t *testing.T, pods []*computePod, n int, w time.Duration) (out [][]float64, ends []time.Time) {
	t.Helper()
	prev := make([]int64, len(pods))
	for i, p := range pods {
		prev[i] = busyNS(t, p.work.PID)
	}
	start := time.Now()
	at, last := start, start
	ends = append(ends, at)
	acc := make([]int64, len(pods))
	for len(out) < n {
		end := start.Add(time.Duration(len(out)+1) * w)
		time.Sleep(min(busyEvery, max(time.Until(end), 0)))
		now := time.Now()
		for i, p := range pods {
			b := busyNS(t, p.work.PID)
			acc[i] += counted(b-prev[i], now.Sub(last))
			prev[i] = b
		}
		last = now
		if now.Before(end) {
			continue
		}
		row := make([]float64, len(pods))
		for i := range pods {
			row[i] = 100 * float64(acc[i]) / float64(now.Sub(at).Nanoseconds())
			acc[i] = 0
		}
		at = now
		out = append(out, row)
		ends = append(ends, now)
	}
	return out, ends
}

// checkShares asserts n one-second windows within ±5 points of want and
// their mean within ±3.
func checkShares(t *testing.T, e *env, pods []*computePod, want []float64, n int) {
	t.Helper()
	tr := startTrace(t, e, pods)
	rows, ends := sharesAt(t, pods, n, time.Second)
	tr.stop()
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
				tr.log(t, ends[w], ends[w+1])
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
		checkShares(t, e, []*computePod{a, b}, []float64{10, 90}, 10)
	})
	t.Run("20/30/50 and idle", func(t *testing.T) {
		e, double, book := computeEnv(t)
		a := e.computePod(double, book, "a", 20, false)
		b := e.computePod(double, book, "b", 30, false)
		c := e.computePod(double, book, "c", 50, false)
		pods := []*computePod{a, b, c}
		time.Sleep(5 * time.Second)
		checkShares(t, e, pods, []float64{20, 30, 50}, 10)
		// c stops (SIGSTOP: no work, as a pod waiting for requests):
		// within 2 s a and b share the GPU 40/60.
		if err := syscall.Kill(c.work.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		checkShares(t, e, pods, []float64{40, 60, 0}, 5)
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

// trace samples, every 50 ms while shares are measured, each pod's busy
// time, the scheduler's state of it, and its pod cgroup's freezer (the
// request and whether it is frozen): logged for a second that failed, so
// that a pod busy while the scheduler holds it frozen says which of them
// disagreed.
type trace struct {
	stopc chan struct{}
	done  chan struct{}
	rows  []string
	ats   []time.Time
}

func startTrace(t *testing.T, e *env, pods []*computePod) *trace {
	dirs := make([]string, len(pods))
	for i, p := range pods {
		dirs[i] = filepath.Dir(cgroupDir(p.work.PID)) // the pod's
	}
	tr := &trace{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		prev := make([]int64, len(pods))
		last := time.Now()
		for {
			now := time.Now()
			var b strings.Builder
			fmt.Fprintf(&b, "%s", now.Format("05.000"))
			snap := e.d.ComputeSnapshot()
			for i, p := range pods {
				busy, _ := testutil.BusyNS(p.work.PID)
				state := "?"
				for _, g := range snap {
					for _, ps := range g.Pods {
						if ps.UID == p.uid {
							state = fmt.Sprintf("%s/frozen=%v", ps.State, ps.Frozen)
						}
					}
				}
				freeze, events := freezer(dirs[i])
				fmt.Fprintf(&b, " | %s busy %3.0f%% %s freeze=%s %s", p.name, 100*float64(busy-prev[i])/float64(now.Sub(last)), state,
					freeze, strings.ReplaceAll(events, "\n", ","))
				prev[i] = busy
			}
			last = now
			tr.rows, tr.ats = append(tr.rows, b.String()), append(tr.ats, now)
			select {
			case <-tr.stopc:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return tr
}

func (tr *trace) stop() {
	close(tr.stopc)
	<-tr.done
}

// log logs the samples from `from` to `to`.
func (tr *trace) log(t *testing.T, from, to time.Time) {
	t.Helper()
	for i, at := range tr.ats {
		if !at.Before(from) && !at.After(to.Add(50*time.Millisecond)) {
			t.Log(tr.rows[i])
		}
	}
}

// logFreezers logs, for a failed check, where each pod's process is and
// what its cgroup and the pod's freezers say now: a process running while
// the scheduler holds it frozen has either left the frozen cgroup or was
// never frozen.
func logFreezers(t *testing.T, pods []*computePod) {
	t.Helper()
	for _, p := range pods {
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.work.PID))
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.work.PID))
		t.Logf("%s: pid %d stat %q cgroup %q", p.name, p.work.PID, strings.TrimSpace(string(stat)), strings.TrimSpace(string(cg)))
		for dir := cgroupDir(p.work.PID); strings.Contains(dir, "kubepods"); dir = filepath.Dir(dir) {
			freeze, events := freezer(dir)
			t.Logf("  %s: cgroup.freeze %q cgroup.events %q", dir, freeze, events)
		}
	}
}

// cgroupDir is pid's cgroup v2 directory ("" when unknown).
func cgroupDir(pid int) string {
	root, _, err := cgroups.V2Root()
	if err != nil {
		return ""
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(root, rel)
		}
	}
	return ""
}

// freezer is cgroup directory dir's freeze request and events, as read.
func freezer(dir string) (freeze, events string) {
	f, _ := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
	e, _ := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return strings.TrimSpace(string(f)), strings.TrimSpace(string(e))
}

func busyNS(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := testutil.BusyNS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
