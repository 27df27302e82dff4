package uninstall

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpud/gpud/internal/workload/kube"
)

func daemonSet() *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "gpud", Namespace: "gpud-system", UID: "ds-uid", Generation: 1},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "gpud"}},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: Container, Args: []string{"run"},
				LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz"}}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz"}}},
			}}}},
		},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 2, ObservedGeneration: 1},
	}
}

func pod(ds *appsv1.DaemonSet, name, node string, cleaner, ready bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ds.Namespace, Labels: map[string]string{"app": "gpud"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}},
		Spec: corev1.PodSpec{NodeName: node},
	}
	if cleaner {
		p.Annotations = map[string]string{Annotation: "now"}
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	return p
}

// The patch makes every pod a cleaner at once, and Run returns when every
// node's cleaner is ready.
func TestCleanupWaitsForEveryNode(t *testing.T) {
	ds := daemonSet()
	c := fake.NewClientset(ds, pod(ds, "gpud-a", "node-a", false, true), pod(ds, "gpud-b", "node-b", false, true))
	type result struct{ cleaned, notCleaned []string }
	done := make(chan result, 1)
	go func() {
		cl, nc, err := Cleanup{Client: kube.DaemonSets{Client: c}, Namespace: "gpud-system", DaemonSet: "gpud", Poll: 10 * time.Millisecond,
			Args: []string{"uninstall", "--wait"}, Check: []string{"/gpud", "uninstall", "--check"}, Log: slog.Default()}.Run(context.Background())
		if err != nil {
			t.Error(err)
		}
		done <- result{cl, nc}
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("returned before any cleaner: %+v", r)
	default:
	}
	got, err := c.AppsV1().DaemonSets("gpud-system").Get(context.Background(), "gpud", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := got.Spec.Template.Spec.Containers[0]
	if !slices.Equal(ctr.Args, []string{"uninstall", "--wait"}) || ctr.LivenessProbe != nil ||
		ctr.ReadinessProbe == nil || ctr.ReadinessProbe.HTTPGet != nil || ctr.ReadinessProbe.Exec == nil ||
		!slices.Equal(ctr.ReadinessProbe.Exec.Command, []string{"/gpud", "uninstall", "--check"}) {
		b, _ := json.Marshal(ctr)
		t.Fatalf("container not a cleaner: %s", b)
	}
	if ru := got.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxUnavailable.String() != "100%" || got.Spec.Template.Annotations[Annotation] == "" {
		t.Fatalf("update strategy %+v, template annotations %v", got.Spec.UpdateStrategy, got.Spec.Template.Annotations)
	}
	// The controller replaces the pods; one cleaner is ready, then the other.
	pods := c.CoreV1().Pods("gpud-system")
	for _, n := range []string{"gpud-a", "gpud-b"} {
		if err := pods.Delete(context.Background(), n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pods.Create(context.Background(), pod(ds, "gpud-c", "node-a", true, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Create(context.Background(), pod(ds, "gpud-d", "node-b", true, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("returned with node-b's cleaner not ready: %+v", r)
	default:
	}
	if _, err := pods.Update(context.Background(), pod(ds, "gpud-d", "node-b", true, true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if !slices.Equal(r.cleaned, []string{"node-a", "node-b"}) || len(r.notCleaned) != 0 {
			t.Errorf("cleaned %v, not cleaned %v", r.cleaned, r.notCleaned)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return with every cleaner ready")
	}
}

// A node whose cleaner never becomes ready is reported when time is up;
// a missing DaemonSet is nothing to do.
func TestCleanupReportsNodesNotCleaned(t *testing.T) {
	ds := daemonSet()
	c := fake.NewClientset(ds, pod(ds, "gpud-a", "node-a", true, true), pod(ds, "gpud-b", "node-b", true, false))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	cl, nc, err := Cleanup{Client: kube.DaemonSets{Client: c}, Namespace: "gpud-system", DaemonSet: "gpud", Poll: 10 * time.Millisecond, Log: slog.Default()}.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cl, []string{"node-a"}) || !slices.Equal(nc, []string{"node-b"}) {
		t.Errorf("cleaned %v, not cleaned %v", cl, nc)
	}
	cl, nc, err = Cleanup{Client: kube.DaemonSets{Client: fake.NewClientset()}, Namespace: "gpud-system", DaemonSet: "gpud", Log: slog.Default()}.Run(context.Background())
	if err != nil || cl != nil || nc != nil {
		t.Errorf("no DaemonSet: %v %v %v", cl, nc, err)
	}
}
