package workload

import (
	"fmt"
	"slices"
	"testing"

	"github.com/gpud/gpud/internal/occupancy"
)

// The expected cgroups' class follows the workload's: known at Put, changed
// by the default and lending overrides, forgotten at removal; nothing is
// said twice.
func TestExpectFollowsClass(t *testing.T) {
	var calls []string
	r := &Registry{Default: occupancy.Unmanaged}
	r.OnExpect = func(names []string, p occupancy.Priority) { calls = append(calls, fmt.Sprintf("%v %s", names, p)) }
	step := func(what string, want ...string) {
		t.Helper()
		if !slices.Equal(calls, want) {
			t.Errorf("%s: calls %q, want %q", what, calls, want)
		}
		calls = nil
	}

	r.Expect("c1", []string{"docker-c1.scope", "c1"})
	step("expected before the workload is known")
	r.Put(Workload{ContainerID: "c1", Priority: r.Classify("c1", map[string]string{LabelPriority: "low"})})
	step("put low", "[docker-c1.scope c1] low")
	r.Put(Workload{ContainerID: "c1", Priority: occupancy.Low, CgroupID: 42})
	step("the cgroup found, same class")
	r.Remove("c1")
	step("removed", "[docker-c1.scope c1] ")
	if n, _ := r.Expected("c1"); n != nil {
		t.Errorf("expectation kept after removal: %q", n)
	}

	// A workload without the label follows the default.
	r.Put(Workload{ContainerID: "c2", Priority: r.Classify("c2", nil)})
	r.Expect("c2", []string{"c2"})
	// Unmanaged is a workload of no enforced class to the kernel (a GPU
	// shared by memory refuses it), not "no class".
	step("unmanaged by default", "[c2] unmanaged")
	r.SetDefault(occupancy.High)
	step("default high", "[c2] high")
	r.SetDefault(occupancy.Unmanaged)
	step("default unmanaged", "[c2] unmanaged")

	// A pod: lending overrides its class.
	r.Put(Workload{PodUID: "u1", Priority: occupancy.High})
	r.Expect(PodKey("u1"), []string{"podu1"})
	step("pod high", "[podu1] high")
	r.Override("u1", occupancy.Low)
	step("lent: low", "[podu1] low")
	// New names replace the old ones (forgotten first).
	r.Expect(PodKey("u1"), []string{"podu1", "kubepods-podu1.slice"})
	step("names changed", "[podu1] ", "[podu1 kubepods-podu1.slice] low")
	r.RemovePod("u1")
	step("pod gone", "[podu1 kubepods-podu1.slice] ")
}
