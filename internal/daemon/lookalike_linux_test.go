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

	v1 "github.com/gpud/gpud/api/v1"
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

// impostor starts a shell as uid 65534 in the delegated subtree (put there
// by root, as a login puts a user's session), which itself makes the cgroup
// leaf inside it, moves in, opens the GPU and holds it; it returns the pid
// once the open is done (or refused: then it is not a holder).
func impostor(t *testing.T, deleg, leaf, gpu string) int {
	t.Helper()
	tmp, err := os.MkdirTemp("", "gpud-impostor")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	os.Chmod(tmp, 0o777)
	done, errs := filepath.Join(tmp, "done"), filepath.Join(tmp, "err")
	script := fmt.Sprintf(`read go; exec 2>"%[5]s"; mkdir "%[1]s/%[2]s" && echo $$ > "%[1]s/%[2]s/cgroup.procs" || exit 1; exec 3<>"%[3]s"; echo 0 > "%[4]s"; exec sleep 600`,
		deleg, leaf, gpu, done, errs)
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(done); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(errs)
			t.Fatalf("the impostor never opened the GPU: %s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cmd.Process.Pid
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
			// The fake GPU is the attacker's to open, as /dev/nvidia* is.
			for _, g := range e.gpus {
				os.Chmod(g.Path, 0o666)
				for d := filepath.Dir(g.Path); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
					os.Chmod(d, 0o755)
				}
			}
			low := e.container("low", "gpud.io/priority=low")
			victim := low.hold(0)
			e.settle("the low holder", holds(victim, 0, 3))
			high := e.container("high", "gpud.io/priority=high")
			deleg := delegated(t)
			pid := impostor(t, deleg, tc.leaf(high.id), e.gpus[0].Path)
			f := testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
				for _, h := range f.GPUs[0].Holders {
					if h.PID == pid {
						return true
					}
				}
				return false
			})
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
