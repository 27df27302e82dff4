package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const (
	thisNode  = "node-a"
	otherNode = "node-b"
	gpuRes    = corev1.ResourceName("nvidia.com/gpu")
)

var (
	podsGVR = corev1.SchemeGroupVersion.WithResource("pods")
	podsGVK = corev1.SchemeGroupVersion.WithKind("Pod")
)

// uid returns a valid pod UID (cgroups.PodPaths refuses anything else).
func uid(n int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", n, n) }

func newPod(ns, name, id, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(id), Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// podFields is what the API server lets a pod list select on (the subset
// gpud may use).
func podFields(p *corev1.Pod) fields.Set {
	return fields.Set{"spec.nodeName": p.Spec.NodeName, "metadata.name": p.Name, "metadata.namespace": p.Namespace}
}

// podSelector parses a pod field selector as the API server would: a field
// it does not support is an error, not "match everything".
func podSelector(s string) (fields.Selector, error) {
	sel, err := fields.ParseSelector(s)
	if err != nil {
		return nil, err
	}
	for _, r := range sel.Requirements() {
		if _, ok := podFields(&corev1.Pod{})[r.Field]; !ok {
			return nil, fmt.Errorf("field label not supported: %s", r.Field)
		}
	}
	return sel, nil
}

// newNodeClient returns a fake clientset that, like the API server and
// unlike the plain fake, applies field selectors to pod lists and watches:
// without that, a test of "only this node's pods" would test nothing.
func newNodeClient(t *testing.T, objs ...runtime.Object) *fake.Clientset {
	t.Helper()
	cs := fake.NewClientset(objs...)
	cs.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		la := a.(k8stesting.ListActionImpl)
		sel, err := podSelector(la.ListOptions.FieldSelector)
		if err != nil {
			return true, nil, err
		}
		obj, err := cs.Tracker().List(podsGVR, podsGVK, la.Namespace, la.ListOptions)
		if err != nil {
			return true, nil, err
		}
		list := obj.(*corev1.PodList)
		items := list.Items[:0]
		for _, p := range list.Items {
			if sel.Matches(podFields(&p)) {
				items = append(items, p)
			}
		}
		list.Items = items
		return true, list, nil
	})
	cs.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa := a.(k8stesting.WatchActionImpl)
		sel, err := podSelector(wa.ListOptions.FieldSelector)
		if err != nil {
			return true, nil, err
		}
		w, err := cs.Tracker().Watch(podsGVR, wa.Namespace, wa.ListOptions)
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			p, ok := e.Object.(*corev1.Pod)
			return e, !ok || sel.Matches(podFields(p))
		}), nil
	})
	return cs
}

// runPods starts p and returns a channel closed when Synced is called; the
// informer is stopped (and Run has returned) when the test ends.
func runPods(t *testing.T, p *Pods) <-chan struct{} {
	t.Helper()
	synced := make(chan struct{})
	var once sync.Once
	p.Synced = func() { once.Do(func() { close(synced) }) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Pods.Run did not return after its context ended")
		}
	})
	select {
	case <-synced:
	case <-time.After(10 * time.Second):
		t.Fatal("Synced was never called")
	}
	return synced
}

func podWorkload(reg *workload.Registry, id string) (workload.Workload, bool) {
	return reg.Lookup(occupancy.ProcInfo{PodUID: id})
}

// waitPod waits until the registry's entry for a pod satisfies ok.
func waitPod(t *testing.T, reg *workload.Registry, id, what string, ok func(w workload.Workload, found bool) bool) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, what, func() bool {
		w, found := podWorkload(reg, id)
		return ok(w, found)
	})
}

func TestPodsRegistersThisNodesPodsWithClassAndTaskID(t *testing.T) {
	objs := []runtime.Object{
		newPod("ml", "trainer", uid(1), thisNode, map[string]string{workload.LabelPriority: "high", workload.LabelTaskID: "job-42"}),
		newPod("ml", "batch", uid(2), thisNode, map[string]string{workload.LabelPriority: "low"}),
		newPod("ml", "typo", uid(3), thisNode, map[string]string{workload.LabelPriority: "urgent"}),
		newPod("web", "plain", uid(4), thisNode, nil),
		newPod("ml", "elsewhere", uid(5), otherNode, map[string]string{workload.LabelPriority: "high"}),
	}
	// One with a liveness probe (in its second container): it is killed
	// rather than frozen.
	probed := newPod("ml", "probed", uid(8), thisNode, map[string]string{workload.LabelPriority: "low"})
	probed.Spec.Containers = append(probed.Spec.Containers, corev1.Container{Name: "c2"},
		corev1.Container{Name: "c3", LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}})
	objs = append(objs, probed)
	cs := newNodeClient(t, objs...)
	// The default is unmanaged (the zero Default), distinct from both
	// label values, so a defaulted pod cannot pass for a labelled one.
	reg := &workload.Registry{}
	p := &Pods{Client: cs, Node: thisNode, Registry: reg, CgroupRoot: t.TempDir()}
	runPods(t, p)

	want := map[string]workload.Workload{
		uid(1): {PodUID: uid(1), Namespace: "ml", Name: "trainer", TaskID: "job-42", Priority: occupancy.High},
		uid(2): {PodUID: uid(2), Namespace: "ml", Name: "batch", TaskID: "ml/batch", Priority: occupancy.Low},
		uid(3): {PodUID: uid(3), Namespace: "ml", Name: "typo", TaskID: "ml/typo", Priority: occupancy.Unmanaged},
		uid(4): {PodUID: uid(4), Namespace: "web", Name: "plain", TaskID: "web/plain", Priority: occupancy.Unmanaged},
		uid(8): {PodUID: uid(8), Namespace: "ml", Name: "probed", TaskID: "ml/probed", Priority: occupancy.Low, LivenessProbe: true},
	}
	// Synced can come before the handler has put every listed pod
	// (the informer's HasSynced does not wait for its handlers): wait.
	testutil.Eventually(t, 5*time.Second, "this node's 5 pods registered", func() bool { return len(reg.Workloads()) >= len(want) })
	got := reg.Workloads()
	if len(got) != len(want) {
		t.Fatalf("registry holds %d workloads, want %d: %+v", len(got), len(want), got)
	}
	for _, w := range got {
		if !w.LiveLabels {
			t.Errorf("%s: the API server's labels not marked live (NRI's creation-time labels would overrule them)", w.Name)
		}
		w.LiveLabels = false
		if w != want[w.PodUID] {
			t.Errorf("registry has %+v, want %+v", w, want[w.PodUID])
		}
	}
	if _, ok := podWorkload(reg, uid(5)); ok {
		t.Errorf("a pod of %s was registered on %s", otherNode, thisNode)
	}
	if n := reg.MalformedSeen.Load(); n != 1 {
		t.Errorf("MalformedSeen = %d, want 1 (the pod labelled %q)", n, "urgent")
	}
	for id, reason := range map[string]string{uid(1): workload.ReasonLabel, uid(3): workload.ReasonDefault, uid(4): workload.ReasonDefault} {
		if _, _, _, r := reg.Explain(occupancy.ProcInfo{PodUID: id}); r != reason {
			t.Errorf("Explain(pod %s) reason = %q, want %q", id, r, reason)
		}
	}

	// The informer asked the server for this node's pods only, on both
	// the list and the watch: the Node authorizer refuses anything wider.
	var lists, watches int
	for _, a := range cs.Actions() {
		if a.GetResource() != podsGVR {
			continue
		}
		switch a := a.(type) {
		case k8stesting.ListActionImpl:
			lists++
			if a.ListOptions.FieldSelector != "spec.nodeName="+thisNode {
				t.Errorf("pod list field selector = %q", a.ListOptions.FieldSelector)
			}
		case k8stesting.WatchActionImpl:
			watches++
			if a.ListOptions.FieldSelector != "spec.nodeName="+thisNode {
				t.Errorf("pod watch field selector = %q", a.ListOptions.FieldSelector)
			}
		}
	}
	if lists == 0 || watches == 0 {
		t.Errorf("%d pod lists and %d watches, want both", lists, watches)
	}

	// A pod created later on this node is seen through the watch; one on
	// another node is not.
	ctx := context.Background()
	if _, err := cs.CoreV1().Pods("ml").Create(ctx, newPod("ml", "late-other", uid(7), otherNode, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("ml").Create(ctx, newPod("ml", "late", uid(6), thisNode, map[string]string{workload.LabelPriority: "low"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, reg, uid(6), "a pod created later is registered low", func(w workload.Workload, ok bool) bool {
		return ok && w.Priority == occupancy.Low && w.TaskID == "ml/late"
	})
	if _, ok := podWorkload(reg, uid(7)); ok {
		t.Errorf("a pod created later on %s was registered", otherNode)
	}
}

func TestPodsFollowsLabelChanges(t *testing.T) {
	cs := newNodeClient(t, newPod("ml", "job", uid(1), thisNode, map[string]string{workload.LabelPriority: "low"}))
	reg := &workload.Registry{Default: occupancy.Unmanaged}
	runPods(t, &Pods{Client: cs, Node: thisNode, Registry: reg, CgroupRoot: t.TempDir(), Resync: time.Hour})
	waitPod(t, reg, uid(1), "pod registered low", func(w workload.Workload, ok bool) bool { return ok && w.Priority == occupancy.Low })

	ctx := context.Background()
	update := func(labels map[string]string) {
		t.Helper()
		pod, err := cs.CoreV1().Pods("ml").Get(ctx, "job", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Labels = labels
		if _, err := cs.CoreV1().Pods("ml").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Resync is an hour: only the watch's update event can carry these.
	update(map[string]string{workload.LabelPriority: "high", workload.LabelTaskID: "t-1"})
	waitPod(t, reg, uid(1), "low -> high with a task id", func(w workload.Workload, ok bool) bool {
		return ok && w.Priority == occupancy.High && w.TaskID == "t-1"
	})
	update(map[string]string{workload.LabelPriority: "bogus"})
	waitPod(t, reg, uid(1), "high -> malformed: the default, task id back to namespace/name", func(w workload.Workload, ok bool) bool {
		return ok && w.Priority == occupancy.Unmanaged && w.TaskID == "ml/job"
	})
	update(map[string]string{workload.LabelPriority: "low"})
	waitPod(t, reg, uid(1), "label back to low", func(w workload.Workload, ok bool) bool { return ok && w.Priority == occupancy.Low })
	if n := len(reg.Workloads()); n != 1 {
		t.Errorf("registry holds %d workloads after label changes of one pod, want 1", n)
	}
}

func TestPodsRemovesDeletedAndFinishedPods(t *testing.T) {
	cs := newNodeClient(t,
		newPod("ml", "deleted", uid(1), thisNode, map[string]string{workload.LabelPriority: "low"}),
		newPod("ml", "succeeds", uid(2), thisNode, map[string]string{workload.LabelPriority: "low"}),
		newPod("ml", "fails", uid(3), thisNode, map[string]string{workload.LabelPriority: "high"}),
		newPod("ml", "stays", uid(4), thisNode, map[string]string{workload.LabelPriority: "high"}),
	)
	done := newPod("ml", "done-before", uid(5), thisNode, map[string]string{workload.LabelPriority: "high"})
	done.Status.Phase = corev1.PodSucceeded
	if err := cs.Tracker().Add(done); err != nil {
		t.Fatal(err)
	}
	reg := &workload.Registry{}
	runPods(t, &Pods{Client: cs, Node: thisNode, Registry: reg, CgroupRoot: t.TempDir(), Resync: time.Hour})
	for i := 1; i <= 4; i++ {
		waitPod(t, reg, uid(i), "running pod registered", func(_ workload.Workload, ok bool) bool { return ok })
	}
	if _, ok := podWorkload(reg, uid(5)); ok {
		t.Error("a pod listed as Succeeded was registered")
	}

	ctx := context.Background()
	if err := cs.CoreV1().Pods("ml").Delete(ctx, "deleted", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, phase := range map[string]corev1.PodPhase{"succeeds": corev1.PodSucceeded, "fails": corev1.PodFailed} {
		pod, err := cs.CoreV1().Pods("ml").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = phase
		if _, err := cs.CoreV1().Pods("ml").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, what := range map[int]string{1: "deleted pod removed", 2: "Succeeded pod removed", 3: "Failed pod removed"} {
		waitPod(t, reg, uid(i), what, func(_ workload.Workload, ok bool) bool { return !ok })
	}
	if _, ok := podWorkload(reg, uid(4)); !ok {
		t.Error("a running pod was removed along with finished ones")
	}
}

// inode is what cgroups.ID reports for a directory.
func inode(t *testing.T, dir string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

type change struct {
	id   uint64
	prio occupancy.Priority
}

func TestPodsFindsPodCgroupCreatedLater(t *testing.T) {
	root := t.TempDir()
	burst := newPod("ml", "burst", uid(1), thisNode, map[string]string{workload.LabelPriority: "high"})
	burst.Status.QOSClass = corev1.PodQOSBurstable
	sysd := newPod("ml", "sysd", uid(2), thisNode, map[string]string{workload.LabelPriority: "low"})
	sysd.Status.QOSClass = corev1.PodQOSGuaranteed
	cs := newNodeClient(t, burst, sysd)

	var mu sync.Mutex
	var changes []change
	reg := &workload.Registry{OnChange: func(id uint64, p occupancy.Priority) {
		mu.Lock()
		changes = append(changes, change{id, p})
		mu.Unlock()
	}}
	seen := func(c change) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, x := range changes {
			if x == c {
				return true
			}
		}
		return false
	}
	runPods(t, &Pods{Client: cs, Node: thisNode, Registry: reg, CgroupRoot: root, Resync: time.Second})
	for _, id := range []string{uid(1), uid(2)} {
		waitPod(t, reg, id, "pod registered", func(_ workload.Workload, ok bool) bool { return ok })
		if w, _ := podWorkload(reg, id); w.CgroupID != 0 {
			t.Fatalf("pod %s has cgroup id %d before its cgroup exists", id, w.CgroupID)
		}
	}

	// kubelet creates the pod cgroups after the pod was first seen: the
	// cgroupfs driver's path for one, the systemd driver's for the other.
	bdir := filepath.Join(root, "kubepods", "burstable", "pod"+uid(1))
	sdir := filepath.Join(root, "kubepods.slice", "kubepods-pod"+strings.ReplaceAll(uid(2), "-", "_")+".slice")
	for _, d := range []string{bdir, sdir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bid, sid := inode(t, bdir), inode(t, sdir)
	waitPod(t, reg, uid(1), "burstable pod's cgroup id found on resync", func(w workload.Workload, _ bool) bool { return w.CgroupID == bid })
	waitPod(t, reg, uid(2), "systemd pod's cgroup id found on resync", func(w workload.Workload, _ bool) bool { return w.CgroupID == sid })
	testutil.Eventually(t, 5*time.Second, "the gate told high for the burstable pod's cgroup", func() bool { return seen(change{bid, occupancy.High}) })
	testutil.Eventually(t, 5*time.Second, "the gate told low for the systemd pod's cgroup", func() bool { return seen(change{sid, occupancy.Low}) })
	if w, ok := reg.Lookup(occupancy.ProcInfo{CgroupID: bid}); !ok || w.PodUID != uid(1) {
		t.Errorf("Lookup by cgroup id %d = %+v, %v", bid, w, ok)
	}

	// Resyncs of an unchanged pod must not re-tell the gate each time.
	mu.Lock()
	before := len(changes)
	mu.Unlock()
	time.Sleep(2200 * time.Millisecond) // ≥ 2 resyncs (client-go's minimum period is 1s)
	mu.Lock()
	after := len(changes)
	mu.Unlock()
	if after != before {
		t.Errorf("unchanged pods produced %d gate changes over 2 resyncs", after-before)
	}

	if err := cs.CoreV1().Pods("ml").Delete(context.Background(), "burst", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the gate told the deleted pod's cgroup is unclassified", func() bool { return seen(change{bid, ""}) })
}

func names(pods []*corev1.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	sort.Strings(out)
	return out
}

func TestPodsRequesting(t *testing.T) {
	one := resource.MustParse("1")
	limits := newPod("ml", "limits", uid(1), thisNode, nil)
	limits.Spec.Containers[0].Resources.Limits = corev1.ResourceList{gpuRes: one}
	requests := newPod("ml", "requests", uid(2), thisNode, nil)
	// Asked for by a second container, in requests only.
	requests.Spec.Containers = append(requests.Spec.Containers, corev1.Container{Name: "side",
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{gpuRes: one}}})
	cpu := newPod("ml", "cpu", uid(3), thisNode, nil)
	cpu.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: one}
	pending := newPod("ml", "pending", uid(4), thisNode, nil)
	pending.Spec.Containers[0].Resources.Limits = corev1.ResourceList{gpuRes: one}
	pending.Status.Phase = corev1.PodPending
	other := newPod("ml", "other-node", uid(5), otherNode, nil)
	other.Spec.Containers[0].Resources.Limits = corev1.ResourceList{gpuRes: one}
	cs := newNodeClient(t, limits, requests, cpu, pending, other)

	p := &Pods{Client: cs, Node: thisNode, Registry: &workload.Registry{}, CgroupRoot: t.TempDir()}
	if got := p.Requesting(gpuRes); got != nil {
		t.Errorf("Requesting before Run = %v, want nil", names(got))
	}
	runPods(t, p)
	if got, want := strings.Join(names(p.Requesting(gpuRes)), ","), "ml/limits,ml/requests"; got != want {
		t.Errorf("Requesting(%s) = %s, want %s", gpuRes, got, want)
	}
	if got := p.Requesting("example.com/fpga"); len(got) != 0 {
		t.Errorf("Requesting(an unrequested resource) = %v", names(got))
	}

	// The pending pod starts running: it is listed from then on.
	ctx := context.Background()
	pod, err := cs.CoreV1().Pods("ml").Get(ctx, "pending", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if _, err := cs.CoreV1().Pods("ml").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "a pod that started running is listed", func() bool {
		return strings.Join(names(p.Requesting(gpuRes)), ",") == "ml/limits,ml/pending,ml/requests"
	})
}

func TestPodsContainerName(t *testing.T) {
	const (
		mainID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		initID = "1111111111111111111111111111111111111111111111111111111111111111"
		ephID  = "2222222222222222222222222222222222222222222222222222222222222222"
		newID  = "3333333333333333333333333333333333333333333333333333333333333333"
	)
	pod := newPod("ml", "job", uid(1), thisNode, nil)
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{
		{Name: "main", ContainerID: "containerd://" + mainID},
		{Name: "waiting"}, // no id yet
		{Name: "bare", ContainerID: "deadbeef"},
	}
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "setup", ContainerID: "cri-o://" + initID}}
	pod.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{{Name: "debug", ContainerID: "docker://" + ephID}}
	cs := newNodeClient(t, pod)
	p := &Pods{Client: cs, Node: thisNode, Registry: &workload.Registry{}, CgroupRoot: t.TempDir()}
	if got := p.ContainerName("ml", "job", mainID); got != "" {
		t.Errorf("ContainerName before Run = %q, want \"\"", got)
	}
	runPods(t, p)

	for _, c := range []struct{ ns, name, id, want string }{
		{"ml", "job", mainID, "main"},
		{"ml", "job", initID, "setup"},
		{"ml", "job", ephID, "debug"},
		{"ml", "job", "", ""},                       // no id: never the container without one
		{"ml", "job", "deadbeef", ""},               // a status id without a runtime prefix is not parsed
		{"ml", "job", mainID[:12], ""},              // a prefix is not the id
		{"ml", "job", "containerd://" + mainID, ""}, // the caller passes the bare id
		{"other", "job", mainID, ""},
		{"ml", "nope", mainID, ""},
	} {
		if got := p.ContainerName(c.ns, c.name, c.id); got != c.want {
			t.Errorf("ContainerName(%s/%s, %.20q) = %q, want %q", c.ns, c.name, c.id, got, c.want)
		}
	}

	// The container restarts with a new id: the new id names it.
	ctx := context.Background()
	cur, err := cs.CoreV1().Pods("ml").Get(ctx, "job", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.ContainerStatuses[0].ContainerID = "containerd://" + newID
	if _, err := cs.CoreV1().Pods("ml").UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "a restarted container's new id names it", func() bool {
		return p.ContainerName("ml", "job", newID) == "main"
	})
	if got := p.ContainerName("ml", "job", mainID); got != "" {
		t.Errorf("the replaced container id still names %q", got)
	}
}

// The GPU Operator's pods (an agent namespace and an agent label) are
// agents, never given to the gate; the same label in a tenant's namespace,
// or an agent namespace's pod with its own priority label, is not.
func TestPodsAgents(t *testing.T) {
	objs := []runtime.Object{
		newPod("gpu-operator", "nvidia-dcgm-exporter-x", uid(1), thisNode, map[string]string{"app": "nvidia-dcgm-exporter"}),
		newPod("team-a", "fake-dcgm", uid(2), thisNode, map[string]string{"app": "nvidia-dcgm-exporter"}),
		newPod("gpu-operator", "labelled", uid(3), thisNode, map[string]string{"app": "nvidia-x", workload.LabelPriority: "low"}),
	}
	reg := &workload.Registry{Default: occupancy.High, Agents: workload.Agents{
		Namespaces: []string{"gpu-operator"}, Labels: []string{"app=nvidia-*"}}}
	p := &Pods{Client: newNodeClient(t, objs...), Node: thisNode, Registry: reg, CgroupRoot: t.TempDir()}
	runPods(t, p)
	testutil.Eventually(t, 5*time.Second, "3 pods registered", func() bool { return len(reg.Workloads()) >= 3 })
	for id, want := range map[string]struct {
		agent bool
		class occupancy.Priority
	}{uid(1): {true, occupancy.Unmanaged}, uid(2): {false, occupancy.High}, uid(3): {false, occupancy.Low}} {
		w, ok := podWorkload(reg, id)
		if !ok || w.Agent != want.agent || w.Priority != want.class {
			t.Errorf("pod %s: %+v, want agent %v class %s", id, w, want.agent, want.class)
		}
	}
}

// With --priority-classes the informer classes a pod by its priority (its
// PriorityClass's value, as the scheduler preempts by it): a pod above the
// threshold without a label is high, one below it labelled high is low
// (the PriorityClass is the admin's, the label the tenant's), an unmapped
// priority leaves the label to decide, an agent pod stays an agent; and a
// source that sees no priority (NRI) does not undo the class.
func TestPodsClassByPriorityClass(t *testing.T) {
	prio := func(p *corev1.Pod, v int32) *corev1.Pod { p.Spec.Priority = &v; return p }
	objs := []runtime.Object{
		prio(newPod("ml", "serve", uid(1), thisNode, nil), 1000),
		prio(newPod("ml", "forged", uid(2), thisNode, map[string]string{workload.LabelPriority: "high"}), 0),
		prio(newPod("ml", "middle", uid(3), thisNode, map[string]string{workload.LabelPriority: "low"}), 500),
		newPod("ml", "none", uid(4), thisNode, map[string]string{workload.LabelPriority: "high"}),
		prio(newPod("gpu-operator", "nvidia-dcgm-exporter-x", uid(5), thisNode, map[string]string{"app": "nvidia-dcgm-exporter"}), 2000001000),
	}
	classes, err := workload.ParsePriorityClasses([]string{"high>=1000", "low<100"})
	if err != nil {
		t.Fatal(err)
	}
	reg := &workload.Registry{Default: occupancy.Unmanaged, PriorityClasses: classes,
		Agents: workload.Agents{Namespaces: []string{"gpu-operator"}, Labels: []string{"app=nvidia-*"}}}
	runPods(t, &Pods{Client: newNodeClient(t, objs...), Node: thisNode, Registry: reg, CgroupRoot: t.TempDir()})
	testutil.Eventually(t, 5*time.Second, "5 pods registered", func() bool { return len(reg.Workloads()) >= 5 })
	for id, want := range map[string]struct {
		class  occupancy.Priority
		agent  bool
		reason string
	}{
		uid(1): {occupancy.High, false, workload.ReasonPriorityClass},
		uid(2): {occupancy.Low, false, workload.ReasonPriorityClass},
		uid(3): {occupancy.Low, false, workload.ReasonLabel},
		uid(4): {occupancy.High, false, workload.ReasonLabel},
		uid(5): {occupancy.Unmanaged, true, workload.ReasonAgent},
	} {
		w, ok := podWorkload(reg, id)
		_, _, _, reason := reg.Explain(occupancy.ProcInfo{PodUID: id, CgroupID: w.CgroupID})
		if !ok || w.Priority != want.class || w.Agent != want.agent || reason != want.reason {
			t.Errorf("pod %s: %+v (reason %q), want class %s agent %v reason %q", id, w, reason, want.class, want.agent, want.reason)
		}
	}
	// NRI, which sees the label only, classifies the serving pod again.
	if p, _ := reg.ClassifyPod(uid(2), "ml", map[string]string{workload.LabelPriority: "high"}); p != occupancy.Low {
		t.Errorf("a label-only source made the PriorityClass-low pod %s", p)
	}
}

func TestParsePriorityClasses(t *testing.T) {
	m, err := workload.ParsePriorityClasses([]string{"high>=1000", "low<=-1", "high>500", "low<0"})
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[int32]occupancy.Priority{1000: occupancy.High, 2000001000: occupancy.High, 999: occupancy.High, 500: "", -1: occupancy.Low, 0: ""} {
		got, ok := m.Class(&v)
		if got != want || ok != (want != "") {
			t.Errorf("Class(%d) = %q %v, want %q", v, got, ok, want)
		}
	}
	if _, ok := m.Class(nil); ok {
		t.Error("a pod without a priority was mapped")
	}
	for _, bad := range []string{"", "high", "high>=", "high=1000", "urgent>=1", " high>=1", "high>=1 ", "low<abc", "high>=3000000000", "HIGH>=1"} {
		if err := workload.CheckPriorityClass(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
