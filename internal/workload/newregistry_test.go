package workload

import (
	"maps"
	"testing"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
)

func TestNewRegistryChecksAgentsAndModes(t *testing.T) {
	r, err := NewRegistry(occupancy.Low, Agents{Namespaces: []string{"gpu-operator"}}, PreemptModes{Namespaces: []string{"ml=freeze"}}, []string{"high>=1000"}, nil)
	if err != nil || r.DefaultPriority() != occupancy.Low {
		t.Fatalf("valid agents and modes: %v, %v", r, err)
	}
	if _, err := NewRegistry(occupancy.Low, Agents{Namespaces: []string{"Not A Namespace"}}, PreemptModes{}, nil, nil); err == nil {
		t.Fatal("an invalid agent namespace accepted")
	}
	if _, err := NewRegistry(occupancy.Low, Agents{}, PreemptModes{Containers: []string{"explode"}}, nil, nil); err == nil {
		t.Fatal("an invalid preempt mode accepted")
	}
	if _, err := NewRegistry(occupancy.Low, Agents{}, PreemptModes{}, []string{"urgent>=1"}, nil); err == nil {
		t.Fatal("an invalid priority class accepted")
	}
	if v := int32(1000); func() bool { p, ok := r.PriorityClasses.Class(&v); return !ok || p != occupancy.High }() {
		t.Fatalf("priority classes %+v: 1000 not high", r.PriorityClasses)
	}
}

func TestIgnoredLabelsByReason(t *testing.T) {
	var r Registry
	r.ImageLabelsDropped.Add(2)
	r.ModesRefused.Add(1)
	if got, want := r.IgnoredLabels(), map[string]uint64{"image": 2, "preempt_mode": 1}; !maps.Equal(got, want) {
		t.Fatalf("ignored labels %v, want %v", got, want)
	}
}

func TestHolderNames(t *testing.T) {
	r := &Registry{Default: occupancy.Unmanaged}
	r.Put(Workload{PodUID: "u1", Namespace: "ml", Name: "train", Priority: occupancy.High})
	r.Put(Workload{ContainerID: "c1", Name: "notebook", Priority: occupancy.Low})
	names := r.HolderNames(func(ns, name, id string) string { return "main-" + id })
	if ns, pod, ctr := names(v1.StateHolder{PodUID: "u1", ContainerID: "abc"}); ns != "ml" || pod != "train" || ctr != "main-abc" {
		t.Fatalf("pod holder named %q %q %q", ns, pod, ctr)
	}
	if ns, pod, ctr := names(v1.StateHolder{ContainerID: "c1"}); ns != "" || pod != "" || ctr != "notebook" {
		t.Fatalf("container holder named %q %q %q", ns, pod, ctr)
	}
	if ns, pod, ctr := r.HolderNames(nil)(v1.StateHolder{PodUID: "u1"}); ns != "ml" || pod != "train" || ctr != "" {
		t.Fatalf("without container names: %q %q %q", ns, pod, ctr)
	}
}
