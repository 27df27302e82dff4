package daemon_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// freezeEnv is an enforcing daemon with --preempt-mode freeze.
func freezeEnv(t *testing.T, maxFrozen time.Duration) *env {
	e := newEnv(t)
	e.cfg.Enforce, e.cfg.FailOpenAfter, e.cfg.DockerHost, e.cfg.Reclaim = true, 30*time.Second, "none", "none"
	e.cfg.ReservationTTL = 30 * time.Second
	e.cfg.PreemptMode, e.cfg.MaxFrozen = string(preempt.ModeFreeze), maxFrozen
	e.start()
	return e
}

// lowCounter starts a counting process of a low-priority workload (known
// by its cgroup) that holds GPU gpu; v1, when set, also puts it in a v1
// freezer cgroup, as runc does on a hybrid host. It returns the counter's
// pid and its count file.
func lowCounter(t *testing.T, e *env, gpu int, v1 bool) (int, string) {
	t.Helper()
	ctr, id := testutil.Cgroup(t, "lowctr")
	var v1dir string
	if v1 {
		v1dir = testutil.V1FreezerCgroup(t, "lowpod")
	}
	e.d.Registry().Put(workload.Workload{CgroupID: id, Priority: occupancy.Low, TaskID: "counter"})
	file := filepath.Join(t.TempDir(), "count")
	cmd := testutil.StartCounter(t, file, e.gpus[gpu].Path, func(pid int) {
		testutil.JoinCgroup(t, ctr, pid)
		if v1dir != "" {
			testutil.JoinCgroup(t, v1dir, pid)
		}
	})
	pid := cmd.Process.Pid
	testutil.Eventually(t, 5*time.Second, "the low counter holds the GPU", func() bool {
		if !testutil.Alive(pid) {
			// Its open was refused (it exits): say so at once, with who
			// held the GPU, rather than time out.
			t.Fatalf("the low counter exited (its open of GPU %d refused?); holders: %+v; log:\n%s", gpu, e.d.Ledger().Holders(gpu), e.logs.String())
		}
		for _, h := range e.d.Ledger().Holders(gpu) {
			if h.PID == pid && h.Priority == occupancy.Low {
				return true
			}
		}
		return false
	})
	testutil.Eventually(t, 5*time.Second, "it counts", func() bool { return testutil.Counted(file) > 3 })
	return pid, file
}

func stillCounting(file string, d time.Duration) (from, to int) {
	from = testutil.Counted(file)
	time.Sleep(d)
	return from, testutil.Counted(file)
}

// --preempt-mode freeze on the real gate: a low counter holds a GPU; a
// high open freezes it (the counter stops, the process lives); the gate
// refuses low opens of the GPU meanwhile; the high holder leaves; the
// counter is thawed and counts on from where it stopped. Both freezers:
// cgroup v2's cgroup.freeze, and the v1 freezer controller (what runc uses
// on a hybrid host such as this project's CI machine).
func TestFreezeInsteadOfKill(t *testing.T) {
	for _, tc := range []struct {
		name string
		v1   bool
		kind string
	}{{"v2", false, cgroups.FreezerV2}, {"v1", true, cgroups.FreezerV1}} {
		t.Run(tc.name, func(t *testing.T) {
			e := freezeEnv(t, time.Hour)
			pid, file := lowCounter(t, e, 0, tc.v1)
			high, _ := classified(t, e.d.Registry(), "high", occupancy.High, "high")
			hfd := high.doInt("open %s", e.gpus[0].Path)
			testutil.Eventually(t, 5*time.Second, "a freeze record", func() bool { return len(records(e, preempt.ActionFreeze)) > 0 })
			// The first record may name a sleep the counter forks (it holds
			// the GPU between its fork and its close, and is judged after
			// the fact): the same workload, the same freeze.
			r := records(e, preempt.ActionFreeze)[0]
			if r.Victim.CgroupID == 0 || r.Result != "done" || r.LatencyMS <= 0 || r.Cgroup == "" {
				t.Fatalf("freeze record: %+v", r)
			}
			if from, to := stillCounting(file, 300*time.Millisecond); from != to {
				t.Fatalf("counted %d → %d while frozen", from, to)
			}
			at := testutil.Counted(file)
			if !testutil.Alive(pid) || len(records(e, preempt.ActionKill)) != 0 {
				t.Fatal("the frozen workload was killed")
			}
			f := testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return len(f.Suspended) == 1 })
			s := f.Suspended[0]
			if s.Freezer != tc.kind || s.Cgroup != r.Cgroup || len(s.PIDs) == 0 || s.GPUs[0] != 0 || s.KillAt == nil || !strings.Contains(s.ThawWhen, "high-priority") {
				t.Fatalf("suspension: %+v", s)
			}
			if testutil.HolderPriority(f, 0, pid) != v1.Low {
				t.Fatal("the frozen process is not shown as the GPU's low holder")
			}
			// The gate goes on refusing low opens of the GPU high holds.
			low2, _ := classified(t, e.d.Registry(), "low2", occupancy.Low, "low2")
			if got := tryOpen(low2, e.gpus[0].Path); got != "operation not permitted" {
				t.Fatalf("a low open while the GPU is high-held: %q", got)
			}
			// Rejudging (a class change) leaves it frozen, not killed.
			e.d.Registry().Put(workload.Workload{CgroupID: 1, Priority: occupancy.Low, TaskID: "nudge"})
			time.Sleep(200 * time.Millisecond)
			if !testutil.Alive(pid) || testutil.Counted(file) != at {
				t.Fatal("a rejudge killed or thawed the frozen workload")
			}
			high.do("close %d", hfd)
			testutil.Eventually(t, 10*time.Second, "a thaw record", func() bool { return len(records(e, preempt.ActionThaw)) > 0 })
			testutil.Eventually(t, 5*time.Second, "counting on", func() bool { return testutil.Counted(file) > at+3 })
			// 0 lost: the same process, its count carried on from where it
			// stopped (a restarted one would count from 1).
			if !testutil.Alive(pid) || testutil.Counted(file) < at {
				t.Fatal("not the same process, or its count restarted")
			}
			testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return len(f.Suspended) == 0 })
			// Low opens are allowed again.
			if got := tryOpen(low2, e.gpus[0].Path); got != "ok" {
				t.Fatalf("a low open of a low-held GPU after the thaw: %q", got)
			}
		})
	}
}

// A workload frozen longer than --max-frozen is killed (through its
// pidfd), recorded, and its frozen cgroup thawed for it to die.
func TestFrozenTooLongIsKilled(t *testing.T) {
	e := freezeEnv(t, 500*time.Millisecond)
	pid, _ := lowCounter(t, e, 1, false)
	high, _ := classified(t, e.d.Registry(), "high", occupancy.High, "high")
	high.do("open %s", e.gpus[1].Path)
	testutil.Eventually(t, 5*time.Second, "a freeze record", func() bool { return len(records(e, preempt.ActionFreeze)) > 0 })
	testutil.Eventually(t, 10*time.Second, "killed once frozen too long", func() bool { return !testutil.Alive(pid) })
	testutil.Eventually(t, 5*time.Second, "a kill record", func() bool {
		for _, k := range records(e, preempt.ActionKill) {
			if k.Victim.PID == pid {
				return true
			}
		}
		return false
	})
	var k preempt.Record
	for _, r := range records(e, preempt.ActionKill) {
		if r.Victim.PID == pid {
			k = r
		}
	}
	if k.Result != "done" || !strings.Contains(k.Rule, "max-frozen") || k.GPU != 1 {
		t.Fatalf("kill record: %+v", k)
	}
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return len(f.Suspended) == 0 })
}

// The per-workload label wins over the node's mode, both ways; a
// workload paused by someone else (docker pause) is neither thawed nor
// killed by gpud.
func TestPreemptModeLabelAndPaused(t *testing.T) {
	e := freezeEnv(t, time.Hour)
	// Labelled kill on a freeze node: killed.
	dir, id := testutil.Cgroup(t, "killme")
	e.d.Registry().Put(workload.Workload{CgroupID: id, Priority: occupancy.Low, TaskID: "k", PreemptMode: "kill"})
	victim := startHelper(t)
	testutil.JoinCgroup(t, dir, victim.pid())
	victim.do("open %s", e.gpus[0].Path)
	// Paused by an admin before the preemption.
	pid, file := lowCounter(t, e, 1, false)
	paused := cgroupOf(t, pid)
	if err := os.WriteFile(filepath.Join(paused, "cgroup.freeze"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(filepath.Join(paused, "cgroup.freeze"), []byte("0"), 0o644) })
	// Frozen, not only asked to freeze: a counter that was in the kernel
	// (its write of the count) when the freeze was asked writes that count
	// when it next runs, which on a busy machine can be after the count
	// below is read (the test failed so, once in -count=3: gpud had
	// thawed nothing).
	testutil.Eventually(t, 10*time.Second, "the paused workload frozen", func() bool {
		b, _ := os.ReadFile(filepath.Join(paused, "cgroup.events"))
		return strings.Contains(string(b), "frozen 1")
	})
	high, _ := classified(t, e.d.Registry(), "high", occupancy.High, "high")
	h0 := high.doInt("open %s", e.gpus[0].Path)
	h1 := high.doInt("open %s", e.gpus[1].Path)
	testutil.Eventually(t, 5*time.Second, "the labelled-kill workload killed", func() bool { return !testutil.Alive(victim.pid()) })
	testutil.Eventually(t, 5*time.Second, "the paused one recorded", func() bool { return len(records(e, preempt.ActionFreeze)) > 0 })
	if r := records(e, preempt.ActionFreeze)[0]; r.Cgroup != paused || !strings.Contains(r.Result, "paused by someone else") {
		t.Fatalf("freeze record of a paused workload: %+v", r)
	}
	at := testutil.Counted(file)
	high.do("close %d", h0)
	high.do("close %d", h1)
	testutil.Eventually(t, 10*time.Second, "forgotten", func() bool { return len(records(e, preempt.ActionThaw)) > 0 })
	if from, to := stillCounting(file, 300*time.Millisecond); from != at || to != at {
		t.Fatalf("gpud thawed a workload someone else paused: counted %d, then %d, %d", at, from, to)
	}
}

// cgroupOf returns pid's cgroup v2 directory.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	root, _, err := cgroups.V2Root()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cgroups.Parse(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, info.V2Path)
}

// containerCount reads /tmp/count in a container through its init's /proc
// root (a docker exec into a frozen container would freeze too); -1 when
// unreadable.
// highAndCountingLow starts, under the running gpud, a container labelled
// high and one labelled low whose shell holds GPU 1 and counts in
// /tmp/count (containerCount reads it), and waits until it counts.
func highAndCountingLow(t *testing.T, e *env, prefix string) (high, low *ctr) {
	t.Helper()
	ctrs := &env{t: t, dir: e.dir, gpus: e.gpus, truth: e.truth}
	high = startLabelled(t, ctrs, prefix+"-high", "gpud.io/priority=high")
	low = startLabelled(t, ctrs, prefix+"-low", "gpud.io/priority=low")
	t.Cleanup(func() { exec.Command("docker", "unpause", low.id).Run() })
	if out, err := exec.Command("docker", "exec", "-d", low.id, "sh", "-c",
		"exec 3<>/dev/nvidia1; i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done").CombinedOutput(); err != nil {
		t.Fatalf("docker exec: %v %s", err, out)
	}
	testutil.Eventually(t, 10*time.Second, "the low container counts", func() bool { return containerCount(t, low) > 3 })
	return high, low
}

func containerCount(t *testing.T, c *ctr) int {
	t.Helper()
	out, err := exec.Command("docker", "inspect", "-f", "{{.State.Pid}}", c.id).Output()
	if err != nil {
		return -1
	}
	b, err := os.ReadFile("/proc/" + strings.TrimSpace(string(out)) + "/root/tmp/count")
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

// A gpud killed outright (SIGKILL) while a workload is frozen: the
// workload stays frozen (nothing runs it), and the next gpud adopts it
// from the journal (its freeze record without a thaw): it shows as gpud's
// suspension (not as paused by someone else), is thawed when the rule says
// (the high holder gone) and counts on from where it stopped; frozen
// again, gpud killed again, and the next gpud started with a --max-frozen
// the freeze has already outlived: it kills and records it. The real gpud
// binary, Docker containers labelled high and low.
func TestFrozenAdoptedAfterGpudKilled(t *testing.T) {
	requireDocker(t)
	e := newEnv(t)
	dir := e.dir
	g := newGpudProc(t, e, "--enforce", "--preempt-mode", "freeze")
	g.args = append(g.base, "--max-frozen", "1h")
	g.start()
	high, low := highAndCountingLow(t, e, "adopt")
	suspended := func(what string, ok func(s v1.Suspension) bool) {
		t.Helper()
		testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
			return len(f.Suspended) == 1 && ok(f.Suspended[0])
		})
	}
	stopped := func(what string) int {
		t.Helper()
		var at int
		testutil.Eventually(t, 10*time.Second, what, func() bool {
			a := containerCount(t, low)
			time.Sleep(300 * time.Millisecond)
			at = containerCount(t, low)
			return a > 0 && a == at
		})
		return at
	}

	hpid := high.hold(1)
	suspended("frozen by gpud", func(s v1.Suspension) bool { return !s.Paused && s.ContainerID == low.id })
	at := stopped("the counter stopped")
	g.kill9()
	time.Sleep(500 * time.Millisecond)
	if n := containerCount(t, low); n != at {
		t.Fatalf("the frozen workload ran with gpud dead: %d → %d", at, n)
	}
	journal := filepath.Join(dir, "preemptions.jsonl")
	actions := func(action string) int {
		n := 0
		for _, r := range journalRecords(t, journal) {
			if r.Action == action && r.Victim.ContainerID == low.id {
				n++
			}
		}
		return n
	}
	freezes := actions(preempt.ActionFreeze)
	g.start()
	suspended("adopted by the next gpud", func(s v1.Suspension) bool { return !s.Paused && s.ContainerID == low.id && s.KillAt != nil })
	time.Sleep(1500 * time.Millisecond)
	if n := containerCount(t, low); n != at {
		t.Fatalf("the adopted workload ran while the high holder holds the GPU: %d → %d", at, n)
	}
	if n, th := actions(preempt.ActionFreeze), actions(preempt.ActionThaw); n != freezes || th != 0 {
		t.Fatalf("after the adoption: %d freeze records (was %d), %d thaws: adopted, not thawed and frozen again", n, freezes, th)
	}
	syscall.Kill(hpid, syscall.SIGKILL)
	testutil.Eventually(t, 10*time.Second, "thawed, counting on from where it stopped", func() bool { return containerCount(t, low) > at+3 })
	recs := journalRecords(t, journal)
	thawed := false
	for _, r := range recs {
		if r.Action == preempt.ActionThaw && r.Victim.ContainerID == low.id && r.Result == "done" {
			thawed = true
		}
	}
	if !thawed {
		t.Fatalf("no thaw record of the adopted workload: %+v", recs)
	}

	// Frozen again, gpud killed again; the next one's --max-frozen is
	// already past: killed and recorded.
	high.hold(1)
	suspended("frozen again", func(s v1.Suspension) bool { return !s.Paused && s.ContainerID == low.id })
	stopped("the counter stopped again")
	g.kill9()
	time.Sleep(1500 * time.Millisecond)
	g.args = append(g.base, "--max-frozen", "1s")
	g.start()
	testutil.Eventually(t, 15*time.Second, "killed at --max-frozen after the adoption", func() bool {
		for _, r := range journalRecords(t, journal) {
			if r.Action == preempt.ActionKill && r.Victim.ContainerID == low.id && strings.Contains(r.Rule, "max-frozen") && r.Result == "done" {
				return true
			}
		}
		return false
	})
}

// --preempt-mode checkpoint on the real gate, with the CUDA double as
// libcuda: a driver without the API is said at start-up and the fallback
// (freeze) used; with it, the low counter is CUDA-checkpointed (the
// double's state says so) and frozen, then thawed and restored (running
// again) when the high holder leaves.
func TestCheckpointModeWithTheCUDADouble(t *testing.T) {
	lib := testutil.NewCUDADouble(t)
	start := func(script string) *env {
		testutil.CUDAScript(t, lib, script)
		e := newEnv(t)
		e.cfg.Enforce, e.cfg.FailOpenAfter, e.cfg.DockerHost, e.cfg.Reclaim = true, 30*time.Second, "none", "none"
		e.cfg.ReservationTTL, e.cfg.MaxFrozen = 30*time.Second, time.Hour
		e.cfg.PreemptMode, e.cfg.CheckpointFallback, e.cfg.CUDALibrary = string(preempt.ModeCheckpoint), "freeze", lib
		e.cfg.CheckpointTimeout = time.Second
		e.start()
		return e
	}
	t.Run("no API: said, and frozen", func(t *testing.T) {
		e := start("driver version=12040\n")
		if !strings.Contains(e.logs.String(), "no CUDA checkpoint API") {
			t.Fatal("start-up does not say the driver lacks the checkpoint API")
		}
		lowCounter(t, e, 0, false)
		high, _ := classified(t, e.d.Registry(), "high", occupancy.High, "high")
		high.do("open %s", e.gpus[0].Path)
		testutil.Eventually(t, 5*time.Second, "a freeze record with the fallback said", func() bool {
			fr := records(e, preempt.ActionFreeze)
			return len(fr) > 0 && strings.Contains(fr[0].Result, "no CUDA checkpoint API on this node: freeze")
		})
	})
	t.Run("checkpointed, frozen, thawed, restored", func(t *testing.T) {
		e := start("driver version=12080\n")
		if !strings.Contains(e.logs.String(), "CUDA checkpoint API loaded") {
			t.Fatal("start-up does not say the checkpoint API was loaded")
		}
		pid, file := lowCounter(t, e, 0, false)
		testutil.CUDAScript(t, lib, fmt.Sprintf("driver version=12080\npid pid=%d lock=ok checkpoint=ok restore=ok\n", pid))
		cuda, err := nvidia.OpenCUDACheckpoint(lib) // the same library: the same states
		if err != nil {
			t.Fatal(err)
		}
		high, _ := classified(t, e.d.Registry(), "high", occupancy.High, "high")
		hfd := high.doInt("open %s", e.gpus[0].Path)
		testutil.Eventually(t, 5*time.Second, "a freeze record of the checkpointed counter", func() bool {
			for _, r := range records(e, preempt.ActionFreeze) {
				if r.Victim.PID == pid && strings.Contains(r.Result, "CUDA checkpointed") {
					return true
				}
			}
			return false
		})
		if st, err := cuda.State(pid); err != nil || st != nvidia.CUDACheckpointed {
			t.Fatalf("the counter's CUDA state %q %v, want checkpointed", st, err)
		}
		at := testutil.Counted(file)
		high.do("close %d", hfd)
		testutil.Eventually(t, 10*time.Second, "thawed, counting on", func() bool { return testutil.Counted(file) > at+3 })
		if st, err := cuda.State(pid); err != nil || st != nvidia.CUDARunning {
			t.Fatalf("the counter's CUDA state %q %v after the thaw, want running", st, err)
		}
	})
}

// --preempt-mode checkpoint, gpud killed outright (SIGKILL) while a
// workload is CUDA-checkpointed and frozen: the process stays checkpointed
// (the CUDA double keeps its state with the process, as the driver does)
// and frozen; the next gpud adopts it, and when the high holder leaves it
// thaws it and restores its CUDA state (running again), and records the
// restore. Before, an adopted workload was thawed but left CUDA-locked.
func TestCheckpointedAdoptedAndRestoredAfterGpudKilled(t *testing.T) {
	requireDocker(t)
	lib := testutil.NewCUDADouble(t)
	testutil.CUDAScript(t, lib, "driver version=12080\n")
	e := newEnv(t)
	dir := e.dir
	g := newGpudProc(t, e, "--enforce", "--preempt-mode", "checkpoint", "--checkpoint-fallback", "freeze",
		"--cuda-library", lib, "--max-frozen", "1h")
	g.start()
	high, low := highAndCountingLow(t, e, "ckadopt")
	var pid int
	testutil.Eventually(t, 10*time.Second, "the low counter listed as GPU 1's holder", func() bool {
		f, err := occupancy.ReadStateFile(e.cfg.StateFile)
		if err != nil {
			return false
		}
		for _, gs := range f.GPUs {
			for _, h := range gs.Holders {
				if gs.Index == 1 && h.ContainerID == low.id {
					pid = h.PID
					return true
				}
			}
		}
		return false
	})
	testutil.CUDAScript(t, lib, fmt.Sprintf("driver version=12080\npid pid=%d lock=ok checkpoint=ok restore=ok\n", pid))
	cuda, err := nvidia.OpenCUDACheckpoint(lib) // another process: the state kept beside the library
	if err != nil {
		t.Fatal(err)
	}
	cudaState := func() string {
		st, err := cuda.State(pid)
		if err != nil {
			t.Fatalf("the counter's CUDA state: %v", err)
		}
		return st
	}
	journal := filepath.Join(dir, "preemptions.jsonl")

	hpid := high.hold(1)
	testutil.Eventually(t, 10*time.Second, "a freeze record of the checkpointed counter", func() bool {
		for _, r := range journalRecords(t, journal) {
			if r.Action == preempt.ActionFreeze && r.Victim.PID == pid && r.Checkpointed {
				return true
			}
		}
		return false
	})
	if st := cudaState(); st != nvidia.CUDACheckpointed {
		t.Fatalf("the counter's CUDA state %q, want checkpointed", st)
	}
	g.kill9()
	g.start()
	testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return len(f.Suspended) == 1 && f.Suspended[0].ContainerID == low.id && slices.Contains(f.Suspended[0].Checkpointed, pid)
	})
	if st := cudaState(); st != nvidia.CUDACheckpointed {
		t.Fatalf("the adopted counter's CUDA state %q while the high holder holds the GPU, want checkpointed", st)
	}
	at := containerCount(t, low)
	syscall.Kill(hpid, syscall.SIGKILL)
	testutil.Eventually(t, 10*time.Second, "thawed, counting on", func() bool { return containerCount(t, low) > at+3 })
	testutil.Eventually(t, 5*time.Second, "restored: running", func() bool { return cudaState() == nvidia.CUDARunning })
	restored := false
	for _, r := range journalRecords(t, journal) {
		if r.Action == preempt.ActionThaw && r.Victim.PID == pid && strings.Contains(r.Result, "CUDA restored") {
			restored = true
		}
	}
	if !restored {
		t.Fatalf("no thaw record saying the CUDA state was restored: %+v", journalRecords(t, journal))
	}
}
