package bpf_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/testutil"
)

// cgroupDir makes a cgroup v2 directory (nested under parent when given).
func cgroupDir(t *testing.T, parent, name string) (string, uint64) {
	t.Helper()
	if parent == "" {
		root, _, err := cgroups.V2Root()
		if err != nil {
			t.Fatal(err)
		}
		parent = root
	}
	dir := filepath.Join(parent, fmt.Sprintf("gpud-bpftest-%s-%d", name, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 100 && os.Remove(dir) != nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
	})
	id, err := cgroups.ID(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, id
}

// openFrom opens path from a new shell placed in cgroup dir, and returns
// "opened" or the shell's error.
func openFrom(t *testing.T, dir, path string) string {
	t.Helper()
	script := fmt.Sprintf(`echo $$ > %s/cgroup.procs && exec 3<>%s && echo opened`, dir, path)
	out, _ := exec.Command("sh", "-c", script).CombinedOutput()
	return strings.TrimSpace(string(out))
}

// verdict checks openFrom's answer: a refusal when refused, else
// "opened". A kernel that refuses the gate (observe-only) refuses nothing:
// every open is "opened" there.
func verdict(m *bpf.Monitor, got string, refused bool) error {
	if m.GateErr() != nil {
		refused = false
	}
	switch {
	case refused && !strings.Contains(got, "not permitted"):
		return fmt.Errorf("%q, want EPERM", got)
	case !refused && got != "opened":
		return fmt.Errorf("%q, want opened (gate: %v)", got, m.GateErr())
	}
	return nil
}

// logMode says which path a gate test checks, and that an observe-only
// monitor protects no GPU.
func logMode(t *testing.T, m *bpf.Monitor, gpus int) {
	t.Helper()
	err := m.GateErr()
	if err == nil {
		t.Log("gate loaded: enforcing")
		return
	}
	// scripts/kmatrix.sh reads this line to run the daemon tests in the
	// configuration such kernels need (--hooks syscalls).
	t.Logf("gate refused by this kernel, observe-only (no refusal expected): %v", err)
	for i := 0; i < gpus; i++ {
		if m.Protected(uint32(i)) {
			t.Errorf("GPU %d protected without a gate", i)
		}
	}
}

// enforcingMonitor loads the programs for two fake GPUs, this test
// registered and the gate enforcing (where the kernel takes it).
func enforcingMonitor(t *testing.T) (*bpf.Monitor, []testutil.FakeGPU) {
	t.Helper()
	_, gpus := testutil.MakeFakeGPUs(t, 2)
	m := loadMonitor(t, gpus)
	logMode(t, m, 2)
	if err := m.Register(uint32(os.Getpid()), 0); err != nil {
		t.Fatal(err)
	}
	if err := m.SetEnforcing(true, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return m, gpus
}

func TestGateVerdicts(t *testing.T) {
	m, gpus := enforcingMonitor(t)
	podDir, podID := cgroupDir(t, "", "pod")
	lowCtr, _ := cgroupDir(t, podDir, "ctr") // classified through its parent only
	unknown, _ := cgroupDir(t, "", "unknown")
	if err := m.SetCgroupPriority(podID, bpf.PrioLow); err != nil {
		t.Fatal(err)
	}
	// GPU 0 held by a high-priority process; GPU 1 free.
	if err := m.SetGPUPolicy(0, bpf.GPUPolicy{High: 1}, bpf.MonotonicNow()); err != nil {
		t.Fatal(err)
	}
	if err := m.SetGPUPolicy(1, bpf.GPUPolicy{}, bpf.MonotonicNow()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, path string
		denied          bool
	}{
		{"low in a child of a low pod cgroup, high-held GPU", lowCtr, gpus[0].Path, true},
		{"low, free GPU", lowCtr, gpus[1].Path, false},
		{"unknown cgroup, high-held GPU", unknown, gpus[0].Path, false},
		{"low, a non-GPU device", lowCtr, "/dev/null", false},
		{"low, a regular file", lowCtr, "/proc/self/status", false},
	} {
		if err := verdict(m, openFrom(t, tc.dir, tc.path), tc.denied); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}

	// Reservation: while GPU 1 is reserved for another cgroup,
	// this low one is refused; reserved for its own pod, it gets in.
	_, otherID := cgroupDir(t, "", "other")
	until := bpf.MonotonicNow() + uint64(time.Minute)
	m.SetGPUPolicy(1, bpf.GPUPolicy{ReservedCgroup: otherID, ReservedUntil: until}, bpf.MonotonicNow())
	if err := verdict(m, openFrom(t, lowCtr, gpus[1].Path), true); err != nil {
		t.Errorf("reserved for another cgroup: %v", err)
	}
	m.SetGPUPolicy(1, bpf.GPUPolicy{ReservedCgroup: podID, ReservedUntil: until}, bpf.MonotonicNow())
	if err := verdict(m, openFrom(t, lowCtr, gpus[1].Path), false); err != nil {
		t.Errorf("reserved for its own pod: %v", err)
	}
	m.SetGPUPolicy(1, bpf.GPUPolicy{ReservedCgroup: otherID, ReservedUntil: bpf.MonotonicNow() - 1}, bpf.MonotonicNow())
	if err := verdict(m, openFrom(t, lowCtr, gpus[1].Path), false); err != nil {
		t.Errorf("expired reservation: %v", err)
	}

	// Fail-open: without a heartbeat for fail-open-after, everything is
	// allowed. The window is long enough for an open from a new process
	// in an emulated guest (the kernel matrix runs under qemu's TCG, where
	// one takes hundreds of milliseconds).
	const window = 3 * time.Second
	if err := m.SetEnforcing(true, window); err != nil {
		t.Fatal(err)
	}
	m.Heartbeat()
	beat := time.Now()
	if err := verdict(m, openFrom(t, lowCtr, gpus[0].Path), true); err != nil {
		t.Fatalf("with a fresh heartbeat (%s old): %v", time.Since(beat).Round(time.Millisecond), err)
	}
	time.Sleep(time.Until(beat.Add(window + 300*time.Millisecond)))
	if err := verdict(m, openFrom(t, lowCtr, gpus[0].Path), false); err != nil {
		t.Fatalf("after fail-open-after without a heartbeat: %v", err)
	}
	m.Heartbeat()
	if err := verdict(m, openFrom(t, lowCtr, gpus[0].Path), true); err != nil {
		t.Fatalf("heartbeat back: %v", err)
	}
	// Enforcement off: allowed.
	m.SetEnforcing(false, 30*time.Second)
	if err := verdict(m, openFrom(t, lowCtr, gpus[0].Path), false); err != nil {
		t.Fatalf("enforcement off: %v", err)
	}
}

// A high-priority open marks the GPU at decision time: a low open right
// after it is refused although user space has not confirmed anything.
func TestGateHighMark(t *testing.T) {
	_, gpus := testutil.MakeFakeGPUs(t, 1)
	m := loadMonitor(t, gpus)
	m.Register(uint32(os.Getpid()), 0)
	m.SetEnforcing(true, 30*time.Second)
	hiDir, hiID := cgroupDir(t, "", "hi")
	loDir, loID := cgroupDir(t, "", "lo")
	m.SetCgroupPriority(hiID, bpf.PrioHigh)
	m.SetCgroupPriority(loID, bpf.PrioLow)
	m.SetGPUPolicy(0, bpf.GPUPolicy{}, bpf.MonotonicNow())
	if err := verdict(m, openFrom(t, hiDir, gpus[0].Path), false); err != nil {
		t.Fatalf("high open: %v", err)
	}
	// No policy update since: only the kernel's mark knows.
	if err := verdict(m, openFrom(t, loDir, gpus[0].Path), true); err != nil {
		t.Fatalf("low open after an unconfirmed high open: %v", err)
	}
	// User space confirms: the high holder is gone (policy high=0).
	m.SetGPUPolicy(0, bpf.GPUPolicy{}, bpf.MonotonicNow())
	if err := verdict(m, openFrom(t, loDir, gpus[0].Path), false); err != nil {
		t.Fatalf("low open after confirmation: %v", err)
	}
}

// expectingMonitor loads an enforcing monitor for n fake GPUs with the
// cgroup_mkdir programs attached, this process registered and GPU 0 held
// high, for the tests of expected cgroups.
func expectingMonitor(t *testing.T, n int) (*bpf.Monitor, []testutil.FakeGPU) {
	t.Helper()
	_, gpus := testutil.MakeFakeGPUs(t, n)
	m := loadMonitor(t, gpus)
	if err := m.MkdirHook(); err != nil {
		t.Fatalf("cgroup_mkdir programs not attached: %v", err)
	}
	if err := m.Register(uint32(os.Getpid()), 0); err != nil {
		t.Fatal(err)
	}
	if err := m.SetEnforcing(true, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := m.SetGPUPolicy(0, bpf.GPUPolicy{High: 1}, bpf.MonotonicNow()); err != nil {
		t.Fatal(err)
	}
	return m, gpus
}

// expectedName is a cgroup leaf name unique to this test process.
func expectedName(n string) string { return fmt.Sprintf("gpud-bpftest-%s-%d", n, os.Getpid()) }

// A cgroup whose leaf name was expected gets its class as it is made, with
// no SetCgroupPriority: the first open from it is judged by the gate. A
// name no longer expected, or never, is not classified.
func TestGateExpectedCgroup(t *testing.T) {
	m, gpus := expectingMonitor(t, 2)
	// The runtime's parent, where the expected cgroups are made.
	place, placeID := cgroupDir(t, "", "place")
	parents := []uint64{placeID}
	if err := m.ExpectCgroup(expectedName("expected"), bpf.PrioLow, parents); err != nil {
		t.Fatal(err)
	}
	if err := m.ExpectCgroup(expectedName("forgotten"), bpf.PrioLow, parents); err != nil {
		t.Fatal(err)
	}
	if err := m.UnexpectCgroup(expectedName("forgotten")); err != nil {
		t.Fatal(err)
	}
	expected, _ := cgroupDir(t, place, "expected")
	if err := verdict(m, openFrom(t, expected, gpus[0].Path), true); err != nil {
		t.Errorf("first open from an expected low cgroup on a high-held GPU: %v", err)
	}
	// A child is classified through its parent, as for a pod's containers.
	child, _ := cgroupDir(t, expected, "child")
	if err := verdict(m, openFrom(t, child, gpus[0].Path), true); err != nil {
		t.Errorf("child of an expected low cgroup: %v", err)
	}
	for _, n := range []string{"forgotten", "other"} {
		dir, _ := cgroupDir(t, place, n)
		if err := verdict(m, openFrom(t, dir, gpus[0].Path), false); err != nil {
			t.Errorf("cgroup %s: %v", n, err)
		}
	}
	// Names the kernel key cannot hold exactly, or that are not one path
	// element, are refused rather than cut short.
	for _, bad := range []string{"", "a/b", strings.Repeat("x", bpf.CgroupNameMax+1)} {
		if err := m.ExpectCgroup(bad, bpf.PrioLow, parents); err == nil {
			t.Errorf("ExpectCgroup(%.20q): no error", bad)
		}
	}
	if err := m.ExpectCgroup(strings.Repeat("x", bpf.CgroupNameMax), bpf.PrioLow, parents); err != nil {
		t.Errorf("a name of CgroupNameMax bytes: %v", err)
	}
	if err := m.ExpectCgroup(expectedName("x"), 7, parents); err == nil {
		t.Error("ExpectCgroup with class 7: no error")
	}
	for _, bad := range [][]uint64{nil, {0}, make([]uint64, bpf.ExpectParents+1)} {
		if err := m.ExpectCgroup(expectedName("x"), bpf.PrioLow, bad); err == nil {
			t.Errorf("ExpectCgroup with parents %v: no error", bad)
		}
	}
}

// An expected name is a workload's cgroup only when root makes it directly
// in one of the runtime's parents it was expected in: the same name made
// by an unprivileged user who owns that parent (a delegated subtree), or
// by root anywhere else, is a look-alike and stays unclassified (an open
// from it is judged as a host process's); the control, root in the right
// parent, is classified.
func TestGateExpectedCgroupPlace(t *testing.T) {
	m, gpus := expectingMonitor(t, 1)
	place, placeID := cgroupDir(t, "", "runtime")
	elsewhere, _ := cgroupDir(t, "", "elsewhere")
	for _, n := range []string{"root-here", "root-elsewhere", "user-here"} {
		if err := m.ExpectCgroup(expectedName(n), bpf.PrioLow, []uint64{placeID}); err != nil {
			t.Fatal(err)
		}
	}
	// The parent delegated as systemd delegates a subtree: its owner may
	// make cgroups directly in it.
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control"} {
		if err := os.Chown(filepath.Join(place, f), 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	userDir := filepath.Join(place, expectedName("user-here"))
	mkdir := exec.Command("mkdir", userDir)
	mkdir.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := mkdir.CombinedOutput(); err != nil {
		t.Fatalf("mkdir as uid 65534: %v: %s", err, out)
	}
	t.Cleanup(func() {
		for i := 0; i < 100 && os.Remove(userDir) != nil; i++ {
			time.Sleep(10 * time.Millisecond)
		}
	})
	if err := verdict(m, openFrom(t, userDir, gpus[0].Path), false); err != nil {
		t.Errorf("expected name made by uid 65534 in the right parent: %v", err)
	}
	dir, _ := cgroupDir(t, elsewhere, "root-elsewhere")
	if err := verdict(m, openFrom(t, dir, gpus[0].Path), false); err != nil {
		t.Errorf("expected name made by root in another parent: %v", err)
	}
	dir, _ = cgroupDir(t, place, "root-here")
	if err := verdict(m, openFrom(t, dir, gpus[0].Path), true); err != nil {
		t.Errorf("expected name made by root in the right parent: %v", err)
	}
}

// The share fence: a pod fenced to GPU 1 opens GPU 1, even while high
// priority holds it (the share rule, not the table, judges it there), and
// is refused GPU 0; an unfenced low pod still gets the table; the fence
// lifted, the pod is the table's again. Enforcement off, nothing is fenced.
func TestGateShareFence(t *testing.T) {
	_, gpus := testutil.MakeFakeGPUs(t, 2)
	m := loadMonitor(t, gpus)
	if err := m.Register(uint32(os.Getpid()), 0); err != nil {
		t.Fatal(err)
	}
	if err := m.SetEnforcing(true, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	m.Heartbeat()
	podDir, podID := cgroupDir(t, "", "sharepod")
	ctr, _ := cgroupDir(t, podDir, "ctr")
	otherDir, otherID := cgroupDir(t, "", "wholepod")
	m.SetCgroupPriority(podID, bpf.PrioLow)
	m.SetCgroupPriority(otherID, bpf.PrioLow)
	m.SetGPUPolicy(0, bpf.GPUPolicy{}, bpf.MonotonicNow())
	m.SetGPUPolicy(1, bpf.GPUPolicy{High: 1}, bpf.MonotonicNow())
	var set bpf.GPUSet
	set.Add(1)
	if err := m.FenceCgroup(podID, set, 1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, path string
		denied          bool
	}{
		{"fenced pod, its share's GPU (high-held)", ctr, gpus[1].Path, false},
		{"fenced pod, another GPU (free)", ctr, gpus[0].Path, true},
		{"unfenced low pod, high-held GPU", otherDir, gpus[1].Path, true},
		{"unfenced low pod, free GPU", otherDir, gpus[0].Path, false},
		{"fenced pod, a non-GPU device", ctr, "/dev/null", false},
	} {
		if err := verdict(m, openFrom(t, tc.dir, tc.path), tc.denied); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	m.SetEnforcing(false, 30*time.Second)
	if err := verdict(m, openFrom(t, ctr, gpus[0].Path), false); err != nil {
		t.Errorf("enforcement off, fenced pod, another GPU: %v", err)
	}
	m.SetEnforcing(true, 30*time.Second)
	if err := m.UnfenceCgroup(podID, 0); err != nil {
		t.Fatal(err)
	}
	if err := verdict(m, openFrom(t, ctr, gpus[0].Path), false); err != nil {
		t.Errorf("fence lifted, free GPU: %v", err)
	}
	if err := verdict(m, openFrom(t, ctr, gpus[1].Path), true); err != nil {
		t.Errorf("fence lifted, high-held GPU: %v (the table's refusal)", err)
	}
}

// A low open of a high-held GPU is refused while user space writes the
// gate's maps as gpud does at every drain and registry update.
//
// Policies: with the per-GPU state in preallocated hash maps, the gate held
// a pointer to the high-held GPU's policy element across its cgroup walk
// while a rewrite of that GPU's policy retired the element and the next
// rewrite on the same CPU (a free GPU's) reused it: the gate read the free
// GPU's holder count, 0, and let the open through (138 of 300 000 here).
//
// Classes: the same for cgroup_prio, whose lookup is read at once (a
// window of a few instructions: 1 of 300 000 got through), when gpud wrote
// again a class the kernel had (the opener's pod's, and another
// workload's).
//
// Heartbeats: the gate read the time, then the heartbeat; one written in
// between was newer than the gate's time, and their unsigned difference
// looked like a heartbeat older than the fail-open delay, so the gate
// failed open for that open.
//
// The cgroup is nested as a pod's container is, so the walk is as long as
// on a node.
func TestGateRefusesWhileItsMapsAreWritten(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(m *bpf.Monitor, pod, other uint64, now uint64) error
	}{
		{"policies", func(m *bpf.Monitor, _, _ uint64, now uint64) error {
			if err := m.SetGPUPolicy(1, bpf.GPUPolicy{High: 1}, now); err != nil {
				return err
			}
			return m.SetGPUPolicy(0, bpf.GPUPolicy{}, now)
		}},
		{"classes", func(m *bpf.Monitor, pod, other uint64, _ uint64) error {
			if err := m.SetCgroupPriority(pod, bpf.PrioLow); err != nil {
				return err
			}
			return m.SetCgroupPriority(other, bpf.PrioWorkload)
		}},
		{"heartbeats", func(m *bpf.Monitor, _, _ uint64, _ uint64) error { return m.Heartbeat() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, gpus := enforcingMonitor(t)
			dir, podID := cgroupDir(t, "", "kubepods")
			for _, name := range []string{"burstable", "pod", "ctr"} {
				dir, _ = cgroupDir(t, dir, name)
			}
			_, otherID := cgroupDir(t, "", "other")
			if err := m.SetCgroupPriority(podID, bpf.PrioLow); err != nil {
				t.Fatal(err)
			}
			if err := m.SetGPUPolicy(1, bpf.GPUPolicy{High: 1}, bpf.MonotonicNow()); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			done := make(chan int, 1)
			halt := sync.OnceFunc(func() { close(stop) })
			t.Cleanup(halt) // a failed start leaves no writer behind
			writer := func() {
				// One thread, so that the writes run on one CPU as a sync's do.
				runtime.LockOSThread()
				n := 0
				for {
					select {
					case <-stop:
						done <- n
						return
					default:
					}
					if err := tc.write(m, podID, otherID, bpf.MonotonicNow()); err != nil {
						t.Error(err)
					}
					n++
				}
			}
			n := testutil.Count(t, "GPUD_GATE_REWRITE_OPENS", 1000000)
			// At most 3 s: the kernel matrix's emulated guests make far
			// fewer opens in that time. The writer starts once the loop is
			// built (it keeps a CPU busy).
			opened, refused, other := testutil.OpenLoop(t, gpus[1].Path, n, 3*time.Second, func(pid int) {
				testutil.JoinCgroup(t, dir, pid)
				go writer()
			})
			n = opened + refused + other
			halt()
			writes := <-done
			t.Logf("%d low opens of a high-held GPU beside %d writes: %d refused, %d opened, %d other",
				n, writes, refused, opened, other)
			switch {
			case m.GateErr() != nil && opened != n:
				// A kernel that refuses the gate (observe-only) refuses nothing.
				t.Errorf("observe-only: %d of %d opens refused, %d failed otherwise", refused, n, other)
			case m.GateErr() == nil && (opened != 0 || other != 0):
				t.Errorf("%d of %d low opens of a high-held GPU got through (%d failed otherwise)", opened, n, other)
			}
			if writes < 1000 || n < 1000 {
				t.Errorf("only %d writes beside %d opens: the race was not tried", writes, n)
			}
		})
	}
}
