package daemon_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

// #32 class 4: a GPU fd passed by SCM_RIGHTS from an unmanaged host process
// into a low container, while a high container holds that GPU. No open
// happens in the container, so the gate has nothing to refuse: the
// receiver must be found at receipt (receive_fd kprobe, sock tracepoints,
// or sys_exit in --hooks syscalls), listed as a holder and killed by the
// rule for a low open that got past the gate, within the gate's own bound,
// with no sweep (--resync-interval 0) and no resync forced by the test.
// recvmsg and recvmmsg alike; the receiver waits inside the call when the
// fd is sent.
func TestPassedFDReceiverKilled(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimNone)
	e.cfg.ResyncInterval = 0 // no sweep: only the kernel's events can find the receiver
	e.start()
	bin := bypassBin(t)
	t.Logf("passed fds: %s", e.d.State().Hooks.PassedFDs)

	high := e.runCtr("high", bin, []string{"--device", gpu1(e)}, "gpud.io/priority=high")
	highPID := high.hold(1)
	sender := startHelper(t) // a host process: no workload's
	fd := sender.doInt("open %s cloexec", e.gpus[1].Path)

	for _, how := range []string{"recvmsg", "recvmmsg"} {
		dir := t.TempDir()
		low := e.runCtr("low", bin, []string{"-v", dir + ":/sock"}, "gpud.io/priority=low")
		cmd := "/gpud-bypass recvfd /sock/s " + how + " hold >/tmp/answer 2>&1"
		if out, err := exec.Command("docker", "exec", "-d", low.id, "sh", "-c", cmd).CombinedOutput(); err != nil {
			t.Fatalf("docker exec: %v %s", err, out)
		}
		sock := filepath.Join(dir, "s")
		var receiver int
		testutil.Eventually(t, 10*time.Second, "the receiver listens", func() bool {
			if _, err := os.Stat(sock); err != nil {
				return false
			}
			for _, pid := range low.pids() {
				if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "gpud-bypass" {
					receiver = pid
					return true
				}
			}
			return false
		})

		sender.do("sendfdto %s %d", sock, fd)
		sent := time.Now()
		var rec preempt.Record
		if !testutil.Poll(2*time.Second, func() bool {
			for _, k := range records(e, preempt.ActionKill) {
				if k.Victim.ContainerID == low.id && k.GPU == 1 {
					rec = k
					return true
				}
			}
			return false
		}) {
			t.Fatalf("%s: the receiver %d of a high-held GPU's fd was not killed within 2 s (answer %q, ledger %v)",
				how, receiver, low.sh("cat /tmp/answer"), e.d.Ledger().FDTable()[receiver])
		}
		if rec.Victim.PID != receiver || rec.Result != "done" || rec.Signal != "SIGKILL" {
			t.Fatalf("%s: kill record %+v, want the receiver %d killed", how, rec, receiver)
		}
		testutil.Eventually(t, 5*time.Second, "the receiver is gone", func() bool { return !testutil.Alive(receiver) })
		t.Logf("%s: receiver killed %v after the send (%s)", how, time.Since(sent).Round(time.Millisecond), rec.Rule)
	}
	if !testutil.Alive(highPID) || !high.running() {
		t.Fatal("the high holder was harmed")
	}
	if !testutil.Alive(sender.pid()) {
		t.Fatal("the host sender was killed")
	}
}
