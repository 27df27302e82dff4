package compute

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/testutil"
)

// guardBound is the written bound (docs/sharing.md "Fail open"): a pod the
// scheduler froze is thawed this soon after gpud dies, with no gpud
// restarted.
const guardBound = 100 * time.Millisecond

// gpud's scheduler SIGKILLed mid-slice and its cgroup torn down as a
// runtime or systemd does (every process left in it killed),
// no gpud started again: the thaw guard, the real gpud binary's
// thaw-guard, which left that cgroup, thaws both pods within guardBound.
func TestKilledSchedulerThawedByItsGuard(t *testing.T) {
	testutil.RequireRoot(t)
	bin, err := testutil.BuildGpud()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	a, pa := freezerCgroup(t, "guard-a")
	b, pb := freezerCgroup(t, "guard-b")
	gpudCg, _ := testutil.Cgroup(t, "guard-gpud") // the container's (or unit's) cgroup
	cgfd, err := syscall.Open(gpudCg, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(cgfd)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(self, "-test.run=^TestKilledChild$")
	child.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{state, strconv.Itoa(pa), a, strconv.Itoa(pb), b}, " "), guardEnv+"="+bin)
	child.Stderr = os.Stderr
	child.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgfd}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	// On a hybrid host gpud is in a v1 cgroup of its container too (runc's
	// v1 manager tears down by it); the child starts its guard only at its
	// first freeze, well after this.
	var gpudV1 string
	if cgroups.V1FreezerMount() != "" {
		gpudV1 = testutil.V1FreezerCgroup(t, "guard-gpud-v1")
		if err := os.WriteFile(filepath.Join(gpudV1, "cgroup.procs"), []byte(strconv.Itoa(child.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 10*time.Second, "the 10 % pod frozen", func() bool { return paused(t, a) })
	// The guard is out of gpud's cgroup; gpud is in it.
	out, err := exec.Command("pgrep", "-f", bin+" "+GuardCommand).Output()
	guards := strings.Fields(string(out))
	if err != nil || len(guards) != 1 {
		t.Fatalf("guards running: %q (%v), want one", guards, err)
	}
	rel := strings.TrimPrefix(gpudCg, v2Root(t))
	for _, p := range []struct {
		pid  string
		want bool
	}{{strconv.Itoa(child.Process.Pid), true}, {guards[0], false}} {
		b, err := os.ReadFile(filepath.Join("/proc", p.pid, "cgroup"))
		if err != nil || strings.Contains(string(b), "::"+rel+"\n") != p.want {
			t.Fatalf("process %s in gpud's cgroup %s: want %v; its cgroups: %q (%v)", p.pid, rel, p.want, b, err)
		}
		if v1rel := strings.TrimPrefix(gpudV1, cgroups.V1FreezerMount()); gpudV1 != "" && strings.Contains(string(b), ":freezer:"+v1rel+"\n") != p.want {
			t.Fatalf("process %s in gpud's v1 freezer cgroup %s: want %v; its cgroups: %q", p.pid, v1rel, p.want, b)
		}
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The runtime's teardown: whatever is still in gpud's cgroup dies (as
	// runc's signalAllProcesses does, one by one).
	procs, err := os.ReadFile(filepath.Join(gpudCg, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	if gpudV1 != "" {
		v1procs, err := os.ReadFile(filepath.Join(gpudV1, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		procs = append(append(procs, '\n'), v1procs...)
	}
	for _, f := range strings.Fields(string(procs)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	child.Wait()
	for paused(t, a) || paused(t, b) {
		if time.Since(killed) > 5*time.Second {
			t.Fatal("pods still frozen 5 s after gpud's SIGKILL: no guard thawed them")
		}
		time.Sleep(time.Millisecond)
	}
	if took := time.Since(killed); took > guardBound {
		t.Errorf("thawed %s after gpud's SIGKILL, want within %s", took, guardBound)
	} else {
		t.Logf("thawed %s after gpud's SIGKILL", took)
	}
	// It does not stay: one guard per gpud, gone with its work done.
	testutil.Eventually(t, 5*time.Second, "the guard exits", func() bool {
		out, _ := exec.Command("pgrep", "-f", bin+" "+GuardCommand).Output()
		return len(strings.TrimSpace(string(out))) == 0
	})
}
