package daemon

import (
	"context"
	"fmt"
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
	"github.com/gpud/gpud/internal/workload/kube"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// lender is the device plugin's backend (patent claim 1's lending): one
// device per physical GPU, Healthy while the GPU is lendable, and the
// bookkeeping of owners and borrowers from kubelet's PodResources.
type lender struct {
	deviceplugin.Notifier
	d             *Daemon
	resource      string // gpud.io/idle-gpu
	ownerResource string // the resource through which owners hold GPUs, e.g. nvidia.com/gpu
	podResources  string // kubelet's pod-resources socket
	lendFree      bool

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

	unallocated atomic.Uint64 // pods reported so
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

func newLender(d *Daemon, resource, ownerResource, podResources string, lendFree bool) *lender {
	return &lender{d: d, resource: resource, ownerResource: ownerResource, podResources: podResources,
		lendFree: lendFree, kick: make(chan struct{}, 1), last: map[string]bool{}, owners: map[int]podRef{}, borrowers: map[int]podRef{},
		pending: map[int]time.Time{}, overrides: map[string]struct{}{}, reported: map[string]bool{}, takenBack: map[int]bool{}}
}

// deviceID names GPU g to kubelet.
func deviceID(g occupancy.GPU) string { return "gpu-" + strconv.Itoa(g.Index) }

func gpuOfDevice(id string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "gpu-"))
	return n, err == nil && strings.HasPrefix(id, "gpu-")
}

// lendable reports whether a GPU in this state may be lent now.
func (l *lender) lendable(g occupancy.GPUView) bool {
	return g.State == occupancy.Idle || (l.lendFree && g.State == occupancy.Free)
}

func (l *lender) Devices() []deviceplugin.Device {
	snap := l.d.ledger.Snapshot(time.Now())
	var out []deviceplugin.Device
	for _, g := range snap.GPUs {
		out = append(out, deviceplugin.Device{ID: deviceID(g.GPU), Healthy: l.lendable(g)})
	}
	return out
}

// ledgerChanged is the ledger's change hook: it never blocks, and the
// work is done (coalesced) by run.
func (l *lender) ledgerChanged() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// changed re-lists when a GPU's lendability changed.
func (l *lender) changed() {
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
func (l *lender) Preferred(available, mustInclude []string, size int) []string {
	snap := l.d.ledger.Snapshot(time.Now())
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
func (l *lender) Allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	snap := l.d.ledger.Snapshot(time.Now())
	byIdx := map[int]occupancy.GPUView{}
	for _, g := range snap.GPUs {
		byIdx[g.Index] = g
	}
	var r pluginapi.ContainerAllocateResponse
	r.Envs = map[string]string{}
	var visible, indexes, owners []string
	for _, id := range ids {
		idx, ok := gpuOfDevice(id)
		g, known := byIdx[idx]
		if !ok || !known {
			return nil, fmt.Errorf("%w: unknown device %q", deviceplugin.ErrRefused, id)
		}
		if !l.lendable(g) {
			return nil, fmt.Errorf("%w: GPU %d is no longer lendable (%s since the last list)", deviceplugin.ErrRefused, idx, g.State)
		}
		r.Devices = append(r.Devices, &pluginapi.DeviceSpec{
			HostPath: l.hostPath(g.Device), ContainerPath: "/dev/nvidia" + strconv.Itoa(idx), Permissions: "rw"})
		if g.UUID != "" {
			visible = append(visible, g.UUID)
		} else {
			visible = append(visible, strconv.Itoa(idx))
		}
		indexes = append(indexes, strconv.Itoa(idx))
		owners = append(owners, l.ownerOf(idx, g))
		// claim 6: the task last preempted from this GPU and not resumed yet
		// gets its checkpoint directory back (kubelet does not tell Allocate
		// which pod asks).
		if task := l.resumableTask(idx); task != "" && l.d.cfg.CheckpointRoot != "" {
			if dir, err := preempt.TaskDir(l.d.cfg.CheckpointRoot, task); err == nil {
				r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: "/gpud-checkpoint", HostPath: dir})
				r.Envs["GPUD_RESUME_FROM"] = "/gpud-checkpoint"
			}
		}
		l.mu.Lock()
		l.pending[idx] = time.Now()
		delete(l.takenBack, idx)
		l.mu.Unlock()
	}
	for _, n := range controlNodes {
		p := filepath.Join(l.d.cfg.DevDir, n)
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			r.Devices = append(r.Devices, &pluginapi.DeviceSpec{HostPath: l.hostPath(p), ContainerPath: "/dev/" + n, Permissions: "rw"})
		}
	}
	r.Envs["NVIDIA_VISIBLE_DEVICES"] = strings.Join(visible, ",")
	r.Envs["GPUD_GPU"] = strings.Join(indexes, ",")
	r.Envs["GPUD_OWNER"] = strings.Join(owners, ",")
	l.d.log.Info("lending GPUs", "gpus", indexes, "owners", owners)
	// The gate learns of the loan before kubelet starts the borrower (it
	// does so only once Allocate returns): otherwise the borrower's first
	// open could meet the owner's idle hold still counted as high.
	l.d.enforcer.sync()
	go l.refresh(context.Background()) // the borrower shows in PodResources once admitted
	return &r, nil
}

// hostPath turns a node in gpud's --dev-dir into its path on the host
// (--host-dev-dir): in a pod gpud sees the host's /dev elsewhere.
func (l *lender) hostPath(p string) string {
	if l.d.cfg.HostDevDir == "" {
		return p
	}
	return filepath.Join(l.d.cfg.HostDevDir, filepath.Base(p))
}

// ownerOf names a GPU's owner: the pod holding it through the owner
// resource, else the workload that held it when it went idle.
func (l *lender) ownerOf(idx int, g occupancy.GPUView) string {
	l.mu.Lock()
	o := l.owners[idx]
	l.mu.Unlock()
	if o.Name != "" {
		return o.String()
	}
	for _, h := range g.Holders {
		if w, ok := l.d.registry.Lookup(h.ProcInfo); ok && w.PodUID != "" {
			return w.Namespace + "/" + w.Name
		}
		if h.ContainerID != "" {
			return "container/" + kube.ShortID(h.ContainerID)
		}
	}
	return ""
}

func (l *lender) resumableTask(gpu int) string {
	recs := l.d.journal.Recent()
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		if r.GPU == gpu && r.Action == preempt.ActionKill && r.Victim.TaskID != "" {
			if r.ResumedAt == nil {
				return r.Victim.TaskID
			}
			return ""
		}
	}
	return ""
}

// refresh reads owners and borrowers from PodResources and forces their
// classes: a borrower is low priority whatever its label, an owner high
// (so that the owner's open preempts its borrower through the rules).
func (l *lender) refresh(ctx context.Context) {
	l.refreshMu.Lock()
	defer l.refreshMu.Unlock()
	alloc, err := deviceplugin.ListAllocated(ctx, l.podResources)
	if err != nil {
		l.d.log.Debug("pod resources", "error", err)
		return
	}
	owners, borrowers := map[int]podRef{}, map[int]podRef{}
	for _, p := range alloc[l.resource] {
		for _, id := range p.DeviceIDs {
			if idx, ok := gpuOfDevice(id); ok {
				borrowers[idx] = l.ref(p)
			}
		}
	}
	for _, p := range alloc[l.ownerResource] {
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
		l.d.registry.Override(uid, "")
	}
	for uid, p := range forced {
		l.d.registry.Override(uid, p)
	}
	if changed {
		l.d.ledger.Reclassify(l.d.registry.ClassifyProc)
		l.d.writer.Kick()
	}
	l.reportUnallocated(alloc[l.resource])
}

// reportUnallocated reports, once each, running pods that ask for the lent
// resource but hold none of its devices: kubelet starts a pod admitted
// before the plugin registered without the device, and does not fail it.
func (l *lender) reportUnallocated(allocated []deviceplugin.PodDevices) {
	if l.d.pods == nil {
		return
	}
	has := map[string]bool{}
	for _, p := range allocated {
		has[p.Namespace+"/"+p.Name] = true
	}
	for _, pod := range l.d.pods.Requesting(corev1.ResourceName(l.resource)) {
		uid := string(pod.UID)
		if has[pod.Namespace+"/"+pod.Name] || l.reported[uid] {
			continue
		}
		l.reported[uid] = true
		l.unallocated.Add(1)
		l.d.log.Warn("pod runs without the GPU it asked for: admitted before gpud registered",
			"pod", pod.Namespace+"/"+pod.Name, "resource", l.resource)
		if l.d.events != nil {
			w := workload.Workload{PodUID: uid, Namespace: pod.Namespace, Name: pod.Name}
			l.d.events.Create(context.Background(), w, corev1.EventTypeWarning, "GPUNotAllocated",
				fmt.Sprintf("this pod asked for %s but runs without it: it was admitted before gpud's device plugin registered; delete it to get a GPU", l.resource))
		}
	}
}

func (l *lender) ref(p deviceplugin.PodDevices) podRef {
	r := podRef{Namespace: p.Namespace, Name: p.Name}
	if w, ok := l.d.registry.PodByName(p.Namespace, p.Name); ok {
		r.UID = w.PodUID
	}
	return r
}

// gpuOfOwnerDevice maps another plugin's device ID to a GPU: NVIDIA's
// plugin uses GPU UUIDs; an index or "nvidiaN" is accepted too.
func (l *lender) gpuOfOwnerDevice(id string) (int, bool) {
	for _, g := range l.d.gpus {
		if (g.UUID != "" && id == g.UUID) || id == strconv.Itoa(g.Index) || id == "nvidia"+strconv.Itoa(g.Index) || id == deviceID(g) {
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

// activity handles NVML's report of the processes using a GPU: when the
// owner of a lent GPU uses it again, its borrower is preempted, as when the
// owner opens it (claim 1: the owner asks for its GPU back).
func (l *lender) activity(gpu int, pids []uint32) {
	if !l.isLent(gpu) {
		return
	}
	l.mu.Lock()
	owner := l.owners[gpu]
	l.mu.Unlock()
	if owner.UID == "" {
		return
	}
	for _, pid := range pids {
		info, ok := l.d.ledger.Has(int(pid))
		if !ok {
			var err error
			if info, err = l.d.tracker.Proc.Info(int(pid)); err != nil {
				continue
			}
		}
		if info.PodUID != owner.UID {
			continue
		}
		l.takeBack(gpu)
		victims := l.d.enforcer.lowHolders(gpu, fmt.Sprintf("the owner is active on GPU %d again", gpu))
		if len(victims) > 0 {
			l.d.log.Info("owner active on its lent GPU: taking it back", "gpu", gpu, "owner", owner.String(), "pid", pid)
			l.d.enforcer.preempt(gpu, info, victims, time.Now())
		} else {
			// reclaimTakenBack preempts the borrower once its class is known.
			l.d.log.Debug("owner active on its lent GPU: no low holder yet", "gpu", gpu, "owner", owner.String(),
				"holders", holderClasses(l.d.ledger.Holders(gpu)))
		}
		return
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
func (l *lender) reclaimTakenBack() {
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
		reason := fmt.Sprintf("GPU %d was taken back by its owner", j.gpu)
		var victims []preempt.Victim
		var pre occupancy.ProcInfo // the owner's holder, else another high one
		for _, h := range l.d.ledger.Holders(j.gpu) {
			switch {
			case j.owner != "" && h.PodUID == j.owner:
				pre = h
			case h.Priority == occupancy.High:
				if pre.PID == 0 {
					pre = h
				}
			case h.Priority == occupancy.Low || (j.borrower != "" && h.PodUID == j.borrower):
				if v := l.d.enforcer.victim(h, reason); !l.d.enforcer.exec.Handled(v) {
					victims = append(victims, v)
				}
			}
		}
		// Only against a holder of high priority: once the owner has let
		// go, a low holder is the rules' to allow, not a loan to end.
		if pre.PID == 0 || len(victims) == 0 {
			continue
		}
		l.d.log.Info("borrower still holds a GPU taken back: preempting it", "gpu", j.gpu, "holders", len(victims))
		l.d.enforcer.preempt(j.gpu, pre, victims, time.Now())
	}
}

// takeBack ends gpu's loan, if any: a high-priority process opened it or
// its owner is active on it again.
func (l *lender) takeBack(gpu int) {
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
		l.d.log.Info("loan ended: the GPU is its owner's again", "gpu", gpu, "borrower", l.borrowers[gpu].String())
	}
}

// isLent reports whether gpu is lent (allocated to a borrower, or about to be).
func (l *lender) isLent(gpu int) bool {
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

// decorate shows loans in the state file: state lent, owner, borrower.
func (l *lender) decorate(f *v1.StateFile) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range f.GPUs {
		g := &f.GPUs[i]
		if o := l.owners[g.Index]; o.Name != "" {
			g.Owner = o.String()
		}
		if b := l.borrowers[g.Index]; b.Name != "" {
			g.Borrower = b.String()
			g.State = occupancy.Lent
		}
	}
}

// run keeps owners and borrowers current and the device list in step.
func (l *lender) run(ctx context.Context) {
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
		}
	}
}
