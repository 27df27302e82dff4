package priority

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Pods keeps the registry in step with the pods of one node, watched
// through the API server (an informer limited to spec.nodeName, which is
// also all that the Node authorizer lets a kubelet credential list).
type Pods struct {
	Client     kubernetes.Interface
	Node       string
	Registry   *Registry
	CgroupRoot string
	Log        *slog.Logger
	// Resync re-reads every pod this often, to find pod cgroups that
	// kubelet created after the pod was first seen (default 2s).
	Resync time.Duration
	// Synced, when set, is called once the first listing is in.
	Synced func()

	mu    sync.Mutex
	store cache.Store
}

// ContainerName names a pod's container by its runtime id (as found in a
// holder's cgroup), from the pod's status; "" when unknown.
func (p *Pods) ContainerName(namespace, name, containerID string) string {
	p.mu.Lock()
	store := p.store
	p.mu.Unlock()
	if store == nil || containerID == "" {
		return ""
	}
	obj, ok, err := store.GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return ""
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return ""
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, c := range list {
			if _, id, ok := strings.Cut(c.ContainerID, "://"); ok && id == containerID {
				return c.Name
			}
		}
	}
	return ""
}

// Requesting returns the running pods of the node that ask for resource.
func (p *Pods) Requesting(resource corev1.ResourceName) []*corev1.Pod {
	p.mu.Lock()
	store := p.store
	p.mu.Unlock()
	if store == nil {
		return nil
	}
	var out []*corev1.Pod
	for _, obj := range store.List() {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, c := range pod.Spec.Containers {
			if _, ok := c.Resources.Limits[resource]; ok {
				out = append(out, pod)
				break
			}
			if _, ok := c.Resources.Requests[resource]; ok {
				out = append(out, pod)
				break
			}
		}
	}
	return out
}

// Run watches until ctx ends.
func (p *Pods) Run(ctx context.Context) {
	resync := p.Resync
	if resync == 0 {
		resync = 2 * time.Second
	}
	f := informers.NewSharedInformerFactoryWithOptions(p.Client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + p.Node }))
	inf := f.Core().V1().Pods().Informer()
	p.mu.Lock()
	p.store = inf.GetStore()
	p.mu.Unlock()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.put,
		UpdateFunc: func(_, obj any) { p.put(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				p.Registry.RemovePod(string(pod.UID))
			}
		},
	})
	f.Start(ctx.Done())
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) && p.Synced != nil {
		p.Synced()
	}
	<-ctx.Done()
	f.Shutdown()
}

func (p *Pods) put(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	uid := string(pod.UID)
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		p.Registry.RemovePod(uid)
		return
	}
	w := Workload{
		PodUID: uid, Namespace: pod.Namespace, Name: pod.Name,
		Priority: p.Registry.Classify(podKey(uid), pod.Labels),
		TaskID:   pod.Labels[LabelTaskID],
	}
	if w.TaskID == "" {
		w.TaskID = pod.Namespace + "/" + pod.Name
	}
	w.CgroupID = PodCgroupID(p.CgroupRoot, uid, pod.Status.QOSClass)
	if old, ok := p.Registry.Lookup(occupancyInfoForPod(uid)); ok && old == w {
		return
	}
	p.Registry.Put(w)
}

// PodCgroupPaths returns where kubelet puts a pod's cgroup, under the cgroup
// v2 root, for the cgroupfs and the systemd drivers.
func PodCgroupPaths(uid string, qos corev1.PodQOSClass) []string {
	if !cgroups.ValidPodUID(uid) {
		return nil // a path built from "../x" would name another cgroup
	}
	q := strings.ToLower(string(qos))
	under := uid
	systemd := "kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
	var out []string
	switch qos {
	case corev1.PodQOSBurstable, corev1.PodQOSBestEffort:
		out = append(out,
			filepath.Join("kubepods", q, "pod"+under),
			filepath.Join("kubepods.slice", "kubepods-"+q+".slice", "kubepods-"+q+"-pod"+strings.ReplaceAll(uid, "-", "_")+".slice"))
	default: // Guaranteed, or not yet known
		out = append(out, filepath.Join("kubepods", "pod"+under), filepath.Join("kubepods.slice", systemd))
		if qos == "" {
			for _, c := range []corev1.PodQOSClass{corev1.PodQOSBurstable, corev1.PodQOSBestEffort} {
				out = append(out, PodCgroupPaths(uid, c)...)
			}
		}
	}
	return out
}

// PodCgroupID returns the cgroup v2 id of a pod's cgroup, 0 while it does not exist.
func PodCgroupID(root, uid string, qos corev1.PodQOSClass) uint64 {
	for _, p := range PodCgroupPaths(uid, qos) {
		if id, err := cgroups.ID(filepath.Join(root, p)); err == nil {
			return id
		}
	}
	return 0
}

func occupancyInfoForPod(uid string) occupancy.ProcInfo { return occupancy.ProcInfo{PodUID: uid} }
