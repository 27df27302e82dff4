package daemon_test

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// agentEnv is an enforcing daemon with the default agents (Run.Complete
// fills them in), no workload source (the tests put workloads in the
// registry as a source would) and the given default class.
func agentEnv(t *testing.T, def occupancy.Priority, idleAfter time.Duration) *env {
	t.Helper()
	testutil.RequireRoot(t)
	e := sourcelessEnv(t)
	e.cfg.NRISocket = "none"
	e.cfg.DefaultPriority = def
	e.cfg.IdleAfter = idleAfter
	e.start()
	return e
}

// agentBinary is a copy of sleep named as NVIDIA's persistence daemon: a
// process exec'ing it has the comm "nvidia-persiste" (15 bytes kept).
func agentBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpud-agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open("/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	bin := filepath.Join(dir, "nvidia-persistenced")
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return bin
}

// onHost starts a helper in a new cgroup that is no container's or pod's:
// a host process (as a systemd unit's would be).
func onHost(t *testing.T) *helper {
	t.Helper()
	dir, _ := testutil.Cgroup(t, "host")
	h := startHelper(t)
	testutil.JoinCgroup(t, dir, h.pid())
	return h
}

func pids(hs []v1.StateHolder) []int {
	var out []int
	for _, h := range hs {
		out = append(out, h.PID)
	}
	return out
}

// With --default-priority low, NVIDIA's agents would be low holders:
// killed by any high open, and no GPU would ever be idle. As agents (root
// host processes with an agent's name), they are shown under agents,
// survive a high open, and their opens are no activity. A non-root process
// that renamed itself like an agent, and a root one in a low-labelled
// workload, are ordinary low holders: they die.
func TestAgentsAreNotHoldersDefaultLow(t *testing.T) {
	e := agentEnv(t, occupancy.Low, 2*time.Second)
	reg := e.d.Registry()
	gpu := e.gpus[0].Path
	openToAll(t, gpu)

	// The persistence daemon: a root host process, opens the GPU and
	// execs "nvidia-persistenced" keeping the fd.
	agent := onHost(t)
	agent.doInt("open %s", gpu)
	agent.send("exec %s", agentBinary(t))
	// GPU Feature Discovery's pattern: root, an agent's name, opening and
	// closing the GPU all the time.
	gfd := onHost(t)
	gfd.do("comm gpu-feature-dis")
	// Spoofers: a non-root process with the persistence daemon's name, and a
	// root one in a workload labelled low.
	// (a workload of the default class; a look-alike container cgroup is
	// a host cgroup now, whose processes are never managed)
	spoofer, _ := classified(t, reg, "agents-spoofer", occupancy.Low, "agents-spoofer")
	spoofer.do("comm nvidia-persiste") // first: after setuid the process is not dumpable, /proc/self/comm root's
	spoofer.do("setuid 65534")
	spoofer.doInt("open %s", gpu)
	labelled, _ := classified(t, reg, "agents-lowlabel", occupancy.Low, "agents-lowlabel")
	labelled.do("comm nvidia-persiste")
	labelled.doInt("open %s", gpu)

	f := testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		g := f.GPUs[0]
		return slices.Contains(pids(g.Agents), agent.pid()) && !slices.Contains(pids(g.Holders), agent.pid()) &&
			testutil.HolderPriority(f, 0, spoofer.pid()) == occupancy.Low && testutil.HolderPriority(f, 0, labelled.pid()) == occupancy.Low
	})
	for _, a := range f.GPUs[0].Agents {
		if a.PID == agent.pid() && (a.Comm != "nvidia-persiste" || a.Priority != occupancy.Unmanaged) {
			t.Errorf("the agent in the state file: %+v", a)
		}
	}
	if ex, err := e.d.Explain(agent.pid()); err != nil || ex.Reason != workload.ReasonAgent {
		t.Errorf("explain of the agent: %+v, %v", ex, err)
	}
	if ex, err := e.d.Explain(spoofer.pid()); err != nil || ex.Reason == workload.ReasonAgent || ex.Priority != occupancy.Low {
		t.Errorf("explain of the non-root spoofer: %+v, %v", ex, err)
	}

	// A high open: the low holders die, the agent does not.
	hi, _ := classified(t, reg, "agents-high", occupancy.High, "agents-high")
	hiFD := hi.doInt("open %s", gpu)
	waitDead(t, e, spoofer.pid(), "the non-root spoofer dies")
	waitDead(t, e, labelled.pid(), "the root spoofer of a low-labelled workload dies")
	time.Sleep(300 * time.Millisecond)
	if !testutil.Alive(agent.pid()) {
		t.Fatal("a high open killed the agent")
	}

	// The agent keeps opening the GPU the high holder holds: never refused,
	// never killed, and no activity: the GPU goes idle after idle-after.
	churnStart := time.Now()
	gfd.send("churn %s 5000", gpu)
	if !gfd.out.Scan() {
		t.Fatal("the churning agent gave no answer")
	}
	if n := atoi(gfd.out.Text()); n < 10 {
		t.Errorf("the churning agent opened the GPU %d times (%q): refused?", n, gfd.out.Text())
	}
	// 5 s of the agent's opens, idle-after 2 s: idle, and idle since
	// before the agent began (its opens never moved the last activity).
	f = testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return f.GPUs[0].State == occupancy.Idle
	})
	if s := f.GPUs[0].IdleSince; s == nil || !s.Before(churnStart) {
		t.Errorf("idle since %v: the agent's opens from %v counted as activity", s, churnStart)
	}
	if !testutil.Alive(gfd.pid()) || !testutil.Alive(agent.pid()) || !testutil.Alive(hi.pid()) {
		t.Fatal("an agent or the high holder died")
	}
	if got := pids(f.GPUs[0].Holders); !slices.Equal(got, []int{hi.pid()}) {
		t.Errorf("holders of GPU 0: %v, want only the high one %d", got, hi.pid())
	}
	for _, r := range records(e, preempt.ActionKill) {
		if r.Victim.PID == agent.pid() || r.Victim.PID == gfd.pid() {
			t.Errorf("a kill record names an agent: %+v", r)
		}
	}

	// A GPU that only the agent holds is free.
	hi.do("close %d", hiFD)
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		return f.GPUs[0].State == occupancy.Free && len(f.GPUs[0].Holders) == 0 && slices.Contains(pids(f.GPUs[0].Agents), agent.pid())
	})
}

// With --default-priority high, an agent would be a high holder, and every low open of its GPU would be refused. As an
// agent it blocks nobody; a non-root spoofer with its name does.
func TestAgentsAreNotHoldersDefaultHigh(t *testing.T) {
	e := agentEnv(t, occupancy.High, time.Minute)
	reg := e.d.Registry()
	gpu := e.gpus[1].Path

	agent := onHost(t)
	agent.doInt("open %s", gpu)
	agent.send("exec %s", agentBinary(t))
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		return slices.Contains(pids(f.GPUs[1].Agents), agent.pid()) && f.GPUs[1].State == occupancy.Free
	})
	lo, _ := classified(t, reg, "agents-low", occupancy.Low, "agents-low")
	// The gate's policy follows the ledger within a tick: give it two.
	time.Sleep(2 * time.Second)
	if got := tryOpen(lo, gpu); got != "ok" {
		t.Fatalf("a low open of a GPU only an agent holds: %q, want ok", got)
	}
	if !testutil.Alive(agent.pid()) {
		t.Fatal("the agent died")
	}

	// The same name without root is a high holder (the default): low opens
	// are refused again.
	openToAll(t, gpu)
	spoofer, _ := classified(t, reg, "agents-spoofer-hi", occupancy.High, "agents-spoofer-hi")
	spoofer.do("comm nvidia-persiste") // first: after setuid the process is not dumpable, /proc/self/comm root's
	spoofer.do("setuid 65534")
	spoofer.doInt("open %s", gpu)
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		return testutil.HolderPriority(f, 1, spoofer.pid()) == occupancy.High
	})
	testutil.Eventually(t, 5*time.Second, "a low open refused beside the spoofer", func() bool {
		return tryOpen(lo, gpu) == "operation not permitted"
	})
}

// openToAll lets a non-root spoofer open the fake GPU node (its class, not
// the file mode, is what the test is about).
// The node and the test's temporary directories above it (t.TempDir's,
// 0700) are opened up.
func openToAll(t *testing.T, path string) {
	t.Helper()
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	for dir, i := filepath.Dir(path), 0; i < 2; dir, i = filepath.Dir(dir), i+1 {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}
