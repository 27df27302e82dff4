// Package kube follows the pods of this node through the API server: their
// classes (an informer), their reclaim (condition + Eviction) and the Events
// gpud posts on them.
package kube

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/gpud/gpud/internal/workload"

	"github.com/gpud/gpud/internal/cgroups"
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
	Registry   *workload.Registry
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
// holder's cgroup), from the pod's status; "" when unknown (or without an
// API server: a nil Pods).
func (p *Pods) ContainerName(namespace, name, containerID string) string {
	if p == nil {
		return ""
	}
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
	// The handler's own HasSynced: the informer's says the cache is full,
	// not that the handler has put every listed pod in the registry.
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
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
	if err != nil {
		p.Log.Error("watching pods", "error", err)
		return
	}
	f.Start(ctx.Done())
	if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) && p.Synced != nil {
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
	w := workload.Workload{
		PodUID: uid, Namespace: pod.Namespace, Name: pod.Name,
		TaskID: pod.Labels[workload.LabelTaskID], PreemptMode: pod.Labels[workload.LabelPreemptMode],
		LivenessProbe: hasLivenessProbe(pod), LiveLabels: true,
	}
	w.Priority, w.Agent = p.Registry.ClassifyPodPriority(uid, pod.Namespace, pod.Labels, pod.Spec.Priority)
	if w.TaskID == "" {
		w.TaskID = pod.Namespace + "/" + pod.Name
	}
	w.CgroupID = cgroups.PodID(p.CgroupRoot, uid, string(pod.Status.QOSClass))
	// The informer often sees a pod before kubelet makes its cgroup: the
	// kernel then classifies the cgroup as it is made, and the gate judges
	// the pod's first open. Kept for the pod's life (the registry says the
	// class only once; Remove forgets it).
	defer p.Registry.Expect(workload.PodKey(uid), cgroups.PodLeafNames(uid, string(pod.Status.QOSClass)))
	if p.Registry.Holds(w) {
		return
	}
	p.Registry.Put(w)
}

// hasLivenessProbe reports whether a container of pod (init containers
// with restartPolicy Always, sidecars, included) has a liveness probe.
func hasLivenessProbe(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		if c.LivenessProbe != nil {
			return true
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.LivenessProbe != nil {
			return true
		}
	}
	return false
}
