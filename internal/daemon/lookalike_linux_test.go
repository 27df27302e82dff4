package daemon_test

// Issue 32, class 1: a cgroup is a workload's only where its runtime made
// it. An unprivileged user who owns a delegated cgroup v2 subtree makes,
// inside it, a cgroup named as a real container's (docker-<id>.scope, or
// the bare id) or as a made-up container's, joins it and opens a GPU a low
// container holds: it is a host process (unmanaged), never high, so the
// low holder lives; the look-alike is counted and logged.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

// delegated makes a cgroup owned by uid 65534 as systemd delegates one
// (the directory, cgroup.procs and cgroup.subtree_control chowned).
func delegated(t *testing.T) string {
	t.Helper()
	dir, _ := testutil.Cgroup(t, "deleg")
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control"} {
		if err := os.Chown(filepath.Join(dir, f), 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// gpusOpenToAll makes the fake GPUs anyone's to open, as /dev/nvidia* are: an
// attacker's shell as uid 65534 can open them.
func gpusOpenToAll(e *env) {
	for _, g := range e.gpus {
		os.Chmod(g.Path, 0o666)
		for d := filepath.Dir(g.Path); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
			os.Chmod(d, 0o755)
		}
	}
}

// impostor starts a shell as uid 65534 in the delegated subtree (put there
// by root, as a login puts a user's session), which itself makes the cgroup
// leaf inside it, moves in, opens the GPU and holds it; it returns the pid
// once the open is done, and fails the test if the open was refused.
func impostor(t *testing.T, deleg, leaf, gpu string) int {
	t.Helper()
	pid, opened, errs := startImpostor(t, deleg, leaf, gpu)
	if !opened {
		t.Fatalf("the impostor never opened the GPU: %s", errs)
	}
	return pid
}

// tryImpostor is impostor for an open that may be refused: it returns the
// shell's pid and whether the open succeeded (then it holds the GPU).
func tryImpostor(t *testing.T, deleg, leaf, gpu string) (int, bool) {
	t.Helper()
	pid, opened, _ := startImpostor(t, deleg, leaf, gpu)
	return pid, opened
}

// startImpostor runs the impostor's shell and waits for its open; it
// returns the pid, whether the open succeeded and the shell's stderr.
func startImpostor(t *testing.T, deleg, leaf, gpu string) (int, bool, []byte) {
	t.Helper()
	tmp, err := os.MkdirTemp("", "gpud-impostor")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	os.Chmod(tmp, 0o777)
	res, errs := filepath.Join(tmp, "result"), filepath.Join(tmp, "err")
	// `command exec`: a refused redirection does not end the shell.
	script := fmt.Sprintf(`read go; exec 2>"%[5]s"; mkdir "%[1]s/%[2]s" && echo $$ > "%[1]s/%[2]s/cgroup.procs" || { echo setup > "%[4]s"; exit 1; }
if command exec 3<>"%[3]s"; then echo opened > "%[4]s"; else echo refused > "%[4]s"; fi; exec sleep 600`,
		deleg, leaf, gpu, res, errs)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		os.Remove(filepath.Join(deleg, leaf))
	})
	testutil.JoinCgroup(t, deleg, cmd.Process.Pid)
	in.Write([]byte("go\n"))
	var out []byte
	testutil.Eventually(t, 10*time.Second, "the impostor's open", func() bool {
		out, _ = os.ReadFile(res)
		return len(out) > 0
	})
	stderr, _ := os.ReadFile(errs)
	switch strings.TrimSpace(string(out)) {
	case "opened":
		return cmd.Process.Pid, true, stderr
	case "refused":
		return cmd.Process.Pid, false, stderr
	}
	t.Fatalf("the impostor could not make its cgroup: %s %s", out, stderr)
	return 0, false, nil
}

func TestLookalikeCgroupIsHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		def  occupancy.Priority
		leaf func(highID string) string
	}{
		{"scope of a high container", occupancy.Unmanaged, func(id string) string { return "docker-" + id + ".scope" }},
		{"bare id of a high container", occupancy.Unmanaged, func(id string) string { return id }},
		{"made-up container, default high", occupancy.High, func(string) string {
			b := make([]byte, 32)
			rand.Read(b)
			return "docker-" + hex.EncodeToString(b) + ".scope"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := enforcingEnv(t, preempt.ReclaimNone)
			e.cfg.DefaultPriority = tc.def
			e.start()
			gpusOpenToAll(e) // the fake GPU is the attacker's to open
			low := e.container("low", "gpud.io/priority=low")
			victim := low.hold(0)
			e.settle("the low holder", holds(victim, 0, 3))
			high := e.container("high", "gpud.io/priority=high")
			deleg := delegated(t)
			pid := impostor(t, deleg, tc.leaf(high.id), e.gpus[0].Path)
			f := waitHolder(t, e, 0, pid)
			for _, h := range f.GPUs[0].Holders {
				if h.PID == pid && (string(h.Priority) != string(occupancy.Unmanaged) || h.ContainerID != "") {
					t.Errorf("impostor listed as %+v, want an unmanaged host process", h)
				}
			}
			time.Sleep(2 * time.Second) // a kill would have come within ms
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", victim)); err != nil {
				t.Errorf("the low holder was killed for a look-alike")
			}
			for _, r := range records(e, preempt.ActionKill) {
				t.Errorf("preemption journaled: %+v", r)
			}
			testutil.Eventually(t, 5*time.Second, "the look-alike logged", func() bool {
				return strings.Contains(e.logs.String(), "a cgroup named like a workload's")
			})
		})
	}
}
