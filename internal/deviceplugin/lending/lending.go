// Package lending is the device plugin's backend that lends idle GPUs
// (resource gpud.io/idle-gpu): one device per GPU, Healthy while the GPU is
// lendable; owners and borrowers read from kubelet's PodResources, their
// classes forced (a borrower low, an owner high); and the loan's end when
// the owner comes back (a high-priority open, or its compute through NVML).
// It depends on small interfaces, so that its decisions are tested without
// root against fakes.
package lending

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/deviceplugin"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/workload"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Ledger is what the lender reads of GPU occupancy (*occupancy.Ledger).
type Ledger interface {
	Snapshot(now time.Time) occupancy.Snapshot
	Holders(gpu int) []occupancy.ProcInfo
	Has(pid int) (occupancy.ProcInfo, bool)
}

// Classes is the registry of workload classes (*workload.Registry).
type Classes interface {
	Lookup(info occupancy.ProcInfo) (workload.Workload, bool)
	PodByName(namespace, name string) (workload.Workload, bool)
	// Override forces a pod's class; "" removes the override.
	Override(podUID string, p occupancy.Priority)
}

// Gate is the controller of the kernel gate (*gate.Controller).
type Gate interface {
	// Sync pushes the GPUs' policy (loans included) to the kernel now.
	Sync()
	// PreemptLow preempts a GPU's low-priority holders for by.
	PreemptLow(gpu int, by occupancy.ProcInfo, reason string, decided time.Time) int
	// Preempt preempts the given holders whatever their class; it returns
	// how many it had not preempted already.
	Preempt(gpu int, by occupancy.ProcInfo, holders []occupancy.ProcInfo, reason string) int
}

// PodResources lists the devices kubelet allocated, by resource name.
type PodResources interface {
	List(ctx context.Context) (map[string][]deviceplugin.PodDevices, error)
}

// Pods is the API server's view of this node's pods (nil without one).
type Pods interface {
	Requesting(resource corev1.ResourceName) []*corev1.Pod
}

// Events posts Events on pods (nil without an API server).
type Events interface {
	Create(ctx context.Context, w workload.Workload, typ, reason, msg string)
}

// Config is what the lender is told.
type Config struct {
	Resource      string // the lent resource, gpud.io/idle-gpu
	OwnerResource string // the resource through which owners hold GPUs, e.g. nvidia.com/gpu
	LendFree      bool   // lend GPUs nobody holds, not only idle ones
	DevDir        string // gpud's view of the device nodes
	HostDevDir    string // the host's, for a gpud in a pod; "" = DevDir
	// CDIKind names lent GPUs to a CDI-enabled runtime as CDIKind=<UUID>
	// (NVIDIA's kind is nvidia.com/gpu); "" gives no CDI device.
	CDIKind string
	GPUs    []occupancy.GPU
	// MinFreeMemory: a GPU is lendable only with this much memory free
	// (bytes; not applied where NVML does not report memory).
	MinFreeMemory uint64
}

// OwnerMemoryGrowth is how much an owner's GPU memory may grow during a
// loan before the GPU is taken back: an owner allocating is working again,
// and the memory it needs may be what the borrower holds. Smaller changes
// are a driver's own bookkeeping.
const OwnerMemoryGrowth = 64 << 20

// Lender is the device plugin's backend (deviceplugin.Backend) and the
// bookkeeping of owners and borrowers.
type Lender struct {
	deviceplugin.Notifier
	cfg          Config
	ledger       Ledger
	classes      Classes
	gate         Gate
	podResources PodResources
	// ProcInfo identifies a process NVML names that the ledger does not hold.
	ProcInfo func(pid int) (occupancy.ProcInfo, error)
	// Changed is called when owners or borrowers changed: holders are
	// reclassified and the state file rewritten.
	Changed func()
	Pods    Pods   // optional
	Events  Events // optional
	// CDI says which CDI devices the node's specs define; nil names every
	// lent GPU by CDI (tests).
	CDI *CDISpecs
	// Suspended, when set, tells whether gpud froze a pod's workload and
	// keeps it frozen (the executor's SuspendedPod): a borrower suspended
	// at a take-back is lent its GPU again when the owner idles (Relend).
	Suspended func(podUID string) bool
	// Shared, when set, reports whether a GPU is shared by memory (DRA
	// claims): such a GPU is never lent whole.
	Shared func(gpu int) bool
	Log    *slog.Logger

	kick      chan struct{}
	refreshMu sync.Mutex // one refresh at a time (run's ticker, and after Allocate)
	mu        sync.Mutex
	last      map[string]bool     // device ID → healthy, as last listed
	owners    map[int]podRef      // GPU → owner pod (PodResources)
	borrowers map[int]podRef      // GPU → borrower pod (PodResources)
	pending   map[int]time.Time   // GPU → allocated, borrower not yet seen in PodResources
	overrides map[string]struct{} // pod uids whose class the lender forced
	reported  map[string]bool     // pods reported running without their lent GPU
	// takenBack: GPUs whose loan a high-priority open or the owner's
	// activity ended; the borrower may still be listed (eviction takes
	// seconds) but its opens are refused again, until a new Allocate.
	takenBack map[int]bool
	// ownerMemory: each lent GPU's owner memory when the loan was first
	// seen, the base of the growth that takes it back.
	ownerMemory map[int]uint64

	Unallocated atomic.Uint64 // pods reported running without their lent GPU

	synced     chan struct{} // closed at the first successful PodResources read
	syncedOnce sync.Once
}

// Synced is closed once the lender has read PodResources: from then on it
// knows the loans.
func (l *Lender) Synced() <-chan struct{} {
	if l == nil {
		return nil // no lending: no loans to wait for
	}
	return l.synced
}

type podRef struct {
	Namespace, Name, UID string
}

func (p podRef) String() string {
	if p.Name == "" {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

// New returns a lender; Changed, ProcInfo, Pods, Events and Log may be
// set before Run.
func New(cfg Config, ledger Ledger, classes Classes, gate Gate, pr PodResources) *Lender {
	return &Lender{cfg: cfg, ledger: ledger, classes: classes, gate: gate, podResources: pr,
		Log: slog.Default(), kick: make(chan struct{}, 1), synced: make(chan struct{}), last: map[string]bool{}, owners: map[int]podRef{}, borrowers: map[int]podRef{},
		pending: map[int]time.Time{}, overrides: map[string]struct{}{}, reported: map[string]bool{}, takenBack: map[int]bool{},
		ownerMemory: map[int]uint64{}}
}

// Resource is the lent resource's name.
func (l *Lender) Resource() string { return l.cfg.Resource }

// deviceID names GPU g to kubelet: its UUID when NVML gave one, as
// NVIDIA's plugin names it (PodResources readers, such as monitoring
// agents, then see the same name for the GPU under both resources), else
// gpu-N after its node /dev/nvidiaN.
func deviceID(g occupancy.GPU) string {
	if validUUID(g.UUID) {
		return g.UUID
	}
	return indexID(g)
}

// indexID is gpud's own name of a GPU, gpu-N: the device ID without NVML.
func indexID(g occupancy.GPU) string { return "gpu-" + strconv.Itoa(g.Index) }

// gpuOfDevice maps a device ID of the lent resource back to a GPU index:
// the UUID or gpu-N, whichever this gpud or an earlier one (with or
// without NVML) listed; kubelet keeps the IDs of running pods across
// gpud restarts.
func (l *Lender) gpuOfDevice(id string) (int, bool) {
	for _, g := range l.cfg.GPUs {
		if (g.UUID != "" && id == g.UUID) || id == indexID(g) {
			return g.Index, true
		}
	}
	return 0, false
}

// validUUID: a UUID gpud may use as a device ID, an environment value and
// a CDI device name (letters, digits and -, bounded), whatever NVML said.
func validUUID(u string) bool {
	if u == "" || len(u) > 128 {
		return false
	}
	for _, c := range u {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// lendable reports whether a GPU in this state may be lent now.
func (l *Lender) lendable(g occupancy.GPUView) bool { return l.notLendable(g) == "" }

// notLendable says why a GPU may not be lent now; "" when it may.
func (l *Lender) notLendable(g occupancy.GPUView) string {
	switch {
	case l.Shared != nil && l.Shared(g.Index):
		return "shared by memory (DRA): never lent whole"
	case g.Health.Unhealthy:
		return "unhealthy: " + g.Health.Reason
	case l.cfg.MinFreeMemory > 0 && g.Memory != nil && g.Memory.Free() < l.cfg.MinFreeMemory:
		return fmt.Sprintf("%d MiB free, below the floor of %d MiB", g.Memory.Free()>>20, l.cfg.MinFreeMemory>>20)
	case g.State == occupancy.Idle || (l.cfg.LendFree && g.State == occupancy.Free):
		return ""
	case g.State == occupancy.Free:
		return "nobody holds it (lending free GPUs is off)"
	default:
		return "its holders are active"
	}
}

func (l *Lender) Devices() []deviceplugin.Device {
	snap := l.ledger.Snapshot(time.Now())
	var out []deviceplugin.Device
	for _, g := range snap.GPUs {
		out = append(out, deviceplugin.Device{ID: deviceID(g.GPU), Healthy: l.lendable(g)})
	}
	return out
}

// LedgerChanged is the ledger's change hook: it never blocks, and the
// work is done (coalesced) by run. A nil Lender (no lending) ignores it.
func (l *Lender) LedgerChanged() {
	if l == nil {
		return
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// changed re-lists when a GPU's lendability changed.
func (l *Lender) changed() {
	devs := l.Devices()
	l.mu.Lock()
	diff := false
	for _, d := range devs {
		if h, ok := l.last[d.ID]; !ok || h != d.Healthy {
			l.last[d.ID] = d.Healthy
			diff = true
		}
	}
	l.mu.Unlock()
	if diff {
		l.Notify()
	}
}

// Preferred: the longest-idle GPUs first.
func (l *Lender) Preferred(available, mustInclude []string, size int) []string {
	snap := l.ledger.Snapshot(time.Now())
	since := map[string]time.Time{}
	for _, g := range snap.GPUs {
		since[deviceID(g.GPU)] = g.LastActive
	}
	ordered := slices.Clone(available)
	sort.SliceStable(ordered, func(i, j int) bool { return since[ordered[i]].Before(since[ordered[j]]) })
	return deviceplugin.Pick(ordered, mustInclude, size)
}

// controlNodes are the NVIDIA driver's shared nodes a container needs
// besides its GPU's own node; those that exist in the device dir are passed.
var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}

// Allocate lends GPUs that are lendable now; a GPU that stopped being
// lendable since the last list is refused, never silently granted.
func (l *Lender) Allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	snap := l.ledger.Snapshot(time.Now())
	byIdx := map[int]occupancy.GPUView{}
	for _, g := range snap.GPUs {
		byIdx[g.Index] = g
	}
	var r pluginapi.ContainerAllocateResponse
	r.Envs = map[string]string{}
	var visible, indexes, owners []string
	for _, id := range ids {
		idx, ok := l.gpuOfDevice(id)
		g, known := byIdx[idx]
		if !ok || !known {
			return nil, fmt.Errorf("%w: unknown device %q", deviceplugin.ErrRefused, id)
		}
		if !l.lendable(g) {
			return nil, fmt.Errorf("%w: GPU %d is no longer lendable (%s since the last list)", deviceplugin.ErrRefused, idx, g.State)
		}
		r.Devices = l.deviceSpecs(r.Devices, g.GPU) // a MIG slice: its parent's node and its capability node
		visible = append(visible, visibleName(g.GPU))
		// A CDI-enabled runtime (the GPU Operator's default since 25.10)
		// injects the driver's libraries for the device NVIDIA's spec
		// names by UUID; a runtime without CDI ignores the field, but one
		// with CDI and no spec for it refuses the container: named only
		// when a spec defines it.
		if l.cfg.CDIKind != "" && validUUID(g.UUID) {
			if l.CDI == nil || l.CDI.Has(l.cfg.CDIKind, g.UUID) {
				r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: l.cfg.CDIKind + "=" + g.UUID})
			} else {
				l.Log.Info("no CDI spec defines the lent GPU: the borrower gets its device node and NVIDIA_VISIBLE_DEVICES only",
					"gpu", idx, "cdi_device", l.cfg.CDIKind+"="+g.UUID, "spec_dirs", l.CDI.Dirs)
			}
		}
		indexes = append(indexes, strconv.Itoa(idx))
		owners = append(owners, l.ownerOf(idx, g))
		l.mu.Lock()
		l.pending[idx] = time.Now()
		delete(l.takenBack, idx)
		l.mu.Unlock()
	}
	for _, n := range controlNodes {
		p := filepath.Join(l.cfg.DevDir, n)
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			r.Devices = append(r.Devices, &pluginapi.DeviceSpec{HostPath: l.hostPath(p), ContainerPath: "/dev/" + n, Permissions: "rw"})
		}
	}
	r.Envs["NVIDIA_VISIBLE_DEVICES"] = strings.Join(visible, ",")
	r.Envs["GPUD_GPU"] = strings.Join(indexes, ",")
	r.Envs["GPUD_OWNER"] = strings.Join(owners, ",")
	l.Log.Info("lending GPUs", "gpus", indexes, "owners", owners)
	// The gate learns of the loan before kubelet starts the borrower (it
	// does so only once Allocate returns): otherwise the borrower's first
	// open could meet the owner's idle hold still counted as high.
	l.gate.Sync()
	go l.refresh(context.Background()) // the borrower shows in PodResources once admitted
	return &r, nil
}

// visibleName names a GPU in NVIDIA_VISIBLE_DEVICES, which NVIDIA's
// runtime reads as a UUID or an NVML index: the UUID, else NVML's index,
// else (no NVML) gpud's index, the same number on most machines.
func visibleName(g occupancy.GPU) string {
	switch {
	case validUUID(g.UUID):
		return g.UUID
	case g.NVMLIndex != nil:
		return strconv.Itoa(*g.NVMLIndex)
	}
	return strconv.Itoa(g.Index)
}

// hostPath turns a node in gpud's --dev-dir into its path on the host
// (--host-dev-dir): in a pod gpud sees the host's /dev elsewhere.
func (l *Lender) hostPath(p string) string {
	if l.cfg.HostDevDir == "" {
		return p
	}
	return filepath.Join(l.cfg.HostDevDir, filepath.Base(p))
}

// ownerOf names a GPU's owner: the pod holding it through the owner
// resource, else the workload that held it when it went idle.
func (l *Lender) ownerOf(idx int, g occupancy.GPUView) string {
	l.mu.Lock()
	o := l.owners[idx]
	l.mu.Unlock()
	if o.Name != "" {
		return o.String()
	}
	for _, h := range g.Holders {
		if w, ok := l.classes.Lookup(h.ProcInfo); ok && w.PodUID != "" {
			return w.Namespace + "/" + w.Name
		}
		if h.ContainerID != "" {
			return "container/" + shortID(h.ContainerID)
		}
	}
	return ""
}

// refresh reads owners and borrowers from PodResources and forces their
// classes: a borrower is low priority whatever its label, an owner high
// (so that the owner's open preempts its borrower through the rules).
func (l *Lender) refresh(ctx context.Context) {
	l.refreshMu.Lock()
	defer l.refreshMu.Unlock()
	alloc, err := l.podResources.List(ctx)
	if err != nil {
		l.Log.Debug("pod resources", "error", err)
		return
	}
	defer l.syncedOnce.Do(func() { close(l.synced) })
	owners, borrowers := map[int]podRef{}, map[int]podRef{}
	for _, p := range alloc[l.cfg.Resource] {
		for _, id := range p.DeviceIDs {
			if idx, ok := l.gpuOfDevice(id); ok {
				borrowers[idx] = l.ref(p)
			}
		}
	}
	for _, p := range alloc[l.cfg.OwnerResource] {
		for _, id := range p.DeviceIDs {
			if idx, ok := l.gpuOfOwnerDevice(id); ok {
				owners[idx] = l.ref(p)
			}
		}
	}
	forced := map[string]occupancy.Priority{}
	for _, o := range owners {
		if o.UID != "" {
			forced[o.UID] = occupancy.High
		}
	}
	for _, b := range borrowers {
		if b.UID != "" {
			forced[b.UID] = occupancy.Low
		}
	}
	l.mu.Lock()
	changed := !mapsEqual(owners, l.owners) || !mapsEqual(borrowers, l.borrowers)
	l.owners, l.borrowers = owners, borrowers
	// A pending loan stays until it expires: PodResources can still list the
	// previous borrower, or not list the new one yet, while it is admitted.
	for idx, t := range l.pending {
		if time.Since(t) > 30*time.Second {
			delete(l.pending, idx)
		}
	}
	for idx := range l.takenBack {
		if _, ok := l.borrowers[idx]; !ok {
			if _, ok := l.pending[idx]; !ok {
				delete(l.takenBack, idx) // the borrower is gone: nothing left to refuse
			}
		}
	}
	var clear []string
	for uid := range l.overrides {
		if _, ok := forced[uid]; !ok {
			clear = append(clear, uid)
			delete(l.overrides, uid)
		}
	}
	for uid := range forced {
		l.overrides[uid] = struct{}{}
	}
	l.mu.Unlock()
	for _, uid := range clear {
		l.classes.Override(uid, "")
	}
	for uid, p := range forced {
		l.classes.Override(uid, p)
	}
	if changed && l.Changed != nil {
		l.Changed()
	}
	l.reportUnallocated(alloc[l.cfg.Resource])
}

// reportUnallocated reports, once each, running pods that ask for the lent
// resource but hold none of its devices: kubelet starts a pod admitted
// before the plugin registered without the device, and does not fail it.
func (l *Lender) reportUnallocated(allocated []deviceplugin.PodDevices) {
	if l.Pods == nil {
		return
	}
	has := map[string]bool{}
	for _, p := range allocated {
		has[p.Namespace+"/"+p.Name] = true
	}
	for _, pod := range l.Pods.Requesting(corev1.ResourceName(l.cfg.Resource)) {
		uid := string(pod.UID)
		if has[pod.Namespace+"/"+pod.Name] || l.reported[uid] {
			continue
		}
		l.reported[uid] = true
		l.Unallocated.Add(1)
		l.Log.Warn("pod runs without the GPU it asked for: admitted before gpud registered",
			"pod", pod.Namespace+"/"+pod.Name, "resource", l.cfg.Resource)
		if l.Events != nil {
			w := workload.Workload{PodUID: uid, Namespace: pod.Namespace, Name: pod.Name}
			l.Events.Create(context.Background(), w, corev1.EventTypeWarning, "GPUNotAllocated",
				fmt.Sprintf("this pod asked for %s but runs without it: it was admitted before gpud's device plugin registered; delete it to get a GPU", l.cfg.Resource))
		}
	}
}

func (l *Lender) ref(p deviceplugin.PodDevices) podRef {
	r := podRef{Namespace: p.Namespace, Name: p.Name}
	if w, ok := l.classes.PodByName(p.Namespace, p.Name); ok {
		r.UID = w.PodUID
	}
	return r
}

// gpuOfOwnerDevice maps another plugin's device ID to a GPU: NVIDIA's
// plugin uses GPU UUIDs (its default device-id-strategy), and with
// time-slicing or MPS sharing replica IDs "UUID::n" (every replica is that
// GPU); its index strategy uses NVML's index, which is gpud's own only
// when NVML is unavailable; "nvidiaN" and gpu-N name the node.
func (l *Lender) gpuOfOwnerDevice(id string) (int, bool) {
	if uuid, replica, ok := strings.Cut(id, "::"); ok && uuid != "" && replica != "" {
		id = uuid
	}
	for _, g := range l.cfg.GPUs {
		index := g.Index
		if g.NVMLIndex != nil {
			index = *g.NVMLIndex
		}
		if (g.UUID != "" && id == g.UUID) || id == strconv.Itoa(index) || id == "nvidia"+strconv.Itoa(g.Index) || id == indexID(g) {
			return g.Index, true
		}
	}
	return 0, false
}

func mapsEqual(a, b map[int]podRef) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Activity handles NVML's report of the processes using a GPU: when the
// owner of a lent GPU uses it again, its borrower is preempted, as when the
// owner opens it (the owner asks for its GPU back).
func (l *Lender) Activity(gpu int, pids []uint32) {
	if !l.IsLent(gpu) {
		return
	}
	l.mu.Lock()
	owner := l.owners[gpu]
	l.mu.Unlock()
	if owner.UID == "" {
		return
	}
	for _, pid := range pids {
		if info, ok := l.ownerProcess(pid, owner); ok {
			l.ownerBack(gpu, owner, info, fmt.Sprintf("the owner is active on GPU %d again", gpu))
			return
		}
	}
}

// Memory takes a lent GPU back when its owner's GPU memory (NVML's
// process list, by PID) grew by more than OwnerMemoryGrowth since the loan
// began.
func (l *Lender) Memory(gpu int, byPID map[uint32]uint64) {
	if !l.IsLent(gpu) {
		l.mu.Lock()
		delete(l.ownerMemory, gpu)
		l.mu.Unlock()
		return
	}
	l.mu.Lock()
	owner := l.owners[gpu]
	l.mu.Unlock()
	if owner.UID == "" {
		return
	}
	var sum uint64
	var who occupancy.ProcInfo
	for pid, b := range byPID {
		if info, ok := l.ownerProcess(pid, owner); ok {
			sum += b
			who = info
		}
	}
	l.mu.Lock()
	base, known := l.ownerMemory[gpu]
	if !known {
		l.ownerMemory[gpu] = sum
	}
	l.mu.Unlock()
	if known && sum > base+OwnerMemoryGrowth {
		l.ownerBack(gpu, owner, who, fmt.Sprintf("the owner's GPU memory on GPU %d grew from %d to %d MiB", gpu, base>>20, sum>>20))
	}
}

// ownerProcess identifies pid and reports whether it is owner's.
func (l *Lender) ownerProcess(pid uint32, owner podRef) (occupancy.ProcInfo, bool) {
	info, ok := l.ledger.Has(int(pid))
	if !ok {
		if l.ProcInfo == nil {
			return info, false
		}
		var err error
		if info, err = l.ProcInfo(int(pid)); err != nil {
			return info, false
		}
	}
	return info, info.PodUID == owner.UID
}

// ownerBack ends gpu's loan because its owner (process info) works on it
// again, and preempts the borrower.
func (l *Lender) ownerBack(gpu int, owner podRef, info occupancy.ProcInfo, why string) {
	l.TakeBack(gpu)
	if l.gate.PreemptLow(gpu, info, why, time.Now()) > 0 {
		l.Log.Info("owner back on its lent GPU: taking it back", "gpu", gpu, "owner", owner.String(), "pid", info.PID, "why", why)
	} else {
		// reclaimTakenBack preempts the borrower once its class is known.
		l.Log.Debug("owner back on its lent GPU: no low holder yet", "gpu", gpu, "owner", owner.String(),
			"holders", holderClasses(l.ledger.Holders(gpu)))
	}
}

// holderClasses lists holders as pid/pod/class, for debug logs.
func holderClasses(hs []occupancy.ProcInfo) []string {
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		out = append(out, fmt.Sprintf("%d/%s/%s", h.PID, h.PodUID, h.Priority))
	}
	return out
}

// reclaimTakenBack preempts whatever of a borrower still holds, beside its
// owner, a GPU whose loan was taken back. The take-back itself preempts only the holders
// classified low at that instant; a borrower whose class reached gpud
// later (its pod seen by the informer, or PodResources listing it, after
// the owner came back) would otherwise keep the GPU beside its owner.
// Called every second and after each change of owners or borrowers; the
// executor never kills a process twice.
func (l *Lender) reclaimTakenBack() {
	type job struct {
		gpu      int
		owner    string
		borrower string
	}
	var jobs []job
	l.mu.Lock()
	for gpu, taken := range l.takenBack {
		if taken {
			jobs = append(jobs, job{gpu, l.owners[gpu].UID, l.borrowers[gpu].UID})
		}
	}
	l.mu.Unlock()
	for _, j := range jobs {
		var victims []occupancy.ProcInfo
		var pre occupancy.ProcInfo // the owner's holder, else another high one
		for _, h := range l.ledger.Holders(j.gpu) {
			switch {
			case j.owner != "" && h.PodUID == j.owner:
				pre = h
			case h.Priority == occupancy.High:
				if pre.PID == 0 {
					pre = h
				}
			case h.Priority == occupancy.Low || (j.borrower != "" && h.PodUID == j.borrower):
				victims = append(victims, h)
			}
		}
		// Only against a holder of high priority: once the owner has let
		// go, a low holder is the rules' to allow, not a loan to end.
		if pre.PID == 0 || len(victims) == 0 {
			continue
		}
		if n := l.gate.Preempt(j.gpu, pre, victims, fmt.Sprintf("GPU %d was taken back by its owner", j.gpu)); n > 0 {
			l.Log.Info("borrower still holds a GPU taken back: preempting it", "gpu", j.gpu, "holders", n)
		}
	}
}

// relendSuspended lends a GPU taken back again to its borrower when the
// rule says (preempt.Relend: the owner idle again, the borrower still
// suspended, the GPU healthy); the gate's sync then thaws the borrower (a
// lent GPU's idle owner does not hold it for the rules). The owner coming
// back again takes it back again, and the borrower is frozen again.
func (l *Lender) relendSuspended() {
	if l.Suspended == nil {
		return
	}
	type loan struct {
		gpu      int
		borrower podRef
	}
	var taken []loan
	l.mu.Lock()
	for gpu, t := range l.takenBack {
		if b, ok := l.borrowers[gpu]; t && ok && b.UID != "" {
			taken = append(taken, loan{gpu, b})
		}
	}
	l.mu.Unlock()
	if len(taken) == 0 {
		return
	}
	views := map[int]occupancy.GPUView{}
	for _, g := range l.ledger.Snapshot(time.Now()).GPUs {
		views[g.Index] = g
	}
	relent := 0
	for _, t := range taken {
		g, ok := views[t.gpu]
		s := preempt.LoanBack{OwnerIdle: ok && g.State == occupancy.Idle, Healthy: ok && !g.Health.Unhealthy,
			BorrowerSuspended: l.Suspended(t.borrower.UID)}
		if !preempt.Relend(s) {
			continue
		}
		l.mu.Lock()
		if b, ok := l.borrowers[t.gpu]; l.takenBack[t.gpu] && ok && b == t.borrower {
			delete(l.takenBack, t.gpu)
			delete(l.ownerMemory, t.gpu) // the growth that takes it back is counted from now
			relent++
			l.Log.Info("owner idle again: GPU lent again to its suspended borrower", "gpu", t.gpu,
				"borrower", t.borrower.String(), "owner", l.owners[t.gpu].String())
		}
		l.mu.Unlock()
	}
	if relent == 0 {
		return
	}
	l.gate.Sync()
	if l.Changed != nil {
		l.Changed()
	}
}

// TakeBack ends gpu's loan, if any: a high-priority process opened it or
// its owner is active on it again.
func (l *Lender) TakeBack(gpu int) {
	l.mu.Lock()
	_, borrowed := l.borrowers[gpu]
	_, pending := l.pending[gpu]
	l.mu.Unlock()
	if pending && !borrowed {
		// The borrower can be running before PodResources was read since
		// its admission (the tick is 1 s): read it now, so that the
		// borrower is classified low and preempted with this take-back.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		l.refresh(ctx)
		cancel()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, borrowed = l.borrowers[gpu]
	_, pending = l.pending[gpu]
	if (borrowed || pending) && !l.takenBack[gpu] {
		l.takenBack[gpu] = true
		delete(l.pending, gpu)
		l.Log.Info("loan ended: the GPU is its owner's again", "gpu", gpu, "borrower", l.borrowers[gpu].String())
	}
}

// IsLent reports whether gpu is lent (allocated to a borrower, or about to be).
func (l *Lender) IsLent(gpu int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.takenBack[gpu] {
		return false
	}
	if _, ok := l.borrowers[gpu]; ok {
		return true
	}
	t, ok := l.pending[gpu]
	return ok && time.Since(t) < 30*time.Second
}

// Decorate shows loans in the state file: state lent, owner, borrower;
// and whether each GPU may be lent, or why not. A nil Lender (no lending)
// shows nothing.
func (l *Lender) Decorate(f *v1.StateFile) {
	if l == nil {
		return
	}
	why := map[int]string{}
	for _, g := range l.ledger.Snapshot(time.Now()).GPUs {
		why[g.Index] = l.notLendable(g)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range f.GPUs {
		g := &f.GPUs[i]
		lendable := why[g.Index] == ""
		g.Lendable, g.NotLendable = &lendable, why[g.Index]
		if o := l.owners[g.Index]; o.Name != "" {
			g.Owner = o.String()
		}
		if b := l.borrowers[g.Index]; b.Name != "" {
			g.Borrower = b.String()
			g.State = occupancy.Lent
		}
	}
}

// Run keeps owners and borrowers current and the device list in step.
func (l *Lender) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
			l.changed()
		case <-t.C:
			l.refresh(ctx)
			l.changed()
			l.reclaimTakenBack()
			l.relendSuspended()
		}
	}
}

// Role says what lending made of a pod: the borrower of a lent GPU, or
// the owner of one.
func (l *Lender) Role(podUID string) (gpu int, role string, ok bool) {
	if podUID == "" {
		return 0, "", false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for g, b := range l.borrowers {
		if b.UID == podUID {
			return g, "borrower", true
		}
	}
	for g, o := range l.owners {
		if o.UID == podUID {
			return g, "owner", true
		}
	}
	return 0, "", false
}

// Socket lists PodResources from kubelet's socket at a path.
type Socket string

// List implements PodResources.
func (s Socket) List(ctx context.Context) (map[string][]deviceplugin.PodDevices, error) {
	return deviceplugin.ListAllocated(ctx, string(s))
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
