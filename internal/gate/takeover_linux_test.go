package gate

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
)

// fakePinned is a previous gpud's pinned gate.
type fakePinned struct {
	err error
	// pushesAtTakeOver: the policy pushes made when TakeOver was called.
	pushesAtTakeOver int
	k                *fakeKernel
	calls            int
}

func (p *fakePinned) TakeOver() error {
	p.calls++
	p.pushesAtTakeOver = p.k.pushCount()
	return p.err
}

func closed() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

func TestTakeOverOnceSourcesListed(t *testing.T) {
	r := newRig(t, 0)
	r.ledger.hold(0, r.pod(200, 20, occupancy.High))
	old := &fakePinned{k: r.kernel}
	if !r.c.TakeOver(t.Context(), old, []chan struct{}{closed(), closed()}) {
		t.Fatal("not taken over")
	}
	// The new gate's maps are filled before it replaces the old one.
	if old.calls != 1 || old.pushesAtTakeOver == 0 {
		t.Fatalf("take-over calls %d, policy pushes before it %d", old.calls, old.pushesAtTakeOver)
	}

	failing := &fakePinned{k: r.kernel, err: errors.New("link busy")}
	if r.c.TakeOver(t.Context(), failing, nil) {
		t.Fatal("a failed replacement reported as taken over")
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	waiting := &fakePinned{k: r.kernel}
	if r.c.TakeOver(ctx, waiting, []chan struct{}{make(chan struct{})}) || waiting.calls != 0 {
		t.Fatal("took over before a source listed, with gpud stopping")
	}
}

func TestJudgeWhenKnownWaitsForTheLoans(t *testing.T) {
	r := newRig(t, 0)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	r.c.JudgeWhenKnown(ctx, []chan struct{}{closed()}, make(chan struct{}))
	if r.c.judging.Load() {
		t.Fatal("judging before the loans were known")
	}
	r.c.JudgeWhenKnown(t.Context(), []chan struct{}{closed()}, closed())
	if !r.c.judging.Load() {
		t.Fatal("not judging once sources and loans were known")
	}
}

// fakeExpecter is the kernel's map of cgroups expected by name.
type fakeExpecter struct {
	expected   map[string]uint32
	parents    map[string][]uint64
	unexpected []string
	err        error
}

func (f *fakeExpecter) ExpectCgroup(name string, prio uint32, parents []uint64) error {
	if f.err != nil {
		return f.err
	}
	f.expected[name], f.parents[name] = prio, parents
	return nil
}

func (f *fakeExpecter) UnexpectCgroup(name string) error {
	f.unexpected = append(f.unexpected, name)
	return nil
}

func TestExpectationsReachTheKernelWithTheirParents(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "system.slice"), 0o755); err != nil {
		t.Fatal(err)
	}
	parent, err := cgroups.ID(filepath.Join(root, "system.slice"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeExpecter{expected: map[string]uint32{}, parents: map[string][]uint64{}}
	e := &Expectations{Kernel: k, CgroupRoot: root}
	scope := "docker-" + explainedCtr + ".scope"
	bare := explainedCtr // cgroupfs driver: /docker/<id>, and /docker does not exist here

	e.Set([]string{scope, bare}, occupancy.Low)
	if k.expected[scope] != bpf.PrioLow || !slices.Equal(k.parents[scope], []uint64{parent}) {
		t.Fatalf("expected %v parents %v", k.expected, k.parents)
	}
	if _, ok := k.expected[bare]; ok || !slices.Contains(k.unexpected, bare) {
		t.Fatal("a name with no runtime parent was expected: anywhere else it is a look-alike")
	}
	e.Set([]string{scope}, occupancy.Unmanaged)
	if k.expected[scope] != bpf.PrioWorkload {
		t.Fatalf("a workload of no enforced class: %d", k.expected[scope])
	}
	e.Set([]string{scope}, "")
	if k.unexpected[len(k.unexpected)-1] != scope {
		t.Fatal("a name no longer classified is still expected")
	}

	k.err = errors.New("map full")
	e.Set([]string{scope, scope}, occupancy.High)
	if e.Failures.Load() != 2 {
		t.Fatalf("failures %d, want 2", e.Failures.Load())
	}
	k.err = bpf.ErrNoMkdirHook // said once at start-up, not counted
	e.Set([]string{scope}, occupancy.High)
	if e.Failures.Load() != 2 {
		t.Fatalf("failures %d after the programs were found missing", e.Failures.Load())
	}
}
