package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
)

var cgroupSeq atomic.Int64

// Cgroup makes a new cgroup v2 directory under the root for the test (its
// name carries name, the test process's pid and a sequence number) and
// returns it with its id; it is removed at the end of the test once its
// members have gone.
func Cgroup(tb testing.TB, name string) (dir string, id uint64) {
	tb.Helper()
	root, _, err := cgroups.V2Root()
	if err != nil {
		Skip(tb, "no cgroup v2 hierarchy: "+err.Error())
	}
	dir = filepath.Join(root, fmt.Sprintf("gpud-test-%s-%d-%d", name, os.Getpid(), cgroupSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { removeCgroup(dir) })
	if id, err = cgroups.ID(dir); err != nil {
		tb.Fatal(err)
	}
	return dir, id
}

// runtimeParent makes (if missing) and returns a runtime's parent cgroup
// under the v2 root: a container's or pod's cgroup is believed only where
// its runtime makes one (cgroups.Parse). It stays: other tests, or the
// runtime itself, may be using it.
func runtimeParent(tb testing.TB, rel string) string {
	tb.Helper()
	root, _, err := cgroups.V2Root()
	if err != nil {
		Skip(tb, "no cgroup v2 hierarchy: "+err.Error())
	}
	dir := filepath.Join(root, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// ContainerCgroup makes a cgroup where and as Docker's cgroupfs driver
// makes a container's (/docker/<id>), so that gpud takes its processes for
// a container's; it returns the directory, the container id and the
// cgroup id.
func ContainerCgroup(tb testing.TB) (dir, containerID string, id uint64) {
	tb.Helper()
	parent := runtimeParent(tb, "docker")
	b := make([]byte, 32)
	rand.Read(b)
	containerID = hex.EncodeToString(b)
	dir = filepath.Join(parent, containerID)
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { removeCgroup(dir) })
	id, err := cgroups.ID(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return dir, containerID, id
}

// PodCgroup makes a pod's cgroups where and as kubelet's systemd driver and
// containerd make them (kubepods.slice/kubepods-<qos>.slice/
// kubepods-<qos>-pod<uid>.slice, one container's cri-containerd-<id>.scope
// inside it; qos burstable or besteffort), so that gpud takes
// its processes for that pod's; it returns the pod's uid and cgroup id, and
// the container's cgroup directory for processes to join.
func PodCgroup(tb testing.TB, qos string) (uid string, podID uint64, ctrDir string) {
	tb.Helper()
	parent := runtimeParent(tb, filepath.Join("kubepods.slice", "kubepods-"+qos+".slice"))
	b := make([]byte, 16)
	rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80 // a version 4 UUID, as the API server makes
	h := hex.EncodeToString(b)
	uid = h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	pod := filepath.Join(parent, "kubepods-"+qos+"-pod"+strings.ReplaceAll(uid, "-", "_")+".slice")
	if err := os.Mkdir(pod, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { removeCgroup(pod) })
	var err error
	if podID, err = cgroups.ID(pod); err != nil {
		tb.Fatal(err)
	}
	c := make([]byte, 32)
	rand.Read(c)
	ctrDir = filepath.Join(pod, "cri-containerd-"+hex.EncodeToString(c)+".scope")
	if err := os.Mkdir(ctrDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { removeCgroup(ctrDir) })
	return uid, podID, ctrDir
}

// JoinCgroup moves process pid into the cgroup at dir.
func JoinCgroup(tb testing.TB, dir string, pid int) {
	tb.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// removeCgroup removes a cgroup once its members have exited (2 s at most).
func removeCgroup(dir string) {
	// Children first: a test's own sub-cgroups (a pod's container) left
	// behind kept their parent too (TestFreezerV2 left one a run).
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if e.IsDir() {
				removeCgroup(filepath.Join(dir, e.Name()))
			}
		}
	}
	for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
}

// MkdirOwned makes directory p (and its missing parents) with mode, owned
// by uid: the directories a local user could make or hand gpud.
func MkdirOwned(tb testing.TB, p string, mode os.FileMode, uid int) string {
	tb.Helper()
	if err := os.MkdirAll(p, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		tb.Fatal(err)
	}
	if err := os.Lchown(p, uid, uid); err != nil {
		tb.Fatal(err)
	}
	return p
}

// V1FreezerCgroup makes a new cgroup in the v1 freezer hierarchy for the
// test, removed at its end; it skips (fails under CI) on a host without
// the v1 freezer controller.
func V1FreezerCgroup(tb testing.TB, name string) string {
	tb.Helper()
	mnt := cgroups.V1FreezerMount()
	if mnt == "" {
		Skip(tb, "no cgroup v1 freezer controller on this host")
	}
	dir := filepath.Join(mnt, fmt.Sprintf("gpud-test-%s-%d-%d", name, os.Getpid(), cgroupSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0o644)
		removeCgroup(dir)
	})
	return dir
}

// StartCounter starts a process (the shell's arithmetic in a loop) that
// counts up by one every 10 ms or so and writes each value to file; with
// gpu set it first opens that device node and holds it (its sleeps do
// not). setup runs before it opens or counts (its cgroup, say). It is
// killed at the end of the test. Read the count with Counted.
func StartCounter(tb testing.TB, file, gpu string, setup func(pid int)) *exec.Cmd {
	tb.Helper()
	// The count is the process's own state (a shell variable): a process
	// started again would count from 0. It is written to a new file
	// renamed over the count: a freeze between a truncating open and its
	// write left the count empty while frozen.
	script := `read go; i=0; while :; do i=$((i+1)); echo $i > "$0.new"; mv "$0.new" "$0"; sleep 0.01; done`
	if gpu != "" {
		script = `read go; exec 3<>"$1" || exit 1; i=0; while :; do i=$((i+1)); echo $i > "$0.new"; mv "$0.new" "$0" 3<&-; sleep 0.01 3<&-; done`
	}
	cmd := exec.Command("/bin/sh", "-c", script, file, gpu)
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	if setup != nil {
		setup(cmd.Process.Pid) // before it counts: its cgroup, its GPU
	}
	in.Write([]byte("go\n"))
	return cmd
}

// Counted reads a counter's last value (0 before its first).
func Counted(file string) int {
	b, _ := os.ReadFile(file)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}
