package dra

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/gpud/gpud/internal/safefs"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
)

const (
	uuid0 = "GPU-5a1e0c7d-2b3f-4c8e-9d10-6e7f8a9b0c01"
	uuid1 = "GPU-5a1e0c7d-2b3f-4c8e-9d10-6e7f8a9b0c02"
)

func testGPUs() []GPU {
	return []GPU{
		{Index: 0, Minor: 0, NVMLIndex: 1, UUID: uuid0, Product: "NVIDIA L4", DriverVersion: "570.86.15", HostDevice: "/dev/nvidia0", MemoryTotal: 16 << 30, Offered: true},
		{Index: 1, Minor: 1, NVMLIndex: 0, UUID: uuid1, Product: "NVIDIA L4", DriverVersion: "570.86.15", HostDevice: "/dev/nvidia1", MemoryTotal: 16 << 30, Offered: true},
	}
}

// newDriver builds a driver over a fake API server in temporary
// directories (root-owned when the test runs as root, as gpud does).
func newDriver(t *testing.T, state, cdi string, objs ...any) (*Driver, *fake.Clientset) {
	t.Helper()
	var ros []any
	ros = append(ros, objs...)
	cs := fake.NewClientset()
	for _, o := range ros {
		switch o := o.(type) {
		case *resourceapi.ResourceClaim:
			if _, err := cs.ResourceV1().ResourceClaims(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		case *corev1.Pod:
			if _, err := cs.CoreV1().Pods(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	d, err := New(Config{
		NodeName: "node1", Client: cs, CDIDir: cdi, StateDir: state,
		Reserve: 512 << 20, Min: 256 << 20, Step: 256 << 20, Default: 4 << 30,
		GPUs: testGPUs, Book: sharing.NewBook(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d, cs
}

func dirs(t *testing.T) (string, string) {
	testutil.RequireRoot(t) // safefs directories are root's
	r := t.TempDir()
	return filepath.Join(r, "state"), filepath.Join(r, "cdi")
}

// claim is a claim allocated mem of device dev on this node, reserved for
// pod ns/pod.
func claim(name, uid, dev, mem string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: DriverName, Pool: "node1", Device: dev,
				ShareID:          ptr.To(types.UID("share-" + uid)),
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{MemoryCapacity: resource.MustParse(mem)},
			}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + name, UID: types.UID("pod-uid-" + uid)}},
		},
	}
}

func TestDevicesOfferSharedGPUsWithTheirMemory(t *testing.T) {
	d := &Driver{cfg: Config{Reserve: 512 << 20, Min: 256 << 20, Step: 256 << 20, Default: 4 << 30}}
	gpus := testGPUs()
	gpus[1].Offered, gpus[1].Why = false, "unhealthy: XID 79"
	devs := d.Devices(gpus)
	if len(devs) != 1 {
		t.Fatalf("%d devices, want the healthy one: %+v", len(devs), devs)
	}
	dev := devs[0]
	if dev.Name != strings.ToLower(uuid0) || !*dev.AllowMultipleAllocations {
		t.Errorf("device %s, multiple %v", dev.Name, *dev.AllowMultipleAllocations)
	}
	c := dev.Capacity[MemoryCapacity]
	if c.Value.Value() != 16<<30-512<<20 || c.RequestPolicy.ValidRange.Min.Value() != 256<<20 || c.RequestPolicy.ValidRange.Step.Value() != 256<<20 || c.RequestPolicy.Default.Value() != 4<<30 {
		t.Errorf("memory capacity %+v", c)
	}
	if *dev.Attributes["uuid"].StringValue != uuid0 || *dev.Attributes["index"].IntValue != 1 || *dev.Attributes["productName"].StringValue != "NVIDIA L4" {
		t.Errorf("attributes %+v", dev.Attributes)
	}
	// No UUID (no NVML), or not more memory than the reserve: not offered.
	gpus[0].UUID = ""
	if devs := d.Devices(gpus); len(devs) != 0 {
		t.Errorf("a GPU without UUID offered: %+v", devs)
	}
}

func TestPrepareIsIdempotentAndCheckpointed(t *testing.T) {
	state, cdi := dirs(t)
	d, _ := newDriver(t, state, cdi)
	ctx := context.Background()
	c := claim("a", "uid-a", strings.ToLower(uuid1), "4Gi")
	res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare: %v %v", err, res[c.UID].Err)
	}
	devs := res[c.UID].Devices
	if len(devs) != 1 || devs[0].DeviceName != strings.ToLower(uuid1) || devs[0].CDIDeviceIDs[0] != CDIKind+"=uid-a-0" || string(*devs[0].ShareID) != "share-uid-a" {
		t.Errorf("devices %+v", devs)
	}
	shares := d.cfg.Book.Shares()
	if len(shares) != 1 || shares[0].GPU != 1 || shares[0].Bytes != 4<<30 || shares[0].Pods[0].Name != "pod-a" {
		t.Errorf("book %+v", shares)
	}
	spec, err := os.ReadFile(filepath.Join(cdi, "gpud.io-claim_uid-a.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"GPUD_GPU_MEMORY_LIMIT_MIB=4096"`, `"NVIDIA_VISIBLE_DEVICES=` + uuid1 + `"`, `"path": "/dev/nvidia1"`, `"XLA_PYTHON_CLIENT_MEM_FRACTION=0.250"`} {
		if !strings.Contains(string(spec), want) {
			t.Errorf("CDI spec lacks %s:\n%s", want, spec)
		}
	}
	// Again (kubelet restarted): the same answer, nothing prepared twice.
	res2, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if st := d.Stats(); st.Prepared != 1 || st.AlreadyPrepared != 1 || !equalDevices(res2[c.UID].Devices, devs) {
		t.Errorf("second prepare: stats %+v, devices %+v", st, res2[c.UID].Devices)
	}

	// What `gpud uninstall` reads: the claim, and its spec by name.
	if got := prepared(t, state); !slices.Equal(got, []PreparedClaim{{UID: "uid-a", Namespace: "ns", Name: "a"}}) {
		t.Errorf("ReadPrepared: %+v", got)
	}
	if uid, ok := ClaimSpecUID("gpud.io-claim_uid-a.json"); !ok || uid != "uid-a" {
		t.Errorf("ClaimSpecUID of the spec written: %q %v", uid, ok)
	}

	// gpud restarted: the checkpoint puts the share back in the book.
	d2, _ := newDriver(t, state, cdi)
	if s := d2.cfg.Book.Shares(); len(s) != 1 || s[0].ClaimUID != "uid-a" {
		t.Errorf("book after a restart: %+v", s)
	}
	res3, _ := d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if st := d2.Stats(); st.Prepared != 0 || st.AlreadyPrepared != 1 || !equalDevices(res3[c.UID].Devices, devs) {
		t.Errorf("prepare after a restart: stats %+v", st)
	}

	// Unprepare, twice: the spec and the share gone, no error.
	for i := 0; i < 2; i++ {
		out, err := d2.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: c.UID, NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}}})
		if err != nil || out[c.UID] != nil {
			t.Fatalf("unprepare %d: %v %v", i, err, out[c.UID])
		}
	}
	if _, err := os.Stat(filepath.Join(cdi, "gpud.io-claim_uid-a.json")); !os.IsNotExist(err) {
		t.Errorf("CDI spec still there: %v", err)
	}
	if s := d2.cfg.Book.Shares(); len(s) != 0 {
		t.Errorf("book after unprepare: %+v", s)
	}
	var ck checkpoint
	b, _ := os.ReadFile(filepath.Join(state, CheckpointFile))
	if json.Unmarshal(b, &ck) != nil || len(ck.Claims) != 0 {
		t.Errorf("checkpoint after unprepare: %s", b)
	}
	if got := prepared(t, state); len(got) != 0 {
		t.Errorf("ReadPrepared after unprepare: %+v", got)
	}
}

func prepared(t *testing.T, state string) []PreparedClaim {
	t.Helper()
	d, err := safefs.OpenExisting("/", state)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := ReadPrepared(d)
	if err != nil {
		t.Fatalf("ReadPrepared: %v", err)
	}
	return got
}

// Only gpud's claim spec names give a UID: NVIDIA's own specs and odd
// names in the CDI directory are not claims.
func TestClaimSpecUID(t *testing.T) {
	for name, want := range map[string]string{
		cdiFile("0b1c-2d"):         "0b1c-2d",
		"gpud.io-claim_.json":      "",
		"gpud.io-claim_x.yaml":     "",
		"nvidia.com-gpu.json":      "",
		"gpud.io-claim_x.json.tmp": "",
		"xgpud.io-claim_x.json":    "",
	} {
		if uid, ok := ClaimSpecUID(name); uid != want || ok != (want != "") {
			t.Errorf("ClaimSpecUID(%q) = %q %v, want %q", name, uid, ok, want)
		}
	}
}

// No checkpoint is not "no claims": the caller must tell them apart.
func TestReadPreparedWithoutCheckpoint(t *testing.T) {
	state, _ := dirs(t)
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := safefs.OpenExisting("/", state)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := ReadPrepared(d); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadPrepared without a checkpoint: %v, want fs.ErrNotExist", err)
	}
}

func equalDevices(a, b []kubeletplugin.Device) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func TestPrepareRefusesWhatIsNotOurs(t *testing.T) {
	state, cdi := dirs(t)
	d, _ := newDriver(t, state, cdi)
	other := claim("b", "uid-b", strings.ToLower(uuid0), "4Gi")
	other.Status.Allocation.Devices.Results[0].Pool = "node2"
	gone := claim("c", "uid-c", "gpu-unknown", "4Gi")
	whole := claim("d", "uid-d", strings.ToLower(uuid0), "4Gi")
	whole.Status.Allocation.Devices.Results[0].ConsumedCapacity = nil
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{other, gone, whole})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*resourceapi.ResourceClaim{other, gone} {
		if !errors.Is(res[c.UID].Err, ErrNotOurs) {
			t.Errorf("claim %s: %v, want ErrNotOurs", c.Name, res[c.UID].Err)
		}
	}
	if !errors.Is(res[whole.UID].Err, ErrNoCapacity) {
		t.Errorf("a whole-device allocation: %v, want ErrNoCapacity", res[whole.UID].Err)
	}
	if s := d.cfg.Book.Shares(); len(s) != 0 {
		t.Errorf("refused claims in the book: %+v", s)
	}
}

func TestMalformedCheckpointIsAnError(t *testing.T) {
	state, cdi := dirs(t)
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, CheckpointFile), []byte(`{"version":1,"claims":`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{NodeName: "n", Client: fake.NewClientset(), StateDir: state, CDIDir: cdi, Book: sharing.NewBook(), GPUs: testGPUs})
	if err == nil || !strings.Contains(err.Error(), CheckpointFile) {
		t.Errorf("a truncated checkpoint: %v, want an error naming it", err)
	}
}

// A claim deleted while gpud was down is unprepared by the collector; one
// that still exists, or whose pod still runs, is kept.
func TestCollectUnpreparesDeletedClaims(t *testing.T) {
	state, cdi := dirs(t)
	kept := claim("kept", "uid-kept", strings.ToLower(uuid0), "4Gi")
	d, cs := newDriver(t, state, cdi, kept)
	ctx := context.Background()
	gone := claim("gone", "uid-gone", strings.ToLower(uuid0), "4Gi")
	replaced := claim("repl", "uid-repl", strings.ToLower(uuid1), "4Gi")
	podAlive := claim("alive", "uid-alive", strings.ToLower(uuid1), "4Gi")
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-alive", Namespace: "ns", UID: "pod-uid-uid-alive"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	newer := claim("repl", "uid-repl-2", strings.ToLower(uuid1), "4Gi")
	if _, err := cs.ResourceV1().ResourceClaims("ns").Create(ctx, newer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{kept, gone, replaced, podAlive}); err != nil {
		t.Fatal(err)
	}
	d.collect(ctx)
	var left []string
	for _, s := range d.cfg.Book.Shares() {
		left = append(left, s.ClaimName)
	}
	if strings.Join(left, ",") != "alive,kept" && strings.Join(left, ",") != "kept,alive" {
		t.Errorf("after collection: %v, want kept and alive", left)
	}
	if st := d.Stats(); st.Collected != 2 {
		t.Errorf("collected %d, want 2", st.Collected)
	}
}

// servedResources makes the fake API server serve DRA's resources.
func servedResources(cs *fake.Clientset) {
	cs.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
		GroupVersion: "resource.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "resourceslices"}, {Name: "resourceclaims"}},
	}}
}

func TestServedSaysWhatAnOldClusterLacks(t *testing.T) {
	cs := fake.NewClientset()
	if err := Served(cs); !errors.Is(err, ErrNotServed) {
		t.Errorf("no resource.k8s.io/v1: %v, want ErrNotServed", err)
	}
	cs.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
		GroupVersion: "resource.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "resourceslices"}, {Name: "resourceclaims"}},
	}}
	if err := Served(cs); err != nil {
		t.Errorf("served: %v", err)
	}
}

// The node's gpud.io/shared-gpus label overrides the flag on that node; a
// malformed one is ignored, as is an API server that does not answer.
func TestNodeLabelSaysWhichGPUsAreShared(t *testing.T) {
	state, cdi := dirs(t)
	d, cs := newDriver(t, state, cdi)
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", Labels: map[string]string{SharedLabel: "0.3"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.readNodeLabel(ctx)
	if got := d.NodeShared(); strings.Join(got, ",") != "0,3" {
		t.Errorf("label 0.3: %v", got)
	}
	node.Labels[SharedLabel] = "0.gpu-x"
	if _, err := cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.readNodeLabel(ctx)
	if got := d.NodeShared(); got != nil {
		t.Errorf("a malformed label: %v, want it ignored (the flag applies)", got)
	}
	node.Labels[SharedLabel] = "none"
	cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	d.readNodeLabel(ctx)
	cs.CoreV1().Nodes().Delete(ctx, "node1", metav1.DeleteOptions{})
	d.readNodeLabel(ctx)
	if got := d.NodeShared(); strings.Join(got, ",") != "none" {
		t.Errorf("after the API server lost the node: %v, want the last label read (none)", got)
	}
}
