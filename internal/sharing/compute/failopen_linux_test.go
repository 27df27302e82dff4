package compute

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// fakeHolders: the pods' processes hold GPU 0.
type fakeHolders map[string]int // pod UID → PID

func (f fakeHolders) Snapshot(time.Time) occupancy.Snapshot {
	g := occupancy.GPUView{GPU: occupancy.GPU{Index: 0}}
	for uid, pid := range f {
		g.Holders = append(g.Holders, occupancy.HolderView{ProcInfo: occupancy.ProcInfo{PID: pid, PodUID: uid, Priority: occupancy.Low}})
	}
	return occupancy.Snapshot{GPUs: []occupancy.GPUView{g}}
}

type fakeWorkloads struct{}

func (fakeWorkloads) Lookup(p occupancy.ProcInfo) (workload.Workload, bool) {
	return workload.Workload{PodUID: p.PodUID, CgroupID: 1}, true
}

// fixedFreezer is the cgroups' freezer, each pod's process in a cgroup
// the test made.
type fixedFreezer struct {
	CgroupFreezer
	byPID map[int]Cgroup
}

func (f fixedFreezer) Locate(pid int, _ uint64) (Cgroup, error) { return f.byPID[pid], nil }

// childEnv carries the killed child's setting: state dir, then pairs of
// PID and cgroup directory.
const childEnv = "GPUD_COMPUTE_CHILD"

// guardEnv is the killed child's GuardExe: the gpud binary ("": none).
const guardEnv = "GPUD_COMPUTE_GUARD"

// TestKilledChild is the gpud the fail-open test kills: a Controller
// scheduling two pods 10/90 until it is SIGKILLed.
func TestKilledChild(t *testing.T) {
	arg := os.Getenv(childEnv)
	if arg == "" {
		return // only as the child
	}
	f := strings.Fields(arg)
	GuardExe = os.Getenv(guardEnv) // "": none
	book := sharing.NewBook()
	holders := fakeHolders{}
	fz := fixedFreezer{byPID: map[int]Cgroup{}}
	for i, target := range []int{10, 90} {
		pid, _ := strconv.Atoi(f[1+2*i])
		uid := "pod-" + strconv.Itoa(i)
		holders[uid] = pid
		fz.byPID[pid] = Cgroup{Kind: kindOf(f[2+2*i]), Path: f[2+2*i]}
		book.Set(uid, []sharing.Share{{ClaimUID: uid, GPU: 0, Compute: target, Pods: []sharing.PodRef{{UID: uid}}}})
	}
	c := New(Config{Settings: Settings{Slice: 20 * time.Millisecond, Period: time.Second}, Book: book, Holders: holders,
		Workloads: fakeWorkloads{}, Freezer: fz, StateDir: f[0], CgroupRoot: v2Root(t), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c.Run(context.Background())
}

func kindOf(dir string) string {
	if strings.HasPrefix(dir, cgroups.V1FreezerMount()+"/") && cgroups.V1FreezerMount() != "" {
		return cgroups.FreezerV1
	}
	return cgroups.FreezerV2
}

func v2Root(t *testing.T) string {
	root, _, err := cgroups.V2Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// freezerCgroup is a cgroup for the test in the freezer gpud uses on this
// host (v1 on a hybrid host), with a spinning process in it.
func freezerCgroup(t *testing.T, name string) (string, int) {
	var dir string
	if cgroups.V1FreezerMount() != "" {
		dir = testutil.V1FreezerCgroup(t, name)
	} else {
		dir, _ = testutil.Cgroup(t, name)
	}
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		Thaw(dir)
		cmd.Process.Kill()
		cmd.Wait()
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, cmd.Process.Pid
}

// Thaw thaws dir whatever its kind (test cleanup).
func Thaw(dir string) {
	if fz, err := cgroups.OpenFreezer(kindOf(dir), dir, 0); err == nil {
		fz.Thaw()
		fz.Close()
	}
}

func paused(t *testing.T, dir string) bool {
	p, err := CgroupFreezer{}.Paused(Cgroup{Kind: kindOf(dir), Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// gpud SIGKILLed mid-slice leaves a pod frozen; the next gpud thaws it at
// its start from the journal (ThawJournal, Controller.Run's first step),
// within 100 ms of starting; `gpud uninstall` does the same.
func TestKilledSchedulerThawedByTheNext(t *testing.T) {
	testutil.RequireRoot(t)
	state := t.TempDir()
	a, pa := freezerCgroup(t, "compute-a")
	b, pb := freezerCgroup(t, "compute-b")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(self, "-test.run=^TestKilledChild$")
	child.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{state, strconv.Itoa(pa), a, strconv.Itoa(pb), b}, " "))
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	// a (10 %) is frozen most of the time: kill the scheduler then.
	testutil.Eventually(t, 10*time.Second, "the 10 % pod frozen", func() bool { return paused(t, a) })
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	time.Sleep(200 * time.Millisecond) // nothing thaws it without a gpud
	if !paused(t, a) {
		t.Fatal("the pod was thawed after the scheduler's SIGKILL with no gpud running: the test shows nothing")
	}
	if _, err := os.Stat(filepath.Join(state, JournalFile)); err != nil {
		t.Fatalf("no journal after the kill: %v", err)
	}

	// The next gpud: its Controller thaws what the journal lists first.
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		New(Config{Settings: Settings{Slice: 20 * time.Millisecond, Period: time.Second}, Book: sharing.NewBook(), Holders: fakeHolders{},
			Workloads: fakeWorkloads{}, StateDir: state, CgroupRoot: v2Root(t), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}).Run(ctx)
	}()
	testutil.Eventually(t, 5*time.Second, "both pods thawed", func() bool { return !paused(t, a) && !paused(t, b) })
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("thawed %s after the next scheduler started, want within 100 ms", took)
	}
	cancel()
	<-done
	if _, err := os.Stat(filepath.Join(state, JournalFile)); !os.IsNotExist(err) {
		t.Errorf("journal left after the thaw: %v", err)
	}

	// uninstall: ThawJournal alone.
	if err := writeJournal(state, []Cgroup{{Kind: kindOf(a), Path: a}}); err != nil {
		t.Fatal(err)
	}
	if err := (CgroupFreezer{}).Set(Cgroup{Kind: kindOf(a), Path: a}, true); err != nil {
		t.Fatal(err)
	}
	if n, err := ThawJournal(state, v2Root(t), CgroupFreezer{}, nil); err != nil || n != 1 || paused(t, a) {
		t.Errorf("ThawJournal: %d thawed, %v; paused %v", n, err, paused(t, a))
	}
}
