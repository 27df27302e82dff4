package daemon_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// manyVictims is an enforcing daemon with one fake GPU, a high-priority
// helper and a low-priority cgroup whose processes are started by the
// hundred.
type manyVictims struct {
	d        *daemon.Daemon
	stateDir string
	gpu      string
	lowDir   string
	high     *helper
	stop     func()
}

func startManyVictims(tb testing.TB, prefix string) *manyVictims {
	tb.Helper()
	testutil.RequireRoot(tb)
	devDir := tb.TempDir()
	gpu := filepath.Join(devDir, "nvidia0")
	if err := unix.Mknod(gpu, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
		tb.Fatalf("mknod: %v", err)
	}
	dir := tb.TempDir()
	cfg := daemon.Config{Run: config.Run{DevDir: devDir, StateFile: filepath.Join(dir, "state.json"), StateDir: dir,
		IdleAfter: time.Minute, NodeName: "many", Enforce: true, FailOpenAfter: 30 * time.Second,
		DockerHost: "none", CRIEndpoint: "none", Reclaim: preempt.ReclaimNone, ReservationTTL: 30 * time.Second}}
	d, stop := runDaemon(tb, cfg, discardLogger())
	waitReady(tb, d)
	m := &manyVictims{d: d, stateDir: dir, gpu: gpu, stop: stop}
	m.high, _ = classified(tb, d.Registry(), prefix+"high", occupancy.High, prefix+"-high")
	m.lowDir, _ = classifiedCgroup(tb, d.Registry(), prefix+"low", occupancy.Low, prefix+"-low")
	return m
}

// lowHolders starts n processes in the low cgroup (born there, through
// clone3's CLONE_INTO_CGROUP), each holding the GPU, and waits until gpud
// has them all as low holders. It returns their pidfds and commands.
func (m *manyVictims) lowHolders(tb testing.TB, n int) ([]int, []*exec.Cmd) {
	tb.Helper()
	cg, err := os.Open(m.lowDir)
	if err != nil {
		tb.Fatal(err)
	}
	defer cg.Close()
	var pidfds []int
	var cmds []*exec.Cmd
	for i := 0; i < n; i++ {
		c := exec.Command("sh", "-c", fmt.Sprintf("exec 3<>%s; exec sleep 600", m.gpu))
		c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Process.Kill(); c.Wait() })
		fd, err := unix.PidfdOpen(c.Process.Pid, 0)
		if err != nil {
			tb.Fatal(err)
		}
		pidfds = append(pidfds, fd)
		cmds = append(cmds, c)
	}
	deadline := time.Now().Add(30 * time.Second)
	for int(m.d.Ledger().Counts()[0].Low) != n {
		if time.Now().After(deadline) {
			tb.Fatalf("gpud sees %d low holders, want %d", m.d.Ledger().Counts()[0].Low, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond) // the gate hears of the last ones (confirmations every ms)
	return pidfds, cmds
}

// awaitAll polls pidfds until every one is readable (its process exited)
// or 5 s pass, and closes them; false if some survived.
func awaitAll(pidfds []int) bool {
	deadline := time.Now().Add(5 * time.Second)
	left := slices.Clone(pidfds)
	for len(left) > 0 && time.Now().Before(deadline) {
		fds := make([]unix.PollFd, len(left))
		for i, fd := range left {
			fds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
		}
		n, err := unix.Poll(fds, int(time.Until(deadline).Milliseconds())+1)
		if err == unix.EINTR || n <= 0 {
			continue
		}
		var still []int
		for i, p := range fds {
			if p.Revents == 0 {
				still = append(still, left[i])
			}
		}
		left = still
	}
	for _, fd := range pidfds {
		unix.Close(fd)
	}
	return len(left) == 0
}

// trial opens the GPU from the high-priority helper with n low holders and
// returns open → all n dead, in µs; the victims' PIDs are returned too.
func (m *manyVictims) trial(tb testing.TB, n int) (float64, []int) {
	tb.Helper()
	pidfds, cmds := m.lowHolders(tb, n)
	var pids []int
	for _, c := range cmds {
		pids = append(pids, c.Process.Pid)
	}
	var t0 uint64
	var hfd int
	fmt.Sscan(m.high.do("opentimed %s", m.gpu), &t0, &hfd)
	if !awaitAll(pidfds) {
		tb.Fatalf("low holders survived a high-priority open")
	}
	lat := float64(bpf.MonotonicNow()-t0) / 1e3
	for _, c := range cmds {
		c.Wait()
	}
	m.high.do("close %d", hfd)
	testutil.Eventually(tb, 5*time.Second, "the condition", func() bool { c := m.d.Ledger().Counts()[0]; return c.High == 0 && c.Low == 0 })
	return lat, pids
}

// journalKills reads the journal file: the last record of each id, for
// kill records.
func journalKills(t *testing.T, stateDir string) map[string]preempt.Record {
	t.Helper()
	out := map[string]preempt.Record{}
	for id, r := range journalRecords(t, filepath.Join(stateDir, "preemptions.jsonl")) {
		if r.Action == preempt.ActionKill {
			out[id] = r
		}
	}
	return out
}

// Many victims at once (issue 14, item 10): one high-priority open of a
// GPU held by 200 low-priority processes kills all 200, journals one
// record per victim (200 "done" kill records, no intent left pending).
// How fast is BenchmarkPreempt200's figure (goal p99 ≤ 50 ms, as a ratio
// to a bare pidfd kill of the same 200 in the same run): a CI machine
// shared with other work times a kill of 200 anywhere from 30 to 180 ms,
// so the test only bounds it where something would be serialised per
// victim (200 fsyncs, or 200 round trips to the kernel's gate).
func TestPreemptManyVictims(t *testing.T) {
	m := startManyVictims(t, "many")
	const n = 200
	var lats []float64
	for trial := 0; trial < 3; trial++ {
		lat, pids := m.trial(t, n)
		lats = append(lats, lat)
		var recs map[string]preempt.Record
		deadline := time.Now().Add(10 * time.Second)
		for {
			recs = journalKills(t, m.stateDir)
			done := 0
			for _, r := range recs {
				if r.Result == "done" && slices.Contains(pids, r.Victim.PID) {
					done++
				}
			}
			if done == n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("trial %d: %d of %d victims have a done kill record", trial, done, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
		seen := map[int]int{}
		for _, r := range recs {
			if slices.Contains(pids, r.Victim.PID) {
				seen[r.Victim.PID]++
				if r.Result != "done" {
					t.Errorf("trial %d: victim %d: record %s ends %q", trial, r.Victim.PID, r.ID, r.Result)
				}
			}
		}
		for _, pid := range pids {
			if seen[pid] != 1 {
				t.Errorf("trial %d: victim %d has %d kill records, want 1", trial, pid, seen[pid])
			}
		}
		t.Logf("trial %d: %d victims dead %.1f ms after the high open, %d records", trial, n, lat/1000, len(seen))
	}
	slices.Sort(lats)
	if med := lats[1] / 1000; med > 1000 {
		t.Errorf("decision → %d victims dead: median %.1f ms over %v µs: something is done victim by victim", n, med, lats)
	}
}

// bareKill is the floor: n processes like the victims, killed by the bare
// C program (testdata/bare/bare.c) through pidfds in a loop (no checks, no
// journal), signal → all dead, in µs.
func bareKill(b *testing.B, bare *bareProg, n int) float64 {
	b.Helper()
	var pids []int
	var cmds []*exec.Cmd
	for i := 0; i < n; i++ {
		c := exec.Command("sleep", "600")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		pids, cmds = append(pids, c.Process.Pid), append(cmds, c)
	}
	lat := bare.kill(b, pids...)
	for _, c := range cmds {
		c.Wait()
	}
	return lat
}

// BenchmarkPreempt200: one high-priority open of a GPU held by 200
// low-priority processes → all 200 confirmed dead. Five runs (a daemon
// each) of 6 trials; p50/p99 over all trials, the spread of the per-run
// medians (min, max), the ratio of p99 to the 50 ms goal, and the ratio of
// p50 and p99 to the floor: 200 such processes killed by the bare C
// program through pidfds, measured in the same run, interleaved. Issue
// 31's goal: p99 ≤ 50 ms loaded (GPUD_BENCH_LOAD=hog) as unloaded.
// GPUD_PREEMPT200_RUNS: the daemons (5).
func BenchmarkPreempt200(b *testing.B) {
	const n, trials = 200, 6
	runs := envInt("GPUD_PREEMPT200_RUNS", 5)
	bare := startBare(b)
	var all, runMedians, floor []float64
	for run := 0; run < runs; run++ {
		m := startManyVictims(b, fmt.Sprintf("b200r%d", run))
		var lats []float64
		for i := 0; i < trials; i++ {
			lat, _ := m.trial(b, n)
			lats = append(lats, lat)
			floor = append(floor, bareKill(b, bare, n))
		}
		m.stop()
		all = append(all, lats...)
		runMedians = append(runMedians, median(lats))
	}
	b.ReportMetric(percentile(all, 50)/1000, "ms-p50")
	b.ReportMetric(percentile(all, 99)/1000, "ms-p99")
	b.ReportMetric(slices.Min(runMedians)/1000, "ms-p50-min-run")
	b.ReportMetric(slices.Max(runMedians)/1000, "ms-p50-max-run")
	b.ReportMetric(percentile(all, 99)/50000, "ratio-p99-to-50ms-goal")
	b.ReportMetric(percentile(floor, 50)/1000, "ms-p50-bare-kill")
	b.ReportMetric(percentile(all, 50)/percentile(floor, 50), "ratio-p50-to-bare-kill")
	b.ReportMetric(percentile(floor, 99)/1000, "ms-p99-bare-kill")
	b.ReportMetric(percentile(all, 99)/percentile(floor, 99), "ratio-p99-to-bare-kill")
	reportLoad(b)
}
