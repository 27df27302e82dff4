package kube

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/workload"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// A pod the informer sees before kubelet made its cgroup has its cgroup's
// leaf names expected with its class (so the kernel classifies the cgroup
// as it is made), and forgotten when the pod goes.
func TestPodCgroupExpected(t *testing.T) {
	const uid = "0a1b2c3d-0000-1111-2222-333344445555"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml", UID: types.UID(uid),
			Labels: map[string]string{workload.LabelPriority: "low"}},
		Spec:   corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBurstable},
	}
	client := fake.NewClientset(pod)
	var mu sync.Mutex
	var calls []string
	r := &workload.Registry{Default: occupancy.Unmanaged}
	r.OnExpect = func(names []string, p occupancy.Priority) {
		mu.Lock()
		calls = append(calls, fmt.Sprintf("%v %s", names, p))
		mu.Unlock()
	}
	p := &Pods{Client: client, Node: "n1", Registry: r, CgroupRoot: t.TempDir(), Log: slog.Default(), Resync: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	names := "[pod" + uid + " kubepods-burstable-pod0a1b2c3d_0000_1111_2222_333344445555.slice]"
	wait := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			got := slices.Clone(calls)
			mu.Unlock()
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("OnExpect calls %q, want %q", got, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait(names + " low")
	if err := client.CoreV1().Pods("ml").Delete(ctx, "train", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(names+" low", names+" ")
}
