package kube

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/preempt"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func target(p *corev1.Pod) preempt.Target {
	return preempt.Target{PodUID: string(p.UID), Namespace: p.Namespace, Name: p.Name, Reason: "GPU 2 taken by ml/trainer"}
}

// verbs lists the client's pod actions as "verb[/subresource]".
func verbs(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		if a.GetResource().Resource != "pods" {
			continue
		}
		v := a.GetVerb()
		if a.GetSubresource() != "" {
			v += "/" + a.GetSubresource()
		}
		out = append(out, v)
	}
	return out
}

// checkMarked asserts the pod carries gpud's DisruptionTarget condition.
func checkMarked(t *testing.T, cs *fake.Clientset, ns, name, reason string) {
	t.Helper()
	obj, err := cs.Tracker().Get(podsGVR, ns, name)
	if err != nil {
		t.Fatalf("getting the pod back: %v", err)
	}
	for _, c := range obj.(*corev1.Pod).Status.Conditions {
		if c.Type != corev1.DisruptionTarget {
			continue
		}
		if c.Status != corev1.ConditionTrue || c.Reason != DisruptionReason || c.Message != "gpud: "+reason || c.LastTransitionTime.IsZero() {
			t.Errorf("DisruptionTarget condition = %+v", c)
		}
		return
	}
	t.Errorf("pod has no DisruptionTarget condition: %+v", obj.(*corev1.Pod).Status.Conditions)
}

func TestReclaimEvictMarksThenEvictsWithUIDPrecondition(t *testing.T) {
	for _, mode := range []string{preempt.ReclaimEvict, preempt.ReclaimStop} {
		t.Run(mode, func(t *testing.T) {
			pod := newPod("ml", "batch", uid(1), thisNode, nil)
			// A condition kubelet set must survive gpud's patch.
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			cs := fake.NewClientset(pod)
			tg := target(pod)
			if err := (PodRuntime{Client: cs}).Reclaim(context.Background(), tg, mode); err != nil {
				t.Fatalf("Reclaim(%s) = %v", mode, err)
			}
			if got, want := strings.Join(verbs(cs), ","), "get,patch/status,create/eviction"; got != want {
				t.Fatalf("pod actions = %s, want %s (mark first, then evict)", got, want)
			}
			for _, a := range cs.Actions() {
				switch a := a.(type) {
				case k8stesting.PatchActionImpl:
					if a.GetPatchType() != types.StrategicMergePatchType || a.GetName() != "batch" || a.GetNamespace() != "ml" {
						t.Errorf("patch %s of %s/%s", a.GetPatchType(), a.GetNamespace(), a.GetName())
					}
				case k8stesting.CreateActionImpl:
					ev, ok := a.GetObject().(*policyv1.Eviction)
					if !ok {
						t.Fatalf("eviction create carries %T", a.GetObject())
					}
					if ev.Name != "batch" || ev.Namespace != "ml" || a.GetNamespace() != "ml" {
						t.Errorf("eviction names %s/%s in %s", ev.Namespace, ev.Name, a.GetNamespace())
					}
					if ev.DeleteOptions == nil || ev.DeleteOptions.Preconditions == nil || ev.DeleteOptions.Preconditions.UID == nil ||
						*ev.DeleteOptions.Preconditions.UID != pod.UID {
						t.Errorf("eviction without the UID precondition %s: %+v", pod.UID, ev.DeleteOptions)
					}
				}
			}
			checkMarked(t, cs, "ml", "batch", tg.Reason)
			obj, _ := cs.Tracker().Get(podsGVR, "ml", "batch")
			var ready bool
			for _, c := range obj.(*corev1.Pod).Status.Conditions {
				ready = ready || c.Type == corev1.PodReady
			}
			if !ready {
				t.Error("gpud's patch dropped the pod's other conditions")
			}
		})
	}
}

func TestReclaimDeleteUsesUIDPrecondition(t *testing.T) {
	for _, mode := range []string{preempt.ReclaimDelete, preempt.ReclaimRemove} {
		t.Run(mode, func(t *testing.T) {
			pod := newPod("ml", "batch", uid(1), thisNode, nil)
			cs := fake.NewClientset(pod)
			if err := (PodRuntime{Client: cs}).Reclaim(context.Background(), target(pod), mode); err != nil {
				t.Fatalf("Reclaim(%s) = %v", mode, err)
			}
			if got, want := strings.Join(verbs(cs), ","), "get,patch/status,delete"; got != want {
				t.Fatalf("pod actions = %s, want %s", got, want)
			}
			for _, a := range cs.Actions() {
				if d, ok := a.(k8stesting.DeleteActionImpl); ok {
					pc := d.DeleteOptions.Preconditions
					if d.GetName() != "batch" || d.GetNamespace() != "ml" || pc == nil || pc.UID == nil || *pc.UID != pod.UID {
						t.Errorf("delete of %s/%s with preconditions %+v, want UID %s", d.GetNamespace(), d.GetName(), pc, pod.UID)
					}
				}
			}
			if _, err := cs.Tracker().Get(podsGVR, "ml", "batch"); !apierrors.IsNotFound(err) {
				t.Errorf("pod still there after a delete reclaim: %v", err)
			}
		})
	}
}

func TestReclaimOtherOrMissingPodIsNotFound(t *testing.T) {
	ours := newPod("ml", "batch", uid(1), thisNode, nil)
	// The pod was deleted and a new one took its name (a StatefulSet's,
	// say): gpud must not touch the newcomer.
	newcomer := newPod("ml", "batch", uid(9), thisNode, nil)
	for name, c := range map[string]struct {
		objs []runtime.Object
		tg   preempt.Target
		want string
	}{
		"new pod, same name": {[]runtime.Object{newcomer}, target(ours), "get"},
		"pod gone":           {nil, target(ours), "get"},
		"no name":            {[]runtime.Object{ours}, preempt.Target{PodUID: string(ours.UID), Namespace: "ml"}, ""},
		"no namespace":       {[]runtime.Object{ours}, preempt.Target{PodUID: string(ours.UID), Name: "batch"}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			cs := fake.NewClientset(c.objs...)
			for _, mode := range []string{preempt.ReclaimEvict, preempt.ReclaimDelete} {
				cs.ClearActions()
				err := (PodRuntime{Client: cs}).Reclaim(context.Background(), c.tg, mode)
				if !errors.Is(err, preempt.ErrNotFound) {
					t.Errorf("%s: Reclaim = %v, want ErrNotFound", mode, err)
				}
				if got := strings.Join(verbs(cs), ","); got != c.want {
					t.Errorf("%s: pod actions = %q, want %q (read only)", mode, got, c.want)
				}
			}
			if obj, err := cs.Tracker().Get(podsGVR, "ml", "batch"); err == nil {
				if conds := obj.(*corev1.Pod).Status.Conditions; len(conds) != 0 {
					t.Errorf("an untouchable pod got conditions %+v", conds)
				}
			}
		})
	}
}

var podsGR = schema.GroupResource{Resource: "pods"}

// failing returns a reactor answering verb[/subresource] on pods with err.
func failing(cs *fake.Clientset, verb, sub string, err error) {
	cs.PrependReactor(verb, "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != sub {
			return false, nil, nil
		}
		return true, nil, err
	})
}

func TestReclaimAPIErrors(t *testing.T) {
	pod := newPod("ml", "batch", uid(1), thisNode, nil)
	for _, c := range []struct {
		name, mode, verb, sub string
		err                   error
		notFound              bool // the reclaim is done: the pod is gone
		is                    func(error) bool
		actions               string // what was tried
	}{
		{"get fails", preempt.ReclaimEvict, "get", "", apierrors.NewInternalError(errors.New("etcd down")), false, apierrors.IsInternalError, "get"},
		{"get forbidden", preempt.ReclaimEvict, "get", "", apierrors.NewForbidden(podsGR, "batch", errors.New("node authorizer")), false, apierrors.IsForbidden, "get"},
		{"gone before the mark", preempt.ReclaimEvict, "patch", "status", apierrors.NewNotFound(podsGR, "batch"), true, nil, "get,patch/status"},
		{"mark refused", preempt.ReclaimEvict, "patch", "status", apierrors.NewForbidden(podsGR, "batch", errors.New("no")), false, apierrors.IsForbidden, "get,patch/status"},
		{"eviction blocked by a PDB", preempt.ReclaimEvict, "create", "eviction", apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10), false, apierrors.IsTooManyRequests, "get,patch/status,create/eviction"},
		{"gone before the eviction", preempt.ReclaimEvict, "create", "eviction", apierrors.NewNotFound(podsGR, "batch"), true, nil, "get,patch/status,create/eviction"},
		{"replaced before the delete", preempt.ReclaimDelete, "delete", "", apierrors.NewConflict(podsGR, "batch", errors.New("Precondition failed: UID in precondition")), true, nil, "get,patch/status,delete"},
		{"delete fails", preempt.ReclaimDelete, "delete", "", apierrors.NewServiceUnavailable("try later"), false, apierrors.IsServiceUnavailable, "get,patch/status,delete"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cs := fake.NewClientset(pod)
			failing(cs, c.verb, c.sub, c.err)
			err := (PodRuntime{Client: cs}).Reclaim(context.Background(), target(pod), c.mode)
			if got := errors.Is(err, preempt.ErrNotFound); got != c.notFound {
				t.Fatalf("Reclaim = %v; ErrNotFound %v, want %v", err, got, c.notFound)
			}
			if !c.notFound {
				// A real failure: the reclaimer retries it, and the
				// log says which pod and why.
				if err == nil || !c.is(err) || !strings.Contains(err.Error(), "ml/batch") {
					t.Errorf("Reclaim = %v: want the API error wrapped with the pod's name", err)
				}
			}
			if got := strings.Join(verbs(cs), ","); got != c.actions {
				t.Errorf("pod actions = %s, want %s", got, c.actions)
			}
		})
	}
}
