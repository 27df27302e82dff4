package nri

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	nrilog "github.com/containerd/nri/pkg/log"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// classes records what the registry tells the kernel gate, per cgroup id.
type classes struct {
	mu sync.Mutex
	m  map[uint64]occupancy.Priority
}

func (c *classes) set(id uint64, p occupancy.Priority) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[id] = p
}

func (c *classes) get(id uint64) occupancy.Priority {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id]
}

// podDir makes the cgroup kubelet would have made for a pod before its
// sandbox (cgroupfs driver layout) and returns its id.
func podDir(t *testing.T, root, qos, uid string) uint64 {
	t.Helper()
	d := filepath.Join(root, "kubepods", qos, "pod"+uid)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := cgroups.ID(d)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func sandbox(uid, qos, prio string) *adaptation.PodSandbox {
	return &adaptation.PodSandbox{
		Id: "sb-" + uid[:8], Uid: uid, Namespace: "team", Name: "p-" + uid[:8],
		Labels: map[string]string{workload.LabelPriority: prio, "io.kubernetes.pod.uid": uid},
		Linux:  &adaptation.LinuxPodSandbox{CgroupParent: "/kubepods/" + qos + "/pod" + uid},
	}
}

// runtime is NRI's runtime side (what containerd embeds), in process.
func runtime(t *testing.T, sock string, existing []*adaptation.PodSandbox) *adaptation.Adaptation {
	t.Helper()
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, existing, nil)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	r, err := adaptation.New("test-runtime", "v0", sync, update, adaptation.WithSocketPath(sock),
		adaptation.WithPluginPath(t.TempDir()), adaptation.WithPluginConfigPath(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// The runtime's RunPodSandbox and CreateContainer return only after the
// pod's cgroup has its class in the gate; pods that existed before gpud
// connected are classified at registration; a removed sandbox is forgotten.
func TestPluginClassifiesBeforeTheRuntimeGoesOn(t *testing.T) {
	socketOwner = uint32(os.Getuid())
	sock := filepath.Join(t.TempDir(), "nri.sock")
	root := t.TempDir()
	const (
		oldUID  = "11111111-2222-3333-4444-555555555555"
		newUID  = "66666666-7777-8888-9999-000000000000"
		lateUID = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
	)
	oldID := podDir(t, root, "burstable", oldUID)
	newID := podDir(t, root, "besteffort", newUID)
	lateID := podDir(t, root, "besteffort", lateUID)
	got := &classes{m: map[uint64]occupancy.Priority{}}
	reg := &workload.Registry{Default: occupancy.Unmanaged, OnChange: got.set}
	r := runtime(t, sock, []*adaptation.PodSandbox{sandbox(oldUID, "burstable", "low")})
	p := &Plugin{Socket: sock, Registry: reg, CgroupRoot: root, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Retry: 20 * time.Millisecond}
	startPlugin(t, p)

	testutil.Eventually(t, 10*time.Second, "gpud registers with the runtime", p.Connected.Load)
	if c := got.get(oldID); c != occupancy.Low {
		t.Fatalf("pod existing at registration: class %q in the gate, want low", c)
	}

	ctx2 := context.Background()
	if err := r.RunPodSandbox(ctx2, &adaptation.StateChangeEvent{Event: adaptation.Event_RUN_POD_SANDBOX, Pod: sandbox(newUID, "besteffort", "high")}); err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	if c := got.get(newID); c != occupancy.High { // no waiting: it is there on return
		t.Fatalf("after RunPodSandbox returned: class %q in the gate, want high", c)
	}
	// A pod whose sandbox event was missed is classified at CreateContainer.
	ctr := &adaptation.Container{Id: "c1", PodSandboxId: "sb-" + lateUID[:8], Name: "main"}
	if _, err := r.CreateContainer(ctx2, &adaptation.CreateContainerRequest{Pod: sandbox(lateUID, "besteffort", "low"), Container: ctr}); err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if c := got.get(lateID); c != occupancy.Low {
		t.Fatalf("after CreateContainer returned: class %q in the gate, want low", c)
	}
	if err := r.RemovePodSandbox(ctx2, &adaptation.StateChangeEvent{Event: adaptation.Event_REMOVE_POD_SANDBOX, Pod: sandbox(newUID, "besteffort", "high")}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, "a removed pod leaves the gate", func() bool { return got.get(newID) == "" })
	// A sandbox that is not kubelet's (no valid uid) is counted, never fails the runtime.
	if err := r.RunPodSandbox(ctx2, &adaptation.StateChangeEvent{Event: adaptation.Event_RUN_POD_SANDBOX, Pod: &adaptation.PodSandbox{Id: "x", Uid: "../../etc"}}); err != nil {
		t.Fatalf("RunPodSandbox of a bad sandbox failed the runtime: %v", err)
	}
	if p.Invalid.Load() != 1 {
		t.Fatalf("invalid sandboxes counted %d, want 1", p.Invalid.Load())
	}
}

// TestMain runs a runtime in a child process when asked to: the reconnect
// test kills it as a node's containerd is killed.
func TestMain(m *testing.M) {
	if sock := os.Getenv("GPUD_NRI_TEST_RUNTIME"); sock != "" {
		var pods []*adaptation.PodSandbox
		if uid := os.Getenv("GPUD_NRI_TEST_POD"); uid != "" {
			pods = append(pods, sandbox(uid, "besteffort", "high"))
		}
		sync := func(ctx context.Context, cb adaptation.SyncCB) error { _, err := cb(ctx, pods, nil); return err }
		update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
			return nil, nil
		}
		dir, _ := os.MkdirTemp("", "nri-plugins")
		r, err := adaptation.New("child-runtime", "v0", sync, update, adaptation.WithSocketPath(sock),
			adaptation.WithPluginPath(dir), adaptation.WithPluginConfigPath(dir))
		if err == nil {
			err = r.Start()
		}
		if err != nil {
			os.Exit(3)
		}
		select {}
	}
	// The runtime side logs through NRI's global logger: into the test's void.
	nrilog.Set(logger{slog.New(slog.NewTextHandler(io.Discard, nil))})
	os.Exit(m.Run())
}

// startPlugin runs p until the test ends.
func startPlugin(t *testing.T, p *Plugin) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// childRuntime starts a runtime process on sock whose pods are uid's (none
// for "").
func childRuntime(t *testing.T, sock, uid string) *exec.Cmd {
	t.Helper()
	c := exec.Command(os.Args[0], "-test.run", "^$")
	c.Env = append(os.Environ(), "GPUD_NRI_TEST_RUNTIME="+sock, "GPUD_NRI_TEST_POD="+uid)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	return c
}

// The runtime killed (a containerd restart: the connection drops, its
// socket goes and comes back) ends the connection; gpud registers again
// with the new runtime and classifies what it has.
func TestPluginReconnectsWhenTheRuntimeRestarts(t *testing.T) {
	socketOwner = uint32(os.Getuid())
	sock := filepath.Join(t.TempDir(), "nri.sock")
	root := t.TempDir()
	const uid = "12345678-1234-1234-1234-123456789abc"
	id := podDir(t, root, "besteffort", uid)
	got := &classes{m: map[uint64]occupancy.Priority{}}
	reg := &workload.Registry{Default: occupancy.Unmanaged, OnChange: got.set}
	p := &Plugin{Socket: sock, Registry: reg, CgroupRoot: root, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Retry: 20 * time.Millisecond}
	startPlugin(t, p)

	first := childRuntime(t, sock, "") // the socket appears after gpud started
	testutil.Eventually(t, 10*time.Second, "gpud registers with the first runtime", p.Connected.Load)
	first.Process.Kill()
	first.Wait()
	os.Remove(sock)
	testutil.Eventually(t, 10*time.Second, "gpud sees the runtime gone", func() bool { return !p.Connected.Load() })
	childRuntime(t, sock, uid)
	testutil.Eventually(t, 10*time.Second, "gpud registers again and classifies the pods", func() bool {
		return p.Connected.Load() && got.get(id) == occupancy.High
	})
}

// Only a unix socket owned by root is the runtime's: a symlink or a file
// a user planted there is not connected to.
func TestCheckSocket(t *testing.T) {
	socketOwner = 0
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if err := CheckSocket(file); !errors.Is(err, ErrNotSocket) {
		t.Errorf("regular file: %v, want ErrNotSocket", err)
	}
	sock := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	link := filepath.Join(dir, "link.sock")
	os.Symlink(sock, link)
	if err := CheckSocket(link); !errors.Is(err, ErrNotSocket) {
		t.Errorf("symlink to a socket: %v, want ErrNotSocket", err)
	}
	if os.Getuid() == 0 {
		os.Chown(sock, 1000, 1000)
		if err := CheckSocket(sock); !errors.Is(err, ErrNotRoot) {
			t.Errorf("socket owned by uid 1000: %v, want ErrNotRoot", err)
		}
		os.Chown(sock, 0, 0)
	}
	socketOwner = uint32(os.Getuid())
	if err := CheckSocket(sock); err != nil {
		t.Errorf("the runtime's socket: %v", err)
	}
	if err := CheckSocket(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing socket was accepted")
	}
}

func TestQOSClass(t *testing.T) {
	for parent, want := range map[string]string{
		"/kubepods/besteffort/pod1":       "BestEffort",
		"kubepods-burstable-pod1_2.slice": "Burstable",
		"/kubepods/pod1":                  "Guaranteed",
		"kubepods-pod1.slice":             "Guaranteed",
		"":                                "",
		"/system.slice/something-else":    "",
	} {
		if got := QOSClass(parent); got != want {
			t.Errorf("QOSClass(%q) = %q, want %q", parent, got, want)
		}
	}
}

// A container of a preempted task gets its checkpoint directory from
// CreateContainer (read-only or not, as the policy says) and
// GPUD_RESUME_FROM; other containers get nothing. What the runtime receives
// is the adjustment it applies.
func TestCreateContainerMountsTheTaskCheckpoint(t *testing.T) {
	socketOwner = uint32(os.Getuid())
	sock := filepath.Join(t.TempDir(), "nri.sock")
	root := t.TempDir()
	const (
		ownUID   = "11111111-2222-3333-4444-000000000001"
		readUID  = "11111111-2222-3333-4444-000000000002"
		otherUID = "11111111-2222-3333-4444-000000000003"
	)
	type ask struct{ uid, ns, task string }
	var asked []ask
	reg := &workload.Registry{Default: occupancy.Unmanaged}
	r := runtime(t, sock, nil)
	p := &Plugin{Socket: sock, Registry: reg, CgroupRoot: root, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Retry: 20 * time.Millisecond,
		Checkpoint: func(uid, ns, task string) (string, bool, bool) {
			asked = append(asked, ask{uid, ns, task})
			switch uid {
			case ownUID:
				return "/ckpt/train-42", false, true
			case readUID:
				return "/ckpt/train-42", true, true
			}
			return "", false, false
		}}
	startPlugin(t, p)
	testutil.Eventually(t, 10*time.Second, "gpud registers with the runtime", p.Connected.Load)

	create := func(uid string, labels map[string]string) *adaptation.ContainerAdjustment {
		t.Helper()
		podDir(t, root, "besteffort", uid)
		sb := sandbox(uid, "besteffort", "low")
		for k, v := range labels {
			sb.Labels[k] = v
		}
		resp, err := r.CreateContainer(context.Background(), &adaptation.CreateContainerRequest{Pod: sb,
			Container: &adaptation.Container{Id: "c-" + uid[len(uid)-4:], PodSandboxId: sb.Id, Name: "main"}})
		if err != nil {
			t.Fatalf("CreateContainer: %v", err)
		}
		return resp.GetAdjust()
	}
	mountOf := func(adj *adaptation.ContainerAdjustment) (*adaptation.Mount, string) {
		var m *adaptation.Mount
		for _, x := range adj.GetMounts() {
			if x.Destination == CheckpointPath {
				m = x
			}
		}
		env := ""
		for _, e := range adj.GetEnv() {
			if e.Key == "GPUD_RESUME_FROM" {
				env = e.Value
			}
		}
		return m, env
	}
	m, env := mountOf(create(ownUID, map[string]string{workload.LabelTaskID: "train-42"}))
	if m == nil || m.Source != "/ckpt/train-42" || m.Type != "bind" || !slices.Contains(m.Options, "rw") || slices.Contains(m.Options, "ro") ||
		!slices.Contains(m.Options, "nosuid") || env != CheckpointPath {
		t.Fatalf("the owning pod's container: mount %+v, GPUD_RESUME_FROM %q", m, env)
	}
	m, env = mountOf(create(readUID, map[string]string{workload.LabelTaskID: "train-42"}))
	if m == nil || !slices.Contains(m.Options, "ro") || slices.Contains(m.Options, "rw") || env != CheckpointPath {
		t.Fatalf("another pod of the task: mount %+v, GPUD_RESUME_FROM %q, want read-only", m, env)
	}
	if m, env = mountOf(create(otherUID, nil)); m != nil || env != "" {
		t.Fatalf("a pod of no preempted task: mount %+v, GPUD_RESUME_FROM %q", m, env)
	}
	// The policy is asked with the pod's namespace and task: the label, else namespace/name.
	want := []ask{{ownUID, "team", "train-42"}, {readUID, "team", "train-42"}, {otherUID, "team", "team/p-" + otherUID[:8]}}
	if !slices.Equal(asked, want) {
		t.Errorf("asked %v, want %v", asked, want)
	}
}

// The policy gpud wires in (preempt.Checkpoints): a pod of namespace B
// whose gpud.io/task-id is namespace A's preempted task gets B's own
// directory (B's task was preempted too) or none, never A's, whichever
// namespace was preempted last.
func TestCreateContainerMountsTheNamespacesOwnCheckpoint(t *testing.T) {
	socketOwner = uint32(os.Getuid())
	sock := filepath.Join(t.TempDir(), "nri.sock")
	root, ckRoot := t.TempDir(), t.TempDir()
	const (
		aUID = "11111111-2222-3333-4444-00000000000a"
		bUID = "11111111-2222-3333-4444-00000000000b"
		cUID = "11111111-2222-3333-4444-00000000000c"
	)
	recs := recentRecords{
		{ID: "a1", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "gone-a", Namespace: "team-a", TaskID: "train-42"}},
		{ID: "b1", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "gone-b", Namespace: "team-b", TaskID: "train-42"}},
	}
	for _, r := range recs {
		if _, err := journal.WriteNotice(ckRoot, journal.Notice{Namespace: r.Victim.Namespace, TaskID: r.Victim.TaskID, RecordID: r.ID}); err != nil {
			t.Fatal(err)
		}
	}
	ck := &journal.Checkpoints{Root: ckRoot, HostRoot: "/host/ckpt", Records: recs}
	reg := &workload.Registry{Default: occupancy.Unmanaged}
	r := runtime(t, sock, nil)
	p := &Plugin{Socket: sock, Registry: reg, CgroupRoot: root, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Retry: 20 * time.Millisecond,
		Checkpoint: func(uid, ns, task string) (string, bool, bool) {
			m, ok := ck.For(uid, ns, task)
			return m.Dir, m.ReadOnly, ok
		}}
	startPlugin(t, p)
	testutil.Eventually(t, 10*time.Second, "gpud registers with the runtime", p.Connected.Load)

	mountIn := func(uid, ns string) string {
		t.Helper()
		podDir(t, root, "besteffort", uid)
		sb := sandbox(uid, "besteffort", "low")
		sb.Namespace = ns
		sb.Labels[workload.LabelTaskID] = "train-42"
		resp, err := r.CreateContainer(context.Background(), &adaptation.CreateContainerRequest{Pod: sb,
			Container: &adaptation.Container{Id: "c-" + uid[len(uid)-4:], PodSandboxId: sb.Id, Name: "main"}})
		if err != nil {
			t.Fatalf("CreateContainer: %v", err)
		}
		for _, m := range resp.GetAdjust().GetMounts() {
			if m.Destination == CheckpointPath {
				return m.Source
			}
		}
		return ""
	}
	if got := mountIn(aUID, "team-a"); got != "/host/ckpt/team-a/train-42" {
		t.Errorf("team-a's pod: mount %q, want team-a's directory", got)
	}
	if got := mountIn(bUID, "team-b"); got != "/host/ckpt/team-b/train-42" {
		t.Errorf("team-b's pod naming the same task id: mount %q, want team-b's own directory", got)
	}
	if got := mountIn(cUID, "team-c"); got != "" {
		t.Errorf("team-c, never preempted, naming the task id: mount %q, want none", got)
	}
}

type recentRecords []preempt.Record

func (r recentRecords) Recent() []preempt.Record { return r }

// NRI gives a pod's creation-time labels at every CreateContainer; the
// informer's label, changed since, is newer and stays (#32): the pod is
// not made high again for the up to 2 s before the informer's next resync.
// NRI still adds the cgroup id the informer did not know.
func TestCreateContainerKeepsTheInformersNewerLabel(t *testing.T) {
	socketOwner = uint32(os.Getuid())
	sock := filepath.Join(t.TempDir(), "nri.sock")
	root := t.TempDir()
	const uid = "12121212-3434-5656-7878-909090909090"
	id := podDir(t, root, "burstable", uid)
	got := &classes{m: map[uint64]occupancy.Priority{}}
	reg := &workload.Registry{Default: occupancy.Unmanaged, OnChange: got.set}
	// The informer saw the label changed to low (the pod was made high).
	reg.Put(workload.Workload{PodUID: uid, Namespace: "team", Name: "p", Priority: occupancy.Low, LiveLabels: true})
	r := runtime(t, sock, nil)
	p := &Plugin{Socket: sock, Registry: reg, CgroupRoot: root, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Retry: 20 * time.Millisecond}
	startPlugin(t, p)
	testutil.Eventually(t, 10*time.Second, "gpud registers with the runtime", p.Connected.Load)

	ctr := &adaptation.Container{Id: "c1", PodSandboxId: "sb-" + uid[:8], Name: "main"}
	if _, err := r.CreateContainer(context.Background(), &adaptation.CreateContainerRequest{Pod: sandbox(uid, "burstable", "high"), Container: ctr}); err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	w, _ := reg.Lookup(occupancy.ProcInfo{PodUID: uid})
	if w.Priority != occupancy.Low || w.CgroupID != id {
		t.Errorf("after CreateContainer with the creation-time label high: %+v, want low with cgroup %d", w, id)
	}
	if c := got.get(id); c != occupancy.Low {
		t.Errorf("the gate has %q for the pod's cgroup, want low", c)
	}
}
