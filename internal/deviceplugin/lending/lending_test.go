package lending

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/deviceplugin"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/workload"
)

// The lender's decisions, without root: a real ledger and workload
// registry (both pure), and fakes for the gate, kubelet's PodResources and
// the preemption records.

type preemption struct {
	gpu     int
	by      int   // the preemptor's pid
	victims []int // pids; nil for PreemptLow (the gate picks the low holders)
}

type fakeGate struct {
	ledger *occupancy.Ledger
	mu     sync.Mutex
	syncs  int
	calls  []preemption
}

func (g *fakeGate) Sync() { g.mu.Lock(); g.syncs++; g.mu.Unlock() }

func (g *fakeGate) PreemptLow(gpu int, by occupancy.ProcInfo, _ string, _ time.Time) int {
	n := 0
	for _, h := range g.ledger.Holders(gpu) {
		if h.Priority == occupancy.Low {
			n++
		}
	}
	g.mu.Lock()
	g.calls = append(g.calls, preemption{gpu: gpu, by: by.PID})
	g.mu.Unlock()
	return n
}

func (g *fakeGate) Preempt(gpu int, by occupancy.ProcInfo, holders []occupancy.ProcInfo, _ string) int {
	p := preemption{gpu: gpu, by: by.PID}
	for _, h := range holders {
		p.victims = append(p.victims, h.PID)
	}
	g.mu.Lock()
	g.calls = append(g.calls, p)
	g.mu.Unlock()
	return len(holders)
}

func (g *fakeGate) taken() []preemption {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.calls
	g.calls = nil
	return c
}

type fakePodResources struct {
	mu    sync.Mutex
	alloc map[string][]deviceplugin.PodDevices
	err   error
}

func (f *fakePodResources) List(context.Context) (map[string][]deviceplugin.PodDevices, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.alloc, f.err
}

func (f *fakePodResources) set(alloc map[string][]deviceplugin.PodDevices) {
	f.mu.Lock()
	f.alloc = alloc
	f.mu.Unlock()
}

type fixture struct {
	l       *Lender
	ledger  *occupancy.Ledger
	reg     *workload.Registry
	gate    *fakeGate
	pr      *fakePodResources
	changed int
	owner   occupancy.ProcInfo
}

const (
	ownerUID    = "11111111-0000-0000-0000-000000000001"
	borrowerUID = "11111111-0000-0000-0000-000000000002"
	otherUID    = "11111111-0000-0000-0000-000000000003"
)

// newFixture: GPU 0 (UUID GPU-aaa) held by an idle high-priority owner pod,
// GPU 1 (GPU-bbb) free.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	gpus := []occupancy.GPU{
		{Index: 0, UUID: "GPU-aaa", Device: "/dev/nvidia0", Major: 195, Minor: 0},
		{Index: 1, UUID: "GPU-bbb", Device: "/dev/nvidia1", Major: 195, Minor: 1},
	}
	f := &fixture{ledger: occupancy.NewLedger(gpus, time.Minute), reg: &workload.Registry{Default: occupancy.Unmanaged}, pr: &fakePodResources{}}
	f.gate = &fakeGate{ledger: f.ledger}
	f.reg.Put(workload.Workload{PodUID: ownerUID, Namespace: "default", Name: "owner", Priority: occupancy.High})
	f.owner = occupancy.ProcInfo{PID: 100, PodUID: ownerUID, Priority: occupancy.High}
	f.ledger.AddFD(f.owner, 0, 3, time.Now().Add(-2*time.Minute))
	f.ledger.Refresh(time.Now())
	f.l = New(Config{Resource: "gpud.io/idle-gpu", OwnerResource: "nvidia.com/gpu", DevDir: t.TempDir(),
		HostDevDir: "/host/dev", CDIKind: "nvidia.com/gpu", GPUs: gpus}, f.ledger, f.reg, f.gate, f.pr)
	f.l.Log = slog.New(slog.DiscardHandler)
	f.l.Changed = func() { f.changed++; f.ledger.Reclassify(f.reg.ClassifyProc) }
	return f
}

// lend lists a borrower pod of GPU 0 and its owner in PodResources.
func (f *fixture) lend(t *testing.T) {
	t.Helper()
	f.pr.set(map[string][]deviceplugin.PodDevices{
		"gpud.io/idle-gpu": {{Namespace: "default", Name: "borrower", DeviceIDs: []string{"GPU-aaa"}}},
		"nvidia.com/gpu":   {{Namespace: "default", Name: "owner", DeviceIDs: []string{"GPU-aaa"}}},
	})
	f.l.refresh(context.Background())
	if !f.l.IsLent(0) {
		t.Fatal("GPU 0 is not lent after PodResources listed its borrower")
	}
}

func TestDevicesHealthyWhileLendable(t *testing.T) {
	f := newFixture(t)
	health := map[string]bool{}
	for _, d := range f.l.Devices() {
		health[d.ID] = d.Healthy
	}
	if !health["GPU-aaa"] || health["GPU-bbb"] || len(health) != 2 {
		t.Fatalf("health %v: want the idle GPU 0 (GPU-aaa) healthy and the free GPU 1 (GPU-bbb) not (no --lend-free)", health)
	}
	f.l.cfg.LendFree = true
	for _, d := range f.l.Devices() {
		if !d.Healthy {
			t.Fatalf("%s unhealthy with --lend-free", d.ID)
		}
	}
}

func TestAllocate(t *testing.T) {
	f := newFixture(t)
	for _, ids := range [][]string{{"gpu-1"}, {"GPU-bbb"}, {"gpu-9"}, {"nvidia0"}, {"GPU-ccc"}, {"GPU-aaa::1"}} {
		if _, err := f.l.Allocate(ids); !errors.Is(err, deviceplugin.ErrRefused) {
			t.Errorf("Allocate(%v) = %v, want ErrRefused", ids, err)
		}
	}
	if f.l.IsLent(1) {
		t.Fatal("a refused allocation left GPU 1 lent")
	}
	r, err := f.l.Allocate([]string{"GPU-aaa"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Devices) != 1 || r.Devices[0].HostPath != filepath.Join("/host/dev", "nvidia0") || r.Devices[0].ContainerPath != "/dev/nvidia0" {
		t.Errorf("devices %+v: want /host/dev/nvidia0 as /dev/nvidia0", r.Devices)
	}
	want := map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-aaa", "GPUD_GPU": "0", "GPUD_OWNER": "default/owner"}
	for k, v := range want {
		if r.Envs[k] != v {
			t.Errorf("env %s = %q, want %q", k, r.Envs[k], v)
		}
	}
	if len(r.CdiDevices) != 1 || r.CdiDevices[0].Name != "nvidia.com/gpu=GPU-aaa" {
		t.Errorf("CDI devices %v, want nvidia.com/gpu=GPU-aaa", r.CdiDevices)
	}
	// The checkpoint directory is NRI's to mount, for the task's own
	// containers: Allocate does not know the pod.
	if len(r.Mounts) != 0 || r.Envs["GPUD_RESUME_FROM"] != "" {
		t.Errorf("Allocate mounts %v, GPUD_RESUME_FROM %q", r.Mounts, r.Envs["GPUD_RESUME_FROM"])
	}
	// The gate hears of the loan before Allocate returns (before kubelet
	// starts the borrower), and the GPU counts as lent until PodResources
	// lists the borrower.
	if f.gate.syncs == 0 {
		t.Error("Allocate did not sync the gate")
	}
	if !f.l.IsLent(0) {
		t.Error("GPU 0 not lent (pending) after Allocate")
	}
}

func TestRefreshForcesClassesAndDecorates(t *testing.T) {
	f := newFixture(t)
	// The borrower's own label says high: lending makes it low.
	f.reg.Put(workload.Workload{PodUID: borrowerUID, Namespace: "default", Name: "borrower", Priority: occupancy.High})
	f.lend(t)
	if w, _ := f.reg.Lookup(occupancy.ProcInfo{PodUID: borrowerUID}); w.Priority != occupancy.Low {
		t.Errorf("borrower class %s, want low", w.Priority)
	}
	if w, _ := f.reg.Lookup(occupancy.ProcInfo{PodUID: ownerUID}); w.Priority != occupancy.High {
		t.Errorf("owner class %s, want high", w.Priority)
	}
	if gpu, role, ok := f.l.Role(borrowerUID); !ok || gpu != 0 || role != "borrower" {
		t.Errorf("Role(borrower) = %d %q %v", gpu, role, ok)
	}
	if gpu, role, ok := f.l.Role(ownerUID); !ok || gpu != 0 || role != "owner" {
		t.Errorf("Role(owner) = %d %q %v", gpu, role, ok)
	}
	if f.changed != 1 {
		t.Errorf("Changed called %d times, want 1", f.changed)
	}
	f.l.refresh(context.Background())
	if f.changed != 1 {
		t.Errorf("an unchanged listing called Changed again (%d)", f.changed)
	}
	sf := occupancy.Render(f.ledger.Snapshot(time.Now()), "n", true)
	f.l.Decorate(&sf)
	if g := sf.GPUs[0]; g.State != occupancy.Lent || g.Owner != "default/owner" || g.Borrower != "default/borrower" {
		t.Errorf("state file GPU 0: %s owner %q borrower %q", g.State, g.Owner, g.Borrower)
	}
	if g := sf.GPUs[1]; g.State == occupancy.Lent || g.Borrower != "" {
		t.Errorf("state file GPU 1 shows a loan: %+v", g)
	}

	// The borrower is gone from PodResources: its label's class is back.
	f.pr.set(nil)
	f.l.refresh(context.Background())
	if w, _ := f.reg.Lookup(occupancy.ProcInfo{PodUID: borrowerUID}); w.Priority != occupancy.High {
		t.Errorf("borrower class %s after the loan, want its label's high", w.Priority)
	}
	if f.l.IsLent(0) {
		t.Error("GPU 0 still lent after its borrower left")
	}

	// kubelet unreachable: nothing is forgotten or invented.
	f.lend(t)
	f.pr.mu.Lock()
	f.pr.err = errors.New("connection refused")
	f.pr.mu.Unlock()
	f.l.refresh(context.Background())
	if !f.l.IsLent(0) {
		t.Error("a failed PodResources read ended the loan")
	}
}

func TestOwnerActivityTakesBack(t *testing.T) {
	f := newFixture(t)
	// Not lent: the owner's compute is just the owner's.
	f.l.Activity(0, []uint32{uint32(f.owner.PID)})
	if c := f.gate.taken(); len(c) != 0 {
		t.Fatalf("preemptions on a GPU not lent: %+v", c)
	}
	f.lend(t)
	borrower := occupancy.ProcInfo{PID: 200, PodUID: borrowerUID, Priority: occupancy.Low}
	f.ledger.AddFD(borrower, 0, 4, time.Now())
	// Another pod's process on the GPU is not the owner coming back.
	f.l.ProcInfo = func(pid int) (occupancy.ProcInfo, error) {
		return occupancy.ProcInfo{PID: pid, PodUID: otherUID}, nil
	}
	f.l.Activity(0, []uint32{999})
	if c := f.gate.taken(); len(c) != 0 || !f.l.IsLent(0) {
		t.Fatalf("a stranger's compute took the GPU back: %+v, lent %v", c, f.l.IsLent(0))
	}
	f.l.Activity(0, []uint32{uint32(f.owner.PID)})
	if f.l.IsLent(0) {
		t.Error("the owner's compute did not end the loan")
	}
	c := f.gate.taken()
	if len(c) != 1 || c[0].gpu != 0 || c[0].by != f.owner.PID {
		t.Fatalf("preemptions %+v, want the low holders of GPU 0 for the owner %d", c, f.owner.PID)
	}
}

func TestTakeBackOfPendingLoanReadsPodResources(t *testing.T) {
	f := newFixture(t)
	if _, err := f.l.Allocate([]string{"gpu-0"}); err != nil {
		t.Fatal(err)
	}
	// The borrower started within the 1 s tick: PodResources lists it, the
	// lender has not read it yet. The take-back reads it, so the borrower
	// is classified low and preempted with this take-back.
	f.reg.Put(workload.Workload{PodUID: borrowerUID, Namespace: "default", Name: "borrower", Priority: occupancy.Unmanaged})
	f.pr.set(map[string][]deviceplugin.PodDevices{
		"gpud.io/idle-gpu": {{Namespace: "default", Name: "borrower", DeviceIDs: []string{"gpu-0"}}},
	})
	f.l.TakeBack(0)
	if w, _ := f.reg.Lookup(occupancy.ProcInfo{PodUID: borrowerUID}); w.Priority != occupancy.Low {
		t.Errorf("borrower class %s after the take-back, want low", w.Priority)
	}
	if f.l.IsLent(0) {
		t.Error("still lent after the take-back")
	}
}

// A loan's take-back preempts the holders classified low at that instant.
// A borrower whose class reached gpud only afterwards must still lose the
// GPU: the sweep preempts it, by its pod, whatever its class says yet,
// while the owner holds the GPU; the owner and a bystander are untouched.
func TestSweepPreemptsLateClassifiedBorrower(t *testing.T) {
	f := newFixture(t)
	f.reg.Put(workload.Workload{PodUID: borrowerUID, Namespace: "default", Name: "borrower", Priority: occupancy.Unmanaged})
	f.lend(t)
	borrower := occupancy.ProcInfo{PID: 200, PodUID: borrowerUID, Priority: occupancy.Unmanaged}
	bystander := occupancy.ProcInfo{PID: 300, PodUID: otherUID, Priority: occupancy.Unmanaged}
	f.ledger.AddFD(borrower, 0, 4, time.Now())
	f.ledger.AddFD(bystander, 0, 5, time.Now())

	f.l.reclaimTakenBack()
	if c := f.gate.taken(); len(c) != 0 {
		t.Fatalf("a GPU still lent was taken from its borrower: %+v", c)
	}
	f.l.TakeBack(0)
	f.ledger.RemoveProcess(f.owner.PID)
	f.l.reclaimTakenBack()
	if c := f.gate.taken(); len(c) != 0 {
		t.Fatalf("the borrower was preempted with no owner holding the GPU: %+v", c)
	}
	f.ledger.AddFD(f.owner, 0, 3, time.Now())
	f.l.reclaimTakenBack()
	c := f.gate.taken()
	if len(c) != 1 || c[0].gpu != 0 || c[0].by != f.owner.PID || !slices.Equal(c[0].victims, []int{borrower.PID}) {
		t.Fatalf("preemptions %+v, want the borrower %d alone, for the owner %d", c, borrower.PID, f.owner.PID)
	}
	// Once the borrower is gone from PodResources, the loan is over.
	f.pr.set(nil)
	f.ledger.RemoveProcess(borrower.PID)
	f.l.refresh(context.Background())
	f.l.reclaimTakenBack()
	if c := f.gate.taken(); len(c) != 0 {
		t.Fatalf("preemptions after the loan ended: %+v", c)
	}
}

// An agent on every GPU (nvidia-persistenced) changes nothing: GPU 0 is
// still idle and lendable, its owner still the owner pod and not the
// agent; GPU 1 is still free (lent only with --lend-free).
func TestAgentsDoNotBlockLending(t *testing.T) {
	f := newFixture(t)
	agent := occupancy.ProcInfo{PID: 7, Comm: "nvidia-persiste", Priority: occupancy.Unmanaged, Root: true, Agent: true}
	f.ledger.AddFD(agent, 0, 3, time.Now())
	f.ledger.AddFD(agent, 1, 4, time.Now())
	health := map[string]bool{}
	for _, d := range f.l.Devices() {
		health[d.ID] = d.Healthy
	}
	if !health["GPU-aaa"] || health["GPU-bbb"] {
		t.Fatalf("health %v: want GPU 0 lendable (idle: the agent's open is no activity) and GPU 1 free", health)
	}
	r, err := f.l.Allocate([]string{"gpu-0"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Envs["GPUD_OWNER"] != "default/owner" {
		t.Errorf("owner %q, want default/owner (never an agent)", r.Envs["GPUD_OWNER"])
	}
}

// Without NVML (no UUID) a GPU is gpu-N, NVIDIA_VISIBLE_DEVICES its index
// and no CDI device is named; a UUID NVML gave that is not a plain name
// is not used either. Either name maps back to the GPU (kubelet keeps the
// IDs a gpud with or without NVML listed), and --cdi-kind "" names no CDI
// device.
func TestDeviceNamesWithoutUUID(t *testing.T) {
	two := 2
	gpus := []occupancy.GPU{
		{Index: 0, Device: "/dev/nvidia0", Major: 195, Minor: 0},
		{Index: 1, Device: "/dev/nvidia1", Major: 195, Minor: 1, NVMLIndex: &two, UUID: "GPU-x/../y"},
		{Index: 3, UUID: "GPU-ddd", Device: "/dev/nvidia3", Major: 195, Minor: 3},
	}
	ledger := occupancy.NewLedger(gpus, time.Minute)
	reg := &workload.Registry{Default: occupancy.Unmanaged}
	l := New(Config{Resource: "gpud.io/idle-gpu", OwnerResource: "nvidia.com/gpu", DevDir: t.TempDir(), LendFree: true,
		CDIKind: "nvidia.com/gpu", GPUs: gpus}, ledger, reg, &fakeGate{ledger: ledger}, &fakePodResources{})
	l.Log = slog.New(slog.DiscardHandler)
	var ids []string
	for _, d := range l.Devices() {
		ids = append(ids, d.ID)
	}
	if !slices.Equal(ids, []string{"gpu-0", "gpu-1", "GPU-ddd"}) {
		t.Fatalf("device IDs %q", ids)
	}
	for id, want := range map[string]int{"gpu-0": 0, "gpu-1": 1, "GPU-ddd": 3, "gpu-3": 3, "GPU-x/../y": 1, "0": -1, "GPU-ddd::0": -1, "gpu-2": -1} {
		got, ok := l.gpuOfDevice(id)
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("lent device %q: GPU %d, want %d", id, got, want)
		}
	}
	r, err := l.Allocate([]string{"gpu-0", "gpu-1"})
	if err != nil {
		t.Fatal(err)
	}
	// GPU 1's NVML index (2) is what NVIDIA's runtime reads, not gpud's 1.
	if r.Envs["NVIDIA_VISIBLE_DEVICES"] != "0,2" || r.Envs["GPUD_GPU"] != "0,1" || len(r.CdiDevices) != 0 {
		t.Errorf("without UUIDs: env %v, CDI %v", r.Envs, r.CdiDevices)
	}
	l.cfg.CDIKind = ""
	if r, err := l.Allocate([]string{"gpu-3"}); err != nil || r.Envs["NVIDIA_VISIBLE_DEVICES"] != "GPU-ddd" || len(r.CdiDevices) != 0 {
		t.Errorf("--cdi-kind \"\": env %v, CDI %v, %v", r.GetEnvs(), r.GetCdiDevices(), err)
	}
}

// Owners' device IDs as NVIDIA's device plugin names them: the GPU's UUID,
// a replica of it under time-slicing or MPS ("UUID::n"), and the index
// forms; anything else names no GPU.
func TestOwnerDeviceIDs(t *testing.T) {
	f := newFixture(t)
	for id, want := range map[string]int{
		"GPU-aaa": 0, "GPU-bbb": 1, "GPU-bbb::0": 1, "GPU-aaa::7": 0, "1": 1, "nvidia0": 0, "gpu-1": 1,
		"GPU-ccc": -1, "GPU-ccc::1": -1, "GPU-aaa::": -1, "::1": -1, "GPU-aa": -1, "": -1,
	} {
		got, ok := f.l.gpuOfOwnerDevice(id)
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("%q: GPU %d, want %d", id, got, want)
		}
	}
}

// A GPU is lendable only when healthy and, where NVML reports memory, with
// at least the floor free; the state file says why not.
func TestLendableNeedsHealthAndFreeMemory(t *testing.T) {
	f := newFixture(t)
	f.l.cfg.MinFreeMemory = 4 << 30
	healthy := func() bool {
		for _, d := range f.l.Devices() {
			if d.ID == "GPU-aaa" { // GPU 0, named by its UUID
				return d.Healthy
			}
		}
		t.Fatal("no GPU-aaa")
		return false
	}
	why := func() string {
		sf := occupancy.Render(f.ledger.Snapshot(time.Now()), "n", true)
		f.l.Decorate(&sf)
		if l := sf.GPUs[0].Lendable; l == nil || *l != (sf.GPUs[0].NotLendable == "") {
			t.Fatalf("lendable %v with reason %q", l, sf.GPUs[0].NotLendable)
		}
		return sf.GPUs[0].NotLendable
	}
	if !healthy() || why() != "" {
		t.Fatalf("the idle GPU 0 with memory unknown is not lendable: %q", why())
	}
	// The idle owner's context keeps 13 GiB of 16: 3 GiB free, below 4.
	f.ledger.SetMemory(0, &occupancy.Memory{Total: 16 << 30, Used: 13 << 30}, map[uint32]uint64{uint32(f.owner.PID): 13 << 30})
	if healthy() || !strings.Contains(why(), "3072 MiB free, below the floor of 4096 MiB") {
		t.Errorf("3 GiB free: lendable %v (%q)", healthy(), why())
	}
	f.ledger.SetMemory(0, &occupancy.Memory{Total: 16 << 30, Used: 10 << 30}, nil)
	if !healthy() || why() != "" {
		t.Errorf("6 GiB free: not lendable (%q)", why())
	}
	// Shared by memory (DRA claims): never lent whole.
	shared := true
	f.l.Shared = func(gpu int) bool { return gpu == 0 && shared }
	if healthy() || !strings.Contains(why(), "shared by memory") {
		t.Errorf("a shared GPU: lendable %v (%q)", healthy(), why())
	}
	shared = false
	if !healthy() || why() != "" {
		t.Errorf("no longer shared: not lendable (%q)", why())
	}
	f.ledger.SetUnhealthy(0, "XID 79", true, time.Now())
	if healthy() || why() != "unhealthy: XID 79" {
		t.Errorf("after XID 79: lendable %v (%q)", healthy(), why())
	}
}

// The owner's memory growing on its lent GPU takes the GPU back, as its
// compute does; the borrower's growth, or the owner's small drift, does
// not.
func TestOwnerMemoryGrowthTakesBack(t *testing.T) {
	f := newFixture(t)
	owner, borrowerPID := uint32(f.owner.PID), uint32(200)
	f.l.Memory(0, map[uint32]uint64{owner: 2 << 30}) // not lent: nothing
	f.lend(t)
	f.ledger.AddFD(occupancy.ProcInfo{PID: 200, PodUID: borrowerUID, Priority: occupancy.Low}, 0, 4, time.Now())
	f.l.Memory(0, map[uint32]uint64{owner: 2 << 30})                              // the base
	f.l.Memory(0, map[uint32]uint64{owner: 2<<30 + 10<<20, borrowerPID: 8 << 30}) // drift; the borrower's use
	if c := f.gate.taken(); len(c) != 0 || !f.l.IsLent(0) {
		t.Fatalf("taken back on drift or the borrower's memory: %+v", c)
	}
	f.l.Memory(0, map[uint32]uint64{owner: 3 << 30, borrowerPID: 8 << 30})
	if c := f.gate.taken(); len(c) != 1 || c[0].gpu != 0 || c[0].by != f.owner.PID || f.l.IsLent(0) {
		t.Fatalf("owner's memory grew by 1 GiB: preemptions %+v, lent %v", c, f.l.IsLent(0))
	}
}

// A lent GPU is named by CDI only when a spec in the runtime's spec
// directories defines it: a CDI-enabled runtime refuses a container that
// names an undefined device. Specs are YAML or JSON, symlinks are not
// followed, other kinds do not count.
func TestCDIDeviceOnlyWhenASpecDefinesIt(t *testing.T) {
	f := newFixture(t)
	f.l.cfg.CDIKind = "nvidia.com/gpu"
	dir := t.TempDir()
	cdi := func() []string {
		f.l.CDI = &CDISpecs{Dirs: []string{dir, filepath.Join(dir, "missing")}}
		r, err := f.l.Allocate([]string{"GPU-aaa"})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, d := range r.CdiDevices {
			names = append(names, d.Name)
		}
		if r.Envs["NVIDIA_VISIBLE_DEVICES"] != "GPU-aaa" || len(r.Devices) == 0 {
			t.Errorf("the legacy contract is gone: %v %v", r.Envs, r.Devices)
		}
		return names
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := cdi(); len(got) != 0 {
		t.Errorf("no spec: CDI devices %v", got)
	}
	write("other.yaml", "cdiVersion: 0.6.0\nkind: example.com/gpu\ndevices:\n- name: GPU-aaa\n")
	write("notes.txt", "kind: nvidia.com/gpu\ndevices:\n- name: GPU-aaa\n")
	real := filepath.Join(t.TempDir(), "nvidia.yaml")
	os.WriteFile(real, []byte("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-aaa\n"), 0o644)
	os.Symlink(real, filepath.Join(dir, "linked.yaml"))
	if got := cdi(); len(got) != 0 {
		t.Errorf("another kind, a .txt, a symlink: CDI devices %v", got)
	}
	write("nvidia.json", `{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[{"name":"0"},{"name":"GPU-aaa"}]}`)
	if got := cdi(); !slices.Equal(got, []string{"nvidia.com/gpu=GPU-aaa"}) {
		t.Errorf("NVIDIA's spec defines it: CDI devices %v", got)
	}
}

// A borrower frozen at the take-back is lent its GPU again once the owner
// is idle again (preempt.Relend); a borrower not suspended (killed, or
// paused by someone else) is not, nor while the owner works.
func TestSuspendedBorrowerLentAgainWhenOwnerIdles(t *testing.T) {
	f := newFixture(t)
	f.reg.Put(workload.Workload{PodUID: borrowerUID, Namespace: "default", Name: "borrower", Priority: occupancy.Low})
	f.lend(t)
	f.ledger.AddFD(occupancy.ProcInfo{PID: 200, PodUID: borrowerUID, Priority: occupancy.Low}, 0, 4, time.Now())
	suspended := false
	var asked []string
	f.l.Suspended = func(uid string) bool { asked = append(asked, uid); return suspended }

	f.l.TakeBack(0)
	f.ledger.Activity(0, time.Now()) // the owner works
	f.ledger.Refresh(time.Now())
	suspended = true
	f.l.relendSuspended()
	if f.l.IsLent(0) {
		t.Fatal("lent again while its owner works")
	}
	// The owner idle again.
	f.ledger.SetIdleAfter(10 * time.Millisecond)
	time.Sleep(30 * time.Millisecond)
	f.ledger.Refresh(time.Now())
	suspended = false
	f.l.relendSuspended()
	if f.l.IsLent(0) {
		t.Fatal("lent again to a borrower gpud does not keep suspended")
	}
	syncs := f.gate.syncs
	suspended = true
	f.l.relendSuspended()
	if !f.l.IsLent(0) {
		t.Fatal("not lent again to its suspended borrower with the owner idle")
	}
	if f.gate.syncs == syncs {
		t.Error("the gate was not synced (the sync thaws the borrower)")
	}
	if !slices.Contains(asked, borrowerUID) {
		t.Errorf("Suspended asked about %v, want the borrower %s", asked, borrowerUID)
	}
	// The owner back again: taken back again.
	f.l.Activity(0, []uint32{uint32(f.owner.PID)})
	if f.l.IsLent(0) {
		t.Error("the owner's compute did not end the second loan")
	}
}
