package kube

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DaemonSets is a client's DaemonSets and pods as the uninstall hook asks
// for them (uninstall.DaemonSets).
type DaemonSets struct{ Client Client }

// Patch applies a strategic merge patch to the DaemonSet namespace/name.
func (d DaemonSets) Patch(ctx context.Context, namespace, name string, patch []byte, fieldManager string) (*appsv1.DaemonSet, error) {
	return d.Client.AppsV1().DaemonSets(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
}

// Get reads the DaemonSet namespace/name.
func (d DaemonSets) Get(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error) {
	return d.Client.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
}

// Pods lists the pods of namespace that the label selector matches.
func (d DaemonSets) Pods(ctx context.Context, namespace, selector string) ([]corev1.Pod, error) {
	l, err := d.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}
