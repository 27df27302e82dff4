package daemon_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/config"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

type env struct {
	t     *testing.T
	dir   string
	gpus  []testutil.FakeGPU
	cfg   daemon.Config
	d     *daemon.Daemon
	logs  *testutil.Buffer
	truth *occupancy.ProcFS
	stop  func()
	// settleFor bounds settle: longer in --hooks driver without kprobes,
	// where closes are found by re-reading holders' fds every 2 s.
	settleFor time.Duration
}

// testHooks is the --hooks the daemon tests run gpud with:
// GPUD_TEST_HOOKS=syscalls runs them all in syscalls mode (default: gpud's
// default, driver).
func testHooks() string {
	if h := os.Getenv("GPUD_TEST_HOOKS"); h != "" {
		return h
	}
	return config.Defaults().Hooks
}

// newEnv makes fake GPUs and a config; start() starts the daemon.
func newEnv(t *testing.T) *env {
	devDir, gpus := testutil.MakeFakeGPUs(t, 2)
	dir := t.TempDir()
	e := &env{t: t, dir: dir, gpus: gpus, logs: &testutil.Buffer{}, settleFor: 3 * time.Second}
	e.cfg = daemon.Config{Run: config.Run{
		DevDir: devDir, StateFile: filepath.Join(dir, "state.json"), StateDir: dir,
		IdleAfter: time.Minute, NodeName: "test-node",
		Hooks: testHooks(), DriverSymbols: testutil.FakeDriverSymbols,
	}}
	if e.cfg.Hooks == "driver" {
		e.settleFor = 10 * time.Second
	}
	discovered, err := nvidia.DiscoverGPUs(devDir)
	if err != nil {
		t.Fatal(err)
	}
	e.truth = &occupancy.ProcFS{Root: "/proc", Devs: occupancy.Devs(discovered), Self: os.Getpid()}
	return e
}

// sourcelessEnv is newEnv enforcing with no workload source (no Docker,
// no CRI) and no reclaim: the tests put workloads in the registry as a
// source would.
func sourcelessEnv(t *testing.T) *env {
	e := newEnv(t)
	e.cfg.Enforce = true
	e.cfg.DockerHost = "none"
	e.cfg.CRIEndpoint = "none"
	e.cfg.Reclaim = "none"
	return e
}

func (e *env) start() {
	e.t.Helper()
	e.stop = e.startDaemon()
}

// restart stops the running daemon and starts a new one on the same state.
func (e *env) restart() {
	e.t.Helper()
	e.stop()
	e.stop = e.startDaemon()
}

func (e *env) startDaemon() func() {
	e.t.Helper()
	d, stop := runDaemon(e.t, e.cfg, debugLog(e.logs))
	e.d = d
	return stop
}

type table = map[int]map[int][]int32

func (e *env) groundTruth() table {
	procs, err := e.truth.ScanAll()
	if err != nil {
		e.t.Fatal(err)
	}
	out := table{}
	for _, p := range procs {
		m := map[int][]int32{}
		for gpu, fds := range p.FDs {
			m[gpu] = slices.Sorted(slices.Values(fds))
		}
		out[p.Info.PID] = m
	}
	return out
}

// settle waits until the ledger equals the /proc ground truth and check
// accepts it, and fails the test with both tables otherwise.
func (e *env) settle(what string, check func(table) error) {
	e.t.Helper()
	deadline := time.Now().Add(testutil.Wait(e.settleFor))
	for {
		ledger, truth := e.d.Ledger().FDTable(), e.groundTruth()
		err := check(truth)
		if err == nil && !reflect.DeepEqual(ledger, truth) {
			err = fmt.Errorf("ledger differs from /proc")
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: %v\nledger: %v\n/proc:  %v", what, err, ledger, truth)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// holds is a check: pid holds exactly fds on gpu (nil fds: holds nothing on gpu).
func holds(pid, gpu int, fds ...int32) func(table) error {
	return func(tb table) error {
		got := tb[pid][gpu]
		fds = slices.Sorted(slices.Values(fds))
		if len(fds) == 0 && len(got) == 0 {
			return nil
		}
		if !slices.Equal(got, fds) {
			return fmt.Errorf("pid %d on GPU %d: fds %v, want %v", pid, gpu, got, fds)
		}
		return nil
	}
}

func all(checks ...func(table) error) func(table) error {
	return func(tb table) error {
		for _, c := range checks {
			if err := c(tb); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestStartupFindsExistingHolder(t *testing.T) {
	e := newEnv(t)
	h := startHelper(t)
	fd := int32(h.doInt("open %s", e.gpus[1].Path))
	e.start()
	// Found by the start-up reconciliation, before any event.
	if got := e.d.Ledger().FDTable()[h.pid()][1]; !slices.Equal(got, []int32{fd}) {
		t.Fatalf("holder that predates gpud: ledger has %v, want fd %d", got, fd)
	}
	e.settle("pre-existing holder", holds(h.pid(), 1, fd))
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs) == 2 && holderIn(f.GPUs[1], h.pid()) && f.GPUs[1].State == occupancy.Busy
	})
	// Without the gate nothing reports opens in driver mode: gpud says so
	// (the kernel matrix runs this test so on 5.10).
	if observeOnly(f) && f.Hooks.Mode == "driver" && (f.Hooks.Complete || !slices.ContainsFunc(f.Hooks.Missing, func(m string) bool {
		return strings.HasPrefix(m, "opens (the kernel refuses the gate")
	})) {
		t.Errorf("driver mode without the gate: hooks %+v, want incomplete with opens missing", f.Hooks)
	}
}

func holderIn(g v1.StateGPU, pid int) bool {
	for _, h := range g.Holders {
		if h.PID == pid {
			return true
		}
	}
	return false
}

func TestFDLifecycle(t *testing.T) {
	e := newEnv(t)
	e.start()
	g0, g1 := e.gpus[0].Path, e.gpus[1].Path

	h := startHelper(t)
	fd := int32(h.doInt("open %s", g0))
	e.settle("open", holds(h.pid(), 0, fd))

	dup := int32(h.doInt("dup %d", fd))
	e.settle("dup", holds(h.pid(), 0, fd, dup))

	dupfd := int32(h.doInt("dupfd %d", fd)) // fcntl(F_DUPFD, 100)
	e.settle("fcntl F_DUPFD", holds(h.pid(), 0, fd, dup, dupfd))

	h.do("dup2 %d 200", fd)
	h.do("dup3 %d 201", fd)
	e.settle("dup2/dup3", holds(h.pid(), 0, fd, dup, dupfd, 200, 201))

	h.do("closerange 100 201")
	e.settle("close_range", holds(h.pid(), 0, fd, dup))

	// dup2 over a GPU fd closes it implicitly.
	other := int32(h.doInt("open %s", g1))
	h.do("dup2 %d %d", other, dup)
	e.settle("dup2 over a GPU fd", all(holds(h.pid(), 0, fd), holds(h.pid(), 1, other, dup)))

	h.do("close %d", dup)
	h.do("close %d", other)
	h.do("close %d", fd)
	e.settle("close", func(tb table) error {
		if _, ok := tb[h.pid()]; ok {
			return fmt.Errorf("pid %d still holds %v", h.pid(), tb[h.pid()])
		}
		return nil
	})
}

func TestForkExecExit(t *testing.T) {
	e := newEnv(t)
	e.start()
	g0, g1 := e.gpus[0].Path, e.gpus[1].Path

	parent := startHelper(t)
	fd := parent.doInt("open %s cloexec", g0) // passed on only as the child's fd 3
	h := e.forkThenExec(parent, fd)
	e.waitComm(1, h.pid(), "sleep")

	// exit: killing the process drops it.
	h.cmd.Process.Kill()
	h.cmd.Wait()
	e.settle("exit", holds(h.pid(), 1))

	// A pure fork (no exec): a bash subshell inherits fd 3.
	sh := exec.Command("bash", "-c", fmt.Sprintf(`exec 3<>%s; (read -t 30 <> <(:)) & echo $!; wait`, g1))
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Process.Kill(); sh.Wait() })
	var sub int
	if _, err := fmt.Fscan(out, &sub); err != nil {
		t.Fatal(err)
	}
	// The subshell outlives bash's kill: killed apart, or it holds GPU 1
	// (fuse's device, in the kernel matrix) for 30 s after the test.
	if pidfd, err := unix.PidfdOpen(sub, 0); err == nil {
		t.Cleanup(func() { unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); unix.Close(pidfd) })
	}
	e.settle("pure fork", all(holds(sh.Process.Pid, 1, 3), holds(sub, 1, 3)))
}

// forkThenExec checks fork and exec: parent, holding fd (O_CLOEXEC) on
// GPU 0, spawns a child that inherits it as its fd 3 (fork, then exec of
// the helper), and closes its own; then a new helper holding GPU 0
// O_CLOEXEC and GPU 1 not execs: GPU 0's fd goes, GPU 1's stays. It
// returns that helper, exec'd (a sleep holding GPU 1).
func (e *env) forkThenExec(parent *helper, fd int) *helper {
	e.t.Helper()
	child := parent.doInt("spawn %d", fd)
	e.settle("fork inheritance", all(holds(parent.pid(), 0, int32(fd)), holds(child, 0, 3)))
	parent.do("close %d", fd)
	e.settle("parent closes, child keeps", all(holds(parent.pid(), 0), holds(child, 0, 3)))

	h := startHelper(e.t)
	cloexec := h.doInt("open %s cloexec", e.gpus[0].Path)
	keep := h.doInt("open %s", e.gpus[1].Path)
	e.settle("before exec", all(holds(h.pid(), 0, int32(cloexec)), holds(h.pid(), 1, int32(keep))))
	h.send("exec")
	e.settle("exec", all(holds(h.pid(), 0), holds(h.pid(), 1, int32(keep))))
	return h
}

// waitComm waits (3 s at most) until the state file lists pid as a holder
// of gpu named comm.
func (e *env) waitComm(gpu, pid int, comm string) {
	e.t.Helper()
	testutil.WaitStateFile(e.t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
		for _, hd := range f.GPUs[gpu].Holders {
			if hd.PID == pid {
				return hd.Comm == comm
			}
		}
		return false
	})
}

// dockerHolding runs a container (with docker run's extra arguments, if
// any) that holds gpu, mapped in as /dev/nvidia0, and returns its id; it
// is removed when the test ends.
func dockerHolding(t *testing.T, gpu testutil.FakeGPU, extra ...string) string {
	t.Helper()
	args := append([]string{"run", "-d", "--rm", "--network", "none"}, extra...)
	args = append(args, "--device", gpu.Path+":/dev/nvidia0", "gpud-test-busybox:latest",
		"sh", "-c", "exec 3<>/dev/nvidia0; exec sleep 600")
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v %s", err, out)
	}
	id := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", id).Run() })
	return id
}

func TestFDPassing(t *testing.T) {
	e := newEnv(t)
	e.start()
	h := startHelper(t)
	fd := h.doInt("open %s cloexec", e.gpus[0].Path) // not inherited by the receiver
	e.settle("open", holds(h.pid(), 0, int32(fd)))

	// SCM_RIGHTS to a process that held nothing.
	recv := h.doInt("sendfd %d", fd)
	if strings.HasPrefix(e.d.State().Hooks.PassedFDs, "sweep only") {
		e.passedFDsNeedResync(recv) // elsewhere the receipt is reported (#32)
	}
	e.settleReceived(recv)

	// pidfd_getfd from a third process.
	e.stealFD(h, fd)
}

// settleReceived waits until recv, which held nothing, holds the one GPU 0
// fd passed to it by SCM_RIGHTS.
func (e *env) settleReceived(recv int) {
	e.t.Helper()
	e.settle("SCM_RIGHTS", func(tb table) error {
		if len(tb[recv][0]) != 1 {
			return fmt.Errorf("receiver %d holds %v", recv, tb[recv])
		}
		return nil
	})
}

// stealFD has a new helper take owner's GPU 0 fd with pidfd_getfd, checks
// that it is seen holding it, and returns that thief.
func (e *env) stealFD(owner *helper, fd int) *helper {
	e.t.Helper()
	thief := startHelper(e.t)
	got := thief.doInt("getfd %d %d", owner.pid(), fd)
	e.passedFDsNeedResync(thief.pid())
	e.settle("pidfd_getfd", holds(thief.pid(), 0, int32(got)))
	return thief
}

// passedFDsNeedResync runs the periodic reconciliation now where no hook
// reports a received fd (--hooks driver on a kernel without kprobes: the
// mode gives that up, and the receiver is found at the next --resync-
// interval reconciliation); elsewhere it does nothing, so the event alone
// must list the receiver. It waits for /proc to show the receiver holding
// something first (the fd is received after the sender's sendmsg returns).
func (e *env) passedFDsNeedResync(receiver int) {
	e.t.Helper()
	if e.d.Monitor().Hooks().Mode != "driver" || receiveHooked(e) {
		return
	}
	for deadline := time.Now().Add(e.settleFor); len(e.groundTruth()[receiver]) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatalf("process %d never received the GPU fd", receiver)
		}
	}
	if err := e.d.Tracker().Resync(); err != nil {
		e.t.Fatal(err)
	}
}

func TestContainerHolder(t *testing.T) {
	e := newEnv(t)
	requireDocker(t)
	e.start()
	id := dockerHolding(t, e.gpus[1])
	pidOut, err := exec.Command("docker", "inspect", "-f", "{{.State.Pid}}", id).Output()
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(string(pidOut), &pid)
	e.settle("container open", holds(pid, 1, 3))
	// busybox renames itself after exec; the name catches up within a second.
	e.waitComm(1, pid, "sleep")
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return len(f.GPUs[1].Holders) > 0 })
	var found bool
	for _, hd := range f.GPUs[1].Holders {
		if hd.PID == pid {
			found = true
			if hd.ContainerID != id {
				t.Errorf("container id %q, want %q", hd.ContainerID, id)
			}
			// Unlabeled, with --default-priority unmanaged.
			if hd.CgroupID == 0 || hd.Priority != occupancy.Unmanaged {
				t.Errorf("holder identity: %+v", hd)
			}
		}
	}
	if !found {
		t.Fatalf("container process %d not in state file: %+v", pid, f.GPUs[1])
	}
	if err := exec.Command("docker", "rm", "-f", id).Run(); err != nil {
		t.Fatal(err)
	}
	e.settle("container removed", holds(pid, 1))
}

func TestGarbageStateFileRebuilt(t *testing.T) {
	for name, content := range map[string]string{
		"truncated": `{"version": 1, "node": "x", "gpus": [{"index": 0, "sta`,
		"garbage":   "\x00\xff not json at all",
		"version":   `{"version": 99, "gpus": []}`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			if err := os.WriteFile(e.cfg.StateFile, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			h := startHelper(t)
			fd := h.doInt("open %s", e.gpus[0].Path)
			e.start()
			if !strings.Contains(e.logs.String(), "state file unreadable") {
				t.Errorf("no warning about the state file in the log:\n%s", e.logs.String())
			}
			testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool {
				return holderIn(f.GPUs[0], h.pid())
			})
			if b, err := os.ReadFile(e.cfg.StateFile + ".corrupt"); err != nil || string(b) != content {
				t.Errorf("damaged file not kept aside: %v", err)
			}
			e.settle("rebuilt", holds(h.pid(), 0, int32(fd)))
		})
	}
}

func TestMonitoringSwitch(t *testing.T) {
	e := newEnv(t)
	e.start()
	if err := e.d.SetMonitoring(false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return !f.Monitoring })
	h := startHelper(t)
	fd := h.doInt("open %s", e.gpus[0].Path)
	time.Sleep(100 * time.Millisecond)
	if got := e.d.Ledger().FDTable(); len(got[h.pid()]) != 0 {
		t.Fatalf("ledger changed while monitoring was off: %v", got)
	}
	if err := e.d.SetMonitoring(true); err != nil {
		t.Fatal(err)
	}
	e.settle("switched back on", holds(h.pid(), 0, int32(fd)))
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return f.Monitoring })
	h.do("close %d", fd)
	e.settle("events flow again", holds(h.pid(), 0))
}

func TestIdleAfter(t *testing.T) {
	e := newEnv(t)
	e.cfg.IdleAfter = 1500 * time.Millisecond
	e.start()
	h := startHelper(t)
	h.doInt("open %s", e.gpus[0].Path)
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return f.GPUs[0].State == occupancy.Busy })
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return f.GPUs[0].State == occupancy.Idle })
	if f.GPUs[0].IdleSince == nil {
		t.Fatal("idle GPU without idle_since")
	}
	// A new open is activity: busy again.
	h.doInt("open %s", e.gpus[0].Path)
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return f.GPUs[0].State == occupancy.Busy })
}

// More GPU events than the ring buffer holds: the drops are counted, a full
// resync follows, and the ledger is right afterwards.
func TestOverloadDropsResync(t *testing.T) {
	e := newEnv(t)
	e.cfg.RingBytes = 4096 // 64 events
	e.start()
	steady := startHelper(t)
	fd := steady.doInt("open %s", e.gpus[1].Path)
	e.settle("steady holder", holds(steady.pid(), 1, int32(fd)))
	resyncs := e.d.Tracker().Resyncs.Load()

	gens := []*helper{startHelper(t), startHelper(t)}
	var wg sync.WaitGroup
	for _, g := range gens {
		wg.Add(1)
		go func() { defer wg.Done(); g.do("churn %s 700", e.gpus[0].Path) }()
	}
	wg.Wait()
	e.settle("after the flood", all(holds(steady.pid(), 1, int32(fd)), holds(gens[0].pid(), 0), holds(gens[1].pid(), 0)))
	if e.d.Tracker().Drops.Load() == 0 {
		t.Fatal("a 64-event ring buffer absorbed the flood: the test did not overload it")
	}
	if e.d.Tracker().Resyncs.Load() <= resyncs {
		t.Fatalf("drops (%d) were not followed by a resync", e.d.Tracker().Drops.Load())
	}
	// The drops and the resyncs they caused are on /metrics.
	mfs, err := e.d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var dropped, dropResyncs float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "gpud_events_dropped_total":
				dropped = m.GetCounter().GetValue()
			case "gpud_resyncs_total":
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == "dropped" {
						dropResyncs = m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if dropped < float64(e.d.Tracker().Drops.Load()) || dropResyncs < 1 {
		t.Errorf("metrics: gpud_events_dropped_total %v (tracker saw %d), gpud_resyncs_total{reason=dropped} %v",
			dropped, e.d.Tracker().Drops.Load(), dropResyncs)
	}
	t.Logf("dropped %d events, %d resyncs", e.d.Tracker().Drops.Load(), e.d.Tracker().Resyncs.Load()-resyncs)
}
