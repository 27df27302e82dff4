package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpud/gpud/internal/safefs"
	"github.com/gpud/gpud/internal/sharing"
)

// DriverName is gpud's DRA driver: the ResourceSlices it publishes, the
// DeviceClass gpu-mem.gpud.io selects, the claims it prepares.
const DriverName = "gpud.io"

// CDIKind is the CDI kind of the devices gpud writes for prepared claims.
const CDIKind = "gpud.io/claim"

// MemoryCapacity is the consumable capacity of a shared GPU: its memory.
const MemoryCapacity resourceapi.QualifiedName = "memory"

// Errors a claim's preparation gives.
var (
	// ErrNotOurs: an allocation result names a device this node does not
	// publish (another node's pool, a GPU gone, a GPU no longer shared).
	ErrNotOurs = errors.New("not a device this node shares")
	// ErrNoCapacity: the allocation carries no consumed memory (a
	// scheduler without consumable capacity allocated the whole device).
	ErrNoCapacity = errors.New("allocation without consumed memory")
)

// GPU is what the driver publishes of one GPU, as the daemon sees it now.
type GPU struct {
	Index         int    // gpud's index, N of /dev/nvidiaN
	Minor         int    // the device's minor number
	NVMLIndex     int    // NVML's index (nvidia-smi's)
	UUID          string // NVML's UUID
	Product       string // e.g. "NVIDIA H100 80GB HBM3"
	DriverVersion string
	HostDevice    string // the device node as the host sees it
	MemoryTotal   uint64 // bytes, from NVML
	// Offered false keeps the GPU out of the slice, and Why says why (an
	// unhealthy GPU, one not in the shared list).
	Offered bool
	Why     string
	// Taint, set on a shared GPU found unhealthy (Offered false), keeps it
	// in the slice with this device taint, so that claims and the
	// scheduler see why (health.go).
	Taint *resourceapi.DeviceTaint
	// PCIBusID is NVML's PCI bus id in sysfs's form (0000:3b:00.0); ""
	// without it. NVLinkGroup is the lowest NVML index of the GPUs it is
	// joined to by NVLink, itself included; nil without an active NVLink.
	PCIBusID    string
	NVLinkGroup *int
}

// deviceName is the GPU's device name in the slice: its UUID in lower
// case (a DNS label), stable across reboots and driver reloads.
func (g GPU) deviceName() string { return strings.ToLower(g.UUID) }

// Config is what the driver is told.
type Config struct {
	NodeName string
	Client   kubernetes.Interface
	// PluginDir is the plugin's directory under kubelet's plugins
	// directory, as the host sees it (the DRA socket is made there and
	// kubelet connects to that path); RegistryDir kubelet's
	// plugins_registry.
	PluginDir, RegistryDir string
	// CDIDir is where claim CDI specs are written, a directory of the
	// container runtime's CDI spec directories.
	CDIDir string
	// StateDir keeps the checkpoint of prepared claims (gpud's own root
	// directory).
	StateDir string
	// Reserve is memory kept out of each GPU's capacity (the driver's and
	// CUDA contexts' own); Min and Step the request policy of a share;
	// Default the share of a request that asks no memory (an extended
	// resource request counts devices: each gets Default).
	Reserve, Min, Step, Default uint64
	// NVIDIACDI says whether a CDI device kind=name is defined in the
	// runtime's specs (NVIDIA's nvidia.com/gpu=<UUID>): then a claim gets
	// it too (driver libraries, control nodes) and gpud's spec adds only
	// the environment.
	NVIDIACDI  func(kind, name string) bool
	NVIDIAKind string
	// SysDir is where sysfs is, for the PCIe root of a GPU ("" is /sys).
	SysDir string
	// GPUs lists the node's GPUs now; Changed is kicked when they may
	// have changed (health, memory, the set).
	GPUs func() []GPU
	Book *sharing.Book
	Log  *slog.Logger
	// Published is called after each change of the slice (the state file
	// shows what is offered); may be nil.
	Published func()
}

// Driver is gpud's DRA kubelet plugin.
type Driver struct {
	cfg    Config
	helper *kubeletplugin.Helper
	kick   chan struct{}
	mu     sync.Mutex
	claims map[string]claimRecord // the checkpoint, by claim UID
	ckpt   *safefs.Dir
	cdi    *safefs.Dir
	pub    []resourceapi.Device // what was published last
	// pubIndex maps a published device's name to gpud's index of its GPU.
	pubIndex map[string]int
	stats    Stats
	started  time.Time
	// nodeShared is the node's gpud.io/shared-gpus label, split; nil
	// without it.
	nodeShared []string
	// roots caches each PCI bus id's PCIe root (compute.go).
	rootMu sync.Mutex
	roots  map[string]rootOf
	// totals is each device's last memory from NVML (memoryOf).
	totals map[string]uint64
	// noTaints: the API server dropped device taints (DRADeviceTaints
	// off), so an unhealthy GPU leaves the slice instead.
	noTaints atomic.Bool
}

// SharedLabel is the node label that overrides --dra-shared-gpus on that
// node: all, none, or gpud indexes joined by dots (0.2.3); a label value
// holds no commas.
const SharedLabel = "gpud.io/shared-gpus"

// NodeShared is the node label's list (nil without the label).
func (d *Driver) NodeShared() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nodeShared
}

// readNodeLabel reads SharedLabel off the node; an API error keeps what
// was read before.
func (d *Driver) readNodeLabel(ctx context.Context) {
	n, err := d.cfg.Client.CoreV1().Nodes().Get(ctx, d.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return
	}
	var list []string
	if v, ok := n.Labels[SharedLabel]; ok {
		list = strings.Split(v, ".")
		for _, e := range list {
			if _, err := strconv.Atoi(e); err != nil && e != "all" && e != "none" {
				d.cfg.Log.Warn("node label ignored: want all, none or indexes joined by dots", "label", SharedLabel, "value", v)
				list = nil
				break
			}
		}
	}
	d.mu.Lock()
	changed := !slices.Equal(list, d.nodeShared)
	d.nodeShared = list
	d.mu.Unlock()
	if changed {
		d.cfg.Log.Info("GPUs shared on this node", "label", SharedLabel, "value", strings.Join(list, "."))
		d.Changed()
	}
}

// Stats counts what the driver did, for metrics and tests.
type Stats struct {
	Prepared, AlreadyPrepared, PrepareFailed, Unprepared, Collected uint64
	Published                                                       uint64
	LastPublish                                                     time.Time
	Claims, Offered                                                 int // prepared claims, devices in the slice
	Tainted                                                         int // devices in the slice with a health taint
}

// claimRecord is one prepared claim in the checkpoint.
type claimRecord struct {
	Namespace  string           `json:"namespace"`
	Name       string           `json:"name"`
	Devices    []preparedDevice `json:"devices"`
	Shares     []sharing.Share  `json:"shares"`
	PreparedAt time.Time        `json:"prepared_at"`
}

type preparedDevice struct {
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
	CDI      []string `json:"cdi"`
	ShareID  string   `json:"share_id,omitempty"`
}

// CheckpointFile is the checkpoint's name in StateDir.
const CheckpointFile = "dra-claims.json"

// checkpoint is the file's document.
type checkpoint struct {
	Version int                    `json:"version"`
	Claims  map[string]claimRecord `json:"claims"`
}

// maxCheckpoint bounds the checkpoint read back.
const maxCheckpoint = 16 << 20

// New opens the driver's directories and reads its checkpoint: the claims
// prepared before a restart are in the book again at once.
func New(cfg Config) (*Driver, error) {
	if cfg.Client == nil || cfg.NodeName == "" {
		return nil, errors.New("dra: an API server and a node name are required")
	}
	d := &Driver{cfg: cfg, kick: make(chan struct{}, 1), claims: map[string]claimRecord{}}
	var err error
	if d.ckpt, err = safefs.OpenDir(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("dra: state directory: %w", err)
	}
	if d.cdi, err = safefs.OpenDir(cfg.CDIDir, 0o755); err != nil {
		d.ckpt.Close()
		return nil, fmt.Errorf("dra: CDI directory: %w", err)
	}
	// kubelet's directories: the plugin's own is made here (the helper
	// only listens in it); neither may be changed by anyone but root.
	for _, dir := range []string{cfg.PluginDir, cfg.RegistryDir} {
		if dir == "" {
			continue
		}
		sd, err := safefs.OpenDir(dir, 0o750)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("dra: kubelet plugin directory: %w", err)
		}
		sd.Close()
	}
	if err := d.load(); err != nil {
		d.Close()
		return nil, err
	}
	for uid, c := range d.claims {
		cfg.Book.Set(uid, c.Shares)
	}
	return d, nil
}

// Close releases the directories.
func (d *Driver) Close() {
	d.ckpt.Close()
	d.cdi.Close()
}

// load reads the checkpoint; a missing one is empty, an unreadable or
// malformed one an error (nothing prepared is forgotten silently).
func (d *Driver) load() error {
	c, err := readCheckpoint(d.ckpt)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if c.Claims != nil {
		d.claims = c.Claims
	}
	return nil
}

// readCheckpoint reads the checkpoint in dir: an error wrapping
// os.ErrNotExist when there is none.
func readCheckpoint(dir *safefs.Dir) (checkpoint, error) {
	var c checkpoint
	b, err := dir.ReadOwned(CheckpointFile, maxCheckpoint)
	if err != nil {
		return c, fmt.Errorf("dra: checkpoint: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("dra: checkpoint %s: %w", filepath.Join(dir.Path, CheckpointFile), err)
	}
	if c.Version != 1 {
		return c, fmt.Errorf("dra: checkpoint %s: version %d, want 1", filepath.Join(dir.Path, CheckpointFile), c.Version)
	}
	return c, nil
}

// saveLocked writes the checkpoint durably.
func (d *Driver) saveLocked() error {
	b, err := json.MarshalIndent(checkpoint{Version: 1, Claims: d.claims}, "", " ")
	if err != nil {
		return err
	}
	return d.ckpt.WriteFile(CheckpointFile, b, 0o600, true)
}

// Stats returns the counters.
func (d *Driver) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats
	s.Claims = len(d.claims)
	for _, dev := range d.pub {
		if len(dev.Taints) > 0 {
			s.Tainted++
		} else {
			s.Offered++
		}
	}
	return s
}

// Offers reports whether GPU index is in the slice now (shared), untainted; a nil
// Driver (no DRA) offers none.
func (d *Driver) Offers(index int) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dev := range d.pub {
		if idx, ok := d.pubIndex[dev.Name]; ok && idx == index && len(dev.Taints) == 0 {
			return true
		}
	}
	return false
}

// NotOffered says, per GPU index, why a GPU is not in the slice.
func (d *Driver) NotOffered() map[int]string {
	out := map[int]string{}
	for _, g := range d.cfg.GPUs() {
		if !g.Offered {
			out[g.Index] = g.Why
		}
	}
	return out
}

// Changed asks for the slice to be published again if the GPUs changed.
func (d *Driver) Changed() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// collectEvery is how often prepared claims are checked against the API
// server: a claim deleted while gpud was down is unprepared after.
const collectEvery = 30 * time.Second

// Run registers the plugin with kubelet, publishes the slice and keeps it
// current until ctx ends.
func (d *Driver) Run(ctx context.Context) error {
	if err := Served(d.cfg.Client); err != nil {
		return err
	}
	h, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(d.cfg.NodeName),
		kubeletplugin.KubeClient(d.cfg.Client),
		kubeletplugin.PluginDataDirectoryPath(d.cfg.PluginDir),
		kubeletplugin.RegistrarDirectoryPath(d.cfg.RegistryDir),
	)
	if err != nil {
		return fmt.Errorf("dra: starting the kubelet plugin: %w", err)
	}
	defer h.Stop()
	d.mu.Lock()
	d.helper, d.started = h, time.Now()
	d.mu.Unlock()
	d.cfg.Log.Info("DRA driver registering with kubelet", "driver", DriverName, "plugin_dir", d.cfg.PluginDir, "claims", len(d.claims))
	go d.WatchClaims(ctx)
	d.publish(ctx)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	collect := time.NewTicker(collectEvery)
	defer collect.Stop()
	d.readNodeLabel(ctx)
	d.collect(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.kick:
			d.publish(ctx)
		case <-tick.C:
			d.publish(ctx)
		case <-collect.C:
			d.readNodeLabel(ctx)
			d.collect(ctx)
		}
	}
}

// ErrNotServed: the API server has no resource.k8s.io/v1 (Kubernetes
// before 1.34, or DRA turned off).
var ErrNotServed = errors.New("the API server serves no resource.k8s.io/v1 ResourceSlices (DRA needs Kubernetes 1.34 or later; consumable capacity 1.36)")

// Served checks that the API server serves what the driver needs.
func Served(c kubernetes.Interface) error {
	res, err := c.Discovery().ServerResourcesForGroupVersion(resourceapi.SchemeGroupVersion.String())
	if apierrors.IsNotFound(err) {
		return ErrNotServed
	}
	if err != nil {
		return fmt.Errorf("dra: asking the API server for resource.k8s.io/v1: %w", err)
	}
	for _, r := range res.APIResources {
		if r.Name == "resourceslices" {
			return nil
		}
	}
	return ErrNotServed
}

// Devices returns the slice's devices for gpus: each offered GPU with its
// attributes and its memory, less the reserve, as a consumable capacity;
// a tainted one with its taint.
func (d *Driver) Devices(gpus []GPU) []resourceapi.Device {
	var out []resourceapi.Device
	for _, g := range gpus {
		total := d.memoryOf(g)
		if !g.Offered && (g.Taint == nil || d.noTaints.Load()) || g.UUID == "" || total <= d.cfg.Reserve {
			continue
		}
		policy := &resourceapi.CapacityRequestPolicy{
			Default: qty(max(d.cfg.Default, d.cfg.Min)),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{
				Min: qty(d.cfg.Min),
			},
		}
		if d.cfg.Step > 0 {
			policy.ValidRange.Step = qty(d.cfg.Step)
		}
		out = append(out, resourceapi.Device{
			Name: g.deviceName(),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid":          {StringValue: ptr.To(g.UUID)},
				"index":         {IntValue: ptr.To(int64(g.NVMLIndex))},
				"minor":         {IntValue: ptr.To(int64(g.Minor))},
				"productName":   {StringValue: ptr.To(g.Product)},
				"driverVersion": {StringValue: ptr.To(g.DriverVersion)},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				MemoryCapacity: {Value: *qty(total - d.cfg.Reserve), RequestPolicy: policy},
			},
			AllowMultipleAllocations: ptr.To(true),
			Taints:                   taintsOf(g),
		})
		d.computeAndTopology(&out[len(out)-1], g)
	}
	return out
}

func qty(b uint64) *resource.Quantity { return resource.NewQuantity(int64(b), resource.BinarySI) }

// publish gives the helper the slice when it differs from the last one.
func (d *Driver) publish(ctx context.Context) {
	gpus := d.cfg.GPUs()
	devs := d.Devices(gpus)
	index := map[string]int{}
	for _, g := range gpus {
		index[g.deviceName()] = g.Index
	}
	d.mu.Lock()
	same := d.stats.Published > 0 && reflect.DeepEqual(devs, d.pub)
	h := d.helper
	d.mu.Unlock()
	if same || h == nil {
		return
	}
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}
	if err := h.PublishResources(ctx, res); err != nil {
		d.cfg.Log.Error("publishing the ResourceSlice failed", "error", err)
		return
	}
	d.mu.Lock()
	d.pub, d.pubIndex = devs, index
	d.stats.Published++
	d.stats.LastPublish = time.Now()
	d.mu.Unlock()
	d.cfg.Log.Info("ResourceSlice published", "driver", DriverName, "devices", len(devs))
	if d.cfg.Published != nil {
		d.cfg.Published()
	}
}

// PrepareResourceClaims prepares each claim: a CDI spec naming its GPU
// and its limit, its shares in the book, the checkpoint written before
// kubelet hears of it. A claim already prepared gets the same answer.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	gpus := map[string]GPU{}
	for _, g := range d.cfg.GPUs() {
		gpus[g.deviceName()] = g
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := false
	for _, c := range claims {
		uid := string(c.UID)
		if _, ok := d.claims[uid]; ok {
			d.stats.AlreadyPrepared++
			// Asked again for a later pod: the claim as kubelet has it now
			// may name it.
			d.reservedLocked(c)
			rec := d.claims[uid]
			if err := d.writeCDILocked(uid, rec.Shares, gpus); err != nil {
				out[c.UID] = kubeletplugin.PrepareResult{Err: err}
				continue
			}
			out[c.UID] = kubeletplugin.PrepareResult{Devices: rec.result()}
			continue
		}
		rec, err := d.prepareOne(c, gpus)
		if err == nil {
			err = d.writeCDILocked(uid, rec.Shares, gpus)
		}
		if err != nil {
			d.stats.PrepareFailed++
			d.cfg.Log.Warn("claim not prepared", "claim", c.Namespace+"/"+c.Name, "claim_uid", uid, "error", err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		d.claims[uid] = rec
		changed = true
		d.stats.Prepared++
		out[c.UID] = kubeletplugin.PrepareResult{Devices: rec.result()}
	}
	if changed {
		if err := d.saveLocked(); err != nil {
			// Nothing is handed to kubelet that a restart would forget.
			for _, c := range claims {
				if _, had := out[c.UID]; had && out[c.UID].Err == nil {
					out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("dra: checkpoint: %w", err)}
				}
			}
			if lerr := d.load(); lerr != nil {
				d.cfg.Log.Error("re-reading the DRA checkpoint failed", "error", lerr)
			}
			return out, nil
		}
		for _, c := range claims {
			if rec, ok := d.claims[string(c.UID)]; ok {
				d.cfg.Book.Set(string(c.UID), rec.Shares)
				for _, s := range rec.Shares {
					d.cfg.Log.Info("claim prepared", "claim", c.Namespace+"/"+c.Name, "claim_uid", string(c.UID),
						"gpu", s.GPU, "uuid", s.UUID, "memory_mib", s.Bytes>>20, "compute_percent", s.Compute, "hard_cap", s.HardCap, "pods", len(s.Pods))
				}
			}
		}
	}
	return out, nil
}

// WatchClaims follows the ResourceClaims until ctx ends and gives each
// prepared claim every pod it is reserved for (Reserved). kubelet prepares
// a claim once, for its first pod: a later pod that references the same
// claim is never named to the driver, only in the claim's
// status.reservedFor, which the scheduler writes before the pod is bound
// (so before its containers start).
func (d *Driver) WatchClaims(ctx context.Context) {
	f := informers.NewSharedInformerFactory(d.cfg.Client, 0)
	inf := f.Resource().V1().ResourceClaims().Informer()
	on := func(obj any) {
		if c, ok := obj.(*resourceapi.ResourceClaim); ok {
			d.Reserved(c)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    on,
		UpdateFunc: func(_, obj any) { on(obj) },
	}); err != nil {
		d.cfg.Log.Error("watching ResourceClaims: a claim's second pod is not given its share", "error", err)
		return
	}
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
}

// Reserved records the pods a prepared claim is now reserved for (its
// status.reservedFor) in its shares: each gets the claim's share and its
// fence. A pod is added, never removed while the claim is prepared here:
// the reservation of a pod that ended is dropped while its containers may
// still be stopping, and a pod no longer running holds nothing. Claims not
// prepared on this node are ignored.
func (d *Driver) Reserved(c *resourceapi.ResourceClaim) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reservedLocked(c)
}

func (d *Driver) reservedLocked(c *resourceapi.ResourceClaim) {
	uid := string(c.UID)
	rec, ok := d.claims[uid]
	if !ok || len(rec.Shares) == 0 {
		return
	}
	have := map[string]bool{}
	for _, p := range rec.Shares[0].Pods {
		have[p.UID] = true
	}
	var added []sharing.PodRef
	for _, p := range reservedPods(c) {
		if !have[p.UID] {
			have[p.UID] = true
			added = append(added, p)
		}
	}
	if len(added) == 0 {
		return
	}
	old := rec
	rec.Shares = slices.Clone(rec.Shares)
	for i := range rec.Shares {
		rec.Shares[i].Pods = append(slices.Clone(rec.Shares[i].Pods), added...)
	}
	d.claims[uid] = rec
	if err := d.saveLocked(); err != nil {
		d.claims[uid] = old // tried again at the claim's next update
		d.cfg.Log.Warn("a claim's new pod is not given its share: checkpoint", "claim", c.Namespace+"/"+c.Name, "claim_uid", uid, "error", err)
		return
	}
	d.cfg.Book.Set(uid, rec.Shares)
	for _, p := range added {
		d.cfg.Log.Info("claim reserved for another pod: it shares the claim's GPUs", "claim", c.Namespace+"/"+c.Name, "claim_uid", uid,
			"pod_namespace", p.Namespace, "pod", p.Name, "pod_uid", p.UID)
	}
}

// reservedPods returns the pods a claim is reserved for.
func reservedPods(c *resourceapi.ResourceClaim) []sharing.PodRef {
	var pods []sharing.PodRef
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" && r.UID != "" {
			pods = append(pods, sharing.PodRef{UID: string(r.UID), Namespace: c.Namespace, Name: r.Name})
		}
	}
	return pods
}

// prepareOne reads the claim's allocation on this node.
func (d *Driver) prepareOne(c *resourceapi.ResourceClaim, gpus map[string]GPU) (claimRecord, error) {
	rec := claimRecord{Namespace: c.Namespace, Name: c.Name, PreparedAt: time.Now().UTC()}
	if c.Status.Allocation == nil {
		return rec, fmt.Errorf("dra: claim %s/%s is not allocated", c.Namespace, c.Name)
	}
	pods := reservedPods(c)
	caps, err := hardCaps(c)
	if err != nil {
		return rec, err
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		g, ok := gpus[r.Device]
		if r.Pool != d.cfg.NodeName || !ok {
			return rec, fmt.Errorf("dra: %w: pool %s device %s", ErrNotOurs, r.Pool, r.Device)
		}
		q, ok := r.ConsumedCapacity[MemoryCapacity]
		if !ok || q.Sign() <= 0 {
			return rec, fmt.Errorf("dra: device %s for request %s: %w", r.Device, r.Request, ErrNoCapacity)
		}
		compute, err := consumedCompute(r, caps[r.Request])
		if err != nil {
			return rec, fmt.Errorf("dra: claim %s/%s: %w", c.Namespace, c.Name, err)
		}
		pd := preparedDevice{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device}
		if r.ShareID != nil {
			pd.ShareID = string(*r.ShareID)
		}
		rec.Devices = append(rec.Devices, pd)
		rec.Shares = append(rec.Shares, sharing.Share{
			ClaimUID: string(c.UID), ClaimNamespace: c.Namespace, ClaimName: c.Name, Request: r.Request,
			GPU: g.Index, UUID: g.UUID, Bytes: uint64(q.Value()), Compute: compute, HardCap: caps[r.Request], Pods: pods,
		})
	}
	if len(rec.Devices) == 0 {
		return rec, fmt.Errorf("dra: claim %s/%s has no device of driver %s", c.Namespace, c.Name, DriverName)
	}
	for i := range rec.Devices {
		rec.Devices[i].CDI = d.cdiIDs(string(c.UID), i, gpus[rec.Devices[i].Device])
	}
	return rec, nil
}

// cdiName is the CDI device of a claim's i-th device: unique per claim,
// never reused (a runtime caching specs never sees a stale one).
func cdiName(uid string, i int) string { return uid + "-" + strconv.Itoa(i) }

func (d *Driver) cdiIDs(uid string, i int, g GPU) []string {
	ids := []string{CDIKind + "=" + cdiName(uid, i)}
	if d.cfg.NVIDIAKind != "" && d.cfg.NVIDIACDI != nil && d.cfg.NVIDIACDI(d.cfg.NVIDIAKind, g.UUID) {
		ids = append(ids, d.cfg.NVIDIAKind+"="+g.UUID)
	}
	return ids
}

// result is the claim's answer to kubelet.
func (r claimRecord) result() []kubeletplugin.Device {
	var out []kubeletplugin.Device
	for _, pd := range r.Devices {
		dev := kubeletplugin.Device{Requests: pd.Requests, PoolName: pd.Pool, DeviceName: pd.Device, CDIDeviceIDs: pd.CDI}
		if pd.ShareID != "" {
			id := types.UID(pd.ShareID)
			dev.ShareID = &id
		}
		out = append(out, dev)
	}
	return out
}

// cdiFile is the claim's spec file in the CDI directory.
func cdiFile(uid string) string { return cdiPrefix + uid + cdiSuffix }

const cdiPrefix, cdiSuffix = "gpud.io-claim_", ".json"

// Env is the environment a container of a claim gets for one share.
func Env(s sharing.Share, total uint64) []string {
	mib := s.Bytes >> 20
	env := []string{
		"GPUD_GPU_MEMORY_LIMIT_MIB=" + strconv.FormatUint(mib, 10),
		"GPUD_GPU_UUID=" + s.UUID,
		"NVIDIA_VISIBLE_DEVICES=" + s.UUID,
		// TensorFlow allocates as it grows instead of taking the GPU.
		"TF_FORCE_GPU_ALLOW_GROWTH=true",
	}
	if total > 0 {
		// JAX preallocates this fraction of the GPU's memory.
		frac := float64(s.Bytes) / float64(total)
		env = append(env, "XLA_PYTHON_CLIENT_MEM_FRACTION="+strconv.FormatFloat(frac, 'f', 3, 64))
	}
	return env
}

// cdiSpec is the CDI document gpud writes for one claim.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name  string   `json:"name"`
	Edits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env         []string  `json:"env,omitempty"`
	DeviceNodes []cdiNode `json:"deviceNodes,omitempty"`
}

type cdiNode struct {
	Path     string `json:"path"`
	HostPath string `json:"hostPath,omitempty"`
}

// writeCDILocked writes the claim's CDI spec (again: a restart of the
// runtime, or a spec removed by hand, must not leave kubelet naming a
// device nobody defines).
func (d *Driver) writeCDILocked(uid string, shares []sharing.Share, gpus map[string]GPU) error {
	spec := cdiSpec{Version: "0.6.0", Kind: CDIKind}
	byUUID := map[string]GPU{}
	for _, g := range gpus {
		byUUID[g.UUID] = g
	}
	for i, s := range shares {
		g, ok := byUUID[s.UUID]
		if !ok {
			return fmt.Errorf("dra: claim %s: GPU %s: %w", uid, s.UUID, ErrNotOurs)
		}
		dev := cdiDevice{Name: cdiName(uid, i), Edits: cdiEdits{Env: Env(s, g.MemoryTotal)}}
		if len(d.cdiIDs(uid, i, g)) == 1 {
			// No NVIDIA CDI device brings the node: gpud's spec does.
			dev.Edits.DeviceNodes = []cdiNode{{Path: "/dev/nvidia" + strconv.Itoa(g.Index), HostPath: g.HostDevice}}
		}
		spec.Devices = append(spec.Devices, dev)
	}
	b, err := json.MarshalIndent(spec, "", " ")
	if err != nil {
		return err
	}
	if err := d.cdi.WriteFile(cdiFile(uid), b, 0o644, true); err != nil {
		return fmt.Errorf("dra: CDI spec: %w", err)
	}
	return nil
}

// UnprepareResourceClaims undoes PrepareResourceClaims; a claim not
// prepared is no error (kubelet may ask again).
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range claims {
		out[c.UID] = d.unprepareLocked(string(c.UID), "kubelet")
	}
	return out, nil
}

func (d *Driver) unprepareLocked(uid, why string) error {
	rec, ok := d.claims[uid]
	if err := d.cdi.Remove(cdiFile(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("dra: removing the CDI spec of claim %s: %w", uid, err)
	}
	if !ok {
		return nil
	}
	delete(d.claims, uid)
	if err := d.saveLocked(); err != nil {
		d.claims[uid] = rec
		return fmt.Errorf("dra: checkpoint: %w", err)
	}
	d.cfg.Book.Remove(uid)
	d.stats.Unprepared++
	d.cfg.Log.Info("claim unprepared", "claim", rec.Namespace+"/"+rec.Name, "claim_uid", uid, "by", why)
	return nil
}

// collect unprepares the checkpointed claims the API server no longer has
// (deleted, or replaced by a claim of the same name) and that no pod of
// this node uses: kubelet does not ask for a claim it no longer knows.
func (d *Driver) collect(ctx context.Context) {
	d.mu.Lock()
	recs := maps.Clone(d.claims)
	d.mu.Unlock()
	var gone []string
	for uid, rec := range recs {
		c, err := d.cfg.Client.ResourceV1().ResourceClaims(rec.Namespace).Get(ctx, rec.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			continue // the API server is away: judge later
		case string(c.UID) != uid:
		default:
			continue
		}
		if d.podsAlive(ctx, rec) {
			continue
		}
		gone = append(gone, uid)
	}
	slices.Sort(gone)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, uid := range gone {
		if err := d.unprepareLocked(uid, "claim gone from the API server"); err != nil {
			d.cfg.Log.Warn("unpreparing a deleted claim failed", "claim_uid", uid, "error", err)
			continue
		}
		d.stats.Collected++
	}
}

// podsAlive reports whether a pod the claim was prepared for still exists
// with the same UID (its containers may still run).
func (d *Driver) podsAlive(ctx context.Context, rec claimRecord) bool {
	for _, s := range rec.Shares {
		for _, p := range s.Pods {
			pod, err := d.cfg.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return true // unknown: keep it
			}
			if err == nil && string(pod.UID) == p.UID {
				return true
			}
		}
	}
	return false
}

// HandleError logs the helper's background errors; they are all
// retried by it (publishing), none stops gpud.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	if d.taintsDropped(err) {
		return
	}
	d.cfg.Log.Error("DRA driver: "+msg, "error", err)
}
