package daemon_test

// Wrong-kill safety (issue 7, item 7): between gpud's decision to kill a
// low-priority holder (or reclaim its container) and the action, the world
// changes; nobody innocent may be signalled. preempt.SetHooks stops the
// executor right after the decision, the test makes the change, then lets
// the action go on.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

// pause stops the executor at a hook until the test releases it.
type pause struct {
	hit     chan any
	release chan struct{}
	once    sync.Once
}

func newPause(t *testing.T) *pause {
	p := &pause{hit: make(chan any, 1), release: make(chan struct{})}
	// Registered after the daemon's start, so it runs before its stop: an
	// executor still parked here would hold up the stop.
	t.Cleanup(p.go_)
	t.Cleanup(func() { preempt.SetHooks(nil) })
	return p
}

// at parks the calling executor goroutine (once) and hands x to the test.
func (p *pause) at(x any) {
	p.hit <- x
	<-p.release
}

func (p *pause) go_() { p.once.Do(func() { close(p.release) }) }

func (p *pause) wait(t *testing.T, what string) any {
	t.Helper()
	select {
	case x := <-p.hit:
		return x
	case <-time.After(10 * time.Second):
		t.Fatalf("the executor never reached %s", what)
		return nil
	}
}

// pauseKillOf parks the kill of pid after the decision, before the pidfd.
func pauseKillOf(t *testing.T, pid int) *pause {
	p := newPause(t)
	preempt.SetHooks(&preempt.Hooks{BeforeKill: func(v preempt.Victim) {
		if v.PID == pid {
			p.at(v)
		}
	}})
	return p
}

// v2Dir is the cgroup v2 directory pid is in.
func v2Dir(t *testing.T, pid int) string {
	t.Helper()
	root, _, err := cgroups.V2Root()
	if err != nil {
		t.Fatal(err)
	}
	info, err := cgroups.ReadProc(pid)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, info.V2Path)
}

func killRecordOf(e *env, pid int) (preempt.Record, bool) {
	for _, k := range records(e, preempt.ActionKill) {
		if k.Victim.PID == pid {
			return k, true
		}
	}
	return preempt.Record{}, false
}

// (a) The victim exits and its PID is handed to an innocent process before
// the kill. The innocent process is made as much like the victim as it can
// be: it holds the same GPU and sits in the victim's container cgroup, so
// the only thing telling them apart is the process identity (start time,
// pidfs inode) taken at the decision. The PID reuse is real: the kernel is
// told (ns_last_pid) to hand out the victim's PID next. The same-clock-tick
// case, where only the pidfs inode differs, is kill.TestKillPIDReuse (internal/preempt/kill).
func TestWrongKillPIDReuse(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimNone)
	e.start()
	const rounds = 3
	for round := 0; round < rounds; round++ {
		low := e.container("low", "gpud.io/priority=low")
		victim := low.hold(0)
		lowDir := v2Dir(t, victim)
		e.settle("the low holder", holds(victim, 0, 3))
		p := pauseKillOf(t, victim)
		high := e.container("high", "gpud.io/priority=high")
		go high.tryOpen(0) // the high open decides; the kill parks at the hook
		p.wait(t, "the kill of the victim")

		syscall.Kill(victim, syscall.SIGKILL)
		testutil.Eventually(t, 10*time.Second, "the victim's PID is free", func() bool {
			_, err := os.Stat(fmt.Sprintf("/proc/%d", victim))
			return err != nil
		})
		innocent := reusePID(t, victim)
		innocent.doInt("open %s", e.gpus[0].Path)
		testutil.JoinCgroup(t, lowDir, innocent.pid())
		if fds, _ := e.truth.GPUFDs(victim); len(fds[0]) == 0 {
			t.Fatal("the innocent process does not hold the victim's GPU")
		}
		p.go_()

		testutil.Eventually(t, 10*time.Second, "the kill is recorded", func() bool { _, ok := killRecordOf(e, victim); return ok })
		time.Sleep(200 * time.Millisecond)
		if !testutil.Alive(innocent.pid()) {
			t.Fatalf("round %d: the innocent process holding the reused PID %d was killed", round, victim)
		}
		if r, _ := killRecordOf(e, victim); r.Result != "gone" || r.Signal != "" {
			t.Fatalf("round %d: kill record %+v, want result gone and no signal", round, r)
		}
		t.Logf("round %d: PID %d reused by an innocent GPU holder in the victim's cgroup: not signalled", round, victim)
		innocent.cmd.Process.Kill()
		innocent.cmd.Wait()
		exec.Command("docker", "rm", "-f", low.id, high.id).Run()
	}
}

// reusePID starts a helper process with PID pid (the kernel hands out
// ns_last_pid+1 next; another process may take it first: try again).
func reusePID(t *testing.T, pid int) *helper {
	t.Helper()
	testutil.RequireRoot(t)
	for attempt := 0; attempt < 200; attempt++ {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0o644); err != nil {
			t.Fatalf("cannot set ns_last_pid: %v", err)
		}
		h := startHelper(t)
		if h.pid() == pid {
			t.Logf("PID %d reused after %d attempts", pid, attempt+1)
			return h
		}
		h.cmd.Process.Kill()
		h.cmd.Wait()
	}
	t.Fatalf("could not get PID %d reused in 200 attempts", pid)
	return nil
}

// (b) Between the decision and the kill, the victim is moved to another
// cgroup (echo pid > cgroup.procs). Moved into a high-priority container or
// into a cgroup gpud does not classify, it is no longer the low workload's
// process: it must not be killed. Moved into a child cgroup of its own
// container, it still is: it must be killed.
func TestWrongKillVictimMovesCgroup(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimNone) // a reclaim would end the moved process with its container's PID namespace
	e.start()
	high := e.container("high", "gpud.io/priority=high")
	highPID := high.hold(1)
	unclassified, _ := testutil.Cgroup(t, "unclassified")
	for _, c := range []struct {
		name   string
		target func(victim int, low *ctr) string
		killed bool
	}{
		{"into the high-priority container's cgroup", func(int, *ctr) string { return v2Dir(t, highPID) }, false},
		{"into an unclassified cgroup", func(int, *ctr) string { return unclassified }, false},
		{"into a child cgroup of its own container", func(victim int, low *ctr) string {
			dir := filepath.Join(v2Dir(t, victim), "moved")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
					time.Sleep(20 * time.Millisecond)
				}
			})
			return dir
		}, true},
	} {
		low := e.container("low", "gpud.io/priority=low")
		victim := low.hold(0)
		e.settle("the low holder", all(holds(victim, 0, 3), holds(highPID, 1, 3)))
		p := pauseKillOf(t, victim)
		go high.tryOpen(0)
		p.wait(t, "the kill of the victim")
		dir := c.target(victim, low)
		testutil.JoinCgroup(t, dir, victim)
		p.go_()

		testutil.Eventually(t, 10*time.Second, "the kill is recorded", func() bool { _, ok := killRecordOf(e, victim); return ok })
		r, _ := killRecordOf(e, victim)
		if c.killed {
			if testutil.Alive(victim) || r.Result != "done" {
				t.Fatalf("moved %s: alive %v, record %+v; want it killed", c.name, testutil.Alive(victim), r)
			}
		} else {
			time.Sleep(200 * time.Millisecond)
			if !testutil.Alive(victim) || r.Result != "gone" || r.Signal != "" {
				t.Fatalf("moved %s: alive %v, record %+v; want it spared, no signal", c.name, testutil.Alive(victim), r)
			}
		}
		t.Logf("victim moved %s between decision and kill: killed %v (want %v)", c.name, !testutil.Alive(victim), c.killed)
		exec.Command("docker", "rm", "-f", low.id).Run()
	}
	if !testutil.Alive(highPID) {
		t.Fatal("the high holder was harmed")
	}
}

// (c) The container decided on is removed and a new one with the same name
// started between the decision and the reclaim: the reclaim acts on the
// container ID decided on, which is gone; the new container is untouched.
// Both reclaim paths: after a kill (stop), and after a refusal (remove).
func TestWrongKillContainerReplaced(t *testing.T) {
	for _, mode := range []string{preempt.ReclaimStop, preempt.ReclaimRemove} {
		t.Run(mode, func(t *testing.T) {
			e := enforcingEnv(t, mode)
			e.start()
			const rounds = 2
			for round := 0; round < rounds; round++ {
				name := fmt.Sprintf("gpud-wrongkill-%s-%d-%d", mode, round, time.Now().UnixNano()%1e6)
				old := runNamed(t, e, name)
				p := newPause(t)
				ended := make(chan error, 1)
				preempt.SetHooks(&preempt.Hooks{
					BeforeReclaim: func(tg preempt.Target) {
						if tg.ContainerID == old {
							p.at(tg)
						}
					},
					AfterReclaim: func(tg preempt.Target, err error) {
						if tg.ContainerID == old {
							ended <- err
						}
					},
				})
				var how string
				if mode == preempt.ReclaimStop {
					// A kill: the old container's holder is preempted by a high open.
					c := &ctr{t: t, e: e, id: old}
					victim := c.hold(0)
					high := e.container("high", "gpud.io/priority=high")
					high.tryOpen(0)
					testutil.Eventually(t, 10*time.Second, "the victim is killed", func() bool { return !testutil.Alive(victim) })
					how = "killed its holder, stop"
				} else {
					// A refusal: the old container's open of a high-held GPU.
					high := e.container("high", "gpud.io/priority=high")
					hp := high.hold(1)
					c := &ctr{t: t, e: e, id: old}
					if got := c.tryOpen(1); !strings.Contains(got, "not permitted") {
						t.Fatalf("low open of a high-held GPU: %q", got)
					}
					defer func() {
						if !testutil.Alive(hp) {
							t.Error("the high holder was harmed")
						}
					}()
					how = "refused its open, remove"
				}
				tg := p.wait(t, "the reclaim").(preempt.Target)
				if out, err := exec.Command("docker", "rm", "-f", name).CombinedOutput(); err != nil {
					t.Fatalf("docker rm: %v %s", err, out)
				}
				replacement := runNamed(t, e, name)
				p.go_()
				select {
				case err := <-ended:
					if err != nil {
						t.Fatalf("reclaim of the old container: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the reclaim never ended")
				}
				time.Sleep(300 * time.Millisecond)
				nc := &ctr{t: t, e: e, id: replacement}
				if !nc.running() {
					t.Fatalf("round %d: the new container %q (%s) was reclaimed in place of %s", round, name, replacement[:12], tg.ContainerID[:12])
				}
				if out, _ := exec.Command("docker", "inspect", "-f", "{{.Name}}", replacement).Output(); strings.TrimSpace(string(out)) != "/"+name {
					t.Fatalf("the new container is not named %s: %s", name, out)
				}
				t.Logf("round %d (%s): reclaim of %s ran after %q was replaced by %s: the new container runs", round, how, old[:12], name, replacement[:12])
				exec.Command("docker", "rm", "-f", name).Run()
			}
		})
	}
}

// runNamed starts a low-priority container named name and returns its ID
// once gpud has classified it.
func runNamed(t *testing.T, e *env, name string) string {
	t.Helper()
	out, err := exec.Command("docker", "run", "-d", "--network", "none", "--name", name,
		"--device", e.gpus[0].Path+":/dev/nvidia0", "--device", e.gpus[1].Path+":/dev/nvidia1",
		"--label", "gpud.io/priority=low",
		"gpud-test-busybox:latest", "sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait").CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v %s", err, out)
	}
	id := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", id).Run() })
	testutil.Eventually(t, 10*time.Second, "container "+name+" classified", func() bool {
		w, ok := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: id})
		return ok && w.CgroupID != 0
	})
	return id
}
