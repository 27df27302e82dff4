package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gpud/gpud/internal/preempt"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// DisruptionReason is the reason of the DisruptionTarget condition gpud sets
// on a pod it reclaims.
const DisruptionReason = "PreemptedByGpud"

// PodRuntime reclaims pods through the API server: it marks the pod with a
// DisruptionTarget condition naming gpud, then evicts it (policy/v1
// Eviction, which honours PodDisruptionBudgets) or deletes it. A pod that is
// already gone is done.
type PodRuntime struct {
	Client kubernetes.Interface
}

func (p PodRuntime) Reclaim(ctx context.Context, t preempt.Target, mode string) error {
	if t.Namespace == "" || t.Name == "" {
		return preempt.ErrNotFound // not a pod gpud knows by name
	}
	pods := p.Client.CoreV1().Pods(t.Namespace)
	pod, err := pods.Get(ctx, t.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && string(pod.UID) != t.PodUID) {
		return preempt.ErrNotFound // gone, or a new pod with the same name: not ours to touch
	}
	if err != nil {
		return fmt.Errorf("preempt: getting pod %s/%s: %w", t.Namespace, t.Name, err)
	}
	cond := corev1.PodCondition{
		Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: DisruptionReason,
		Message: "gpud: " + t.Reason, LastTransitionTime: metav1.NewTime(time.Now()),
	}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{cond}}})
	if _, err := pods.Patch(ctx, t.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		if apierrors.IsNotFound(err) {
			return preempt.ErrNotFound
		}
		return fmt.Errorf("preempt: marking pod %s/%s: %w", t.Namespace, t.Name, err)
	}
	uid := types.UID(t.PodUID)
	del := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	if preempt.Gentle(mode) {
		err = p.Client.PolicyV1().Evictions(t.Namespace).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: t.Name, Namespace: t.Namespace}, DeleteOptions: &del,
		})
	} else {
		err = pods.Delete(ctx, t.Name, del)
	}
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return preempt.ErrNotFound // gone meanwhile (a UID precondition conflict is another pod)
	}
	if err != nil {
		return fmt.Errorf("preempt: %s pod %s/%s: %w", mode, t.Namespace, t.Name, err)
	}
	return nil
}
