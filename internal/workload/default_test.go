package workload

import (
	"sync"
	"testing"

	"github.com/gpud/gpud/internal/occupancy"
)

// A reload's new default reaches the workloads that had the old one, and
// only them; the gate hears of each change.
func TestSetDefaultReclassifies(t *testing.T) {
	gate := map[uint64]occupancy.Priority{}
	r := &Registry{Default: occupancy.Unmanaged}
	r.OnChange = func(cg uint64, p occupancy.Priority) { gate[cg] = p }
	put := func(id string, cg uint64, labels map[string]string) {
		r.Put(Workload{ContainerID: id, CgroupID: cg, Priority: r.Classify(id, labels)})
	}
	put("unlabeled", 1, nil)
	put("labeled-high", 2, map[string]string{LabelPriority: "high"})
	put("malformed", 3, map[string]string{LabelPriority: "urgent"})
	r.Put(Workload{PodUID: "pod-a", CgroupID: 4, Priority: r.Classify(PodKey("pod-a"), nil)})
	r.Override("pod-a", occupancy.Low) // a borrower: forced low whatever the default

	r.SetDefault(occupancy.High)
	if got := r.DefaultPriority(); got != occupancy.High {
		t.Fatalf("DefaultPriority = %q", got)
	}
	for _, tc := range []struct {
		info   occupancy.ProcInfo
		class  occupancy.Priority
		reason string
	}{
		{occupancy.ProcInfo{ContainerID: "unlabeled"}, occupancy.High, ReasonDefault},
		{occupancy.ProcInfo{ContainerID: "labeled-high"}, occupancy.High, ReasonLabel},
		{occupancy.ProcInfo{ContainerID: "malformed"}, occupancy.High, ReasonDefault},
		{occupancy.ProcInfo{PodUID: "pod-a"}, occupancy.Low, ReasonOverride},
		{occupancy.ProcInfo{ContainerID: "unknown-ctr"}, occupancy.High, ReasonDefault},
		{occupancy.ProcInfo{PID: 1}, occupancy.Unmanaged, ReasonHost},
	} {
		_, _, class, reason := r.Explain(tc.info)
		if class != tc.class || reason != tc.reason {
			t.Errorf("Explain(%+v) = %q, %q; want %q, %q", tc.info, class, reason, tc.class, tc.reason)
		}
		pi := tc.info
		r.ClassifyProc(&pi)
		if pi.Priority != tc.class {
			t.Errorf("ClassifyProc(%+v) = %q, Explain says %q", tc.info, pi.Priority, tc.class)
		}
	}
	if gate[1] != occupancy.High || gate[3] != occupancy.High {
		t.Errorf("gate not told of the defaulted workloads: %v", gate)
	}
	if gate[4] != occupancy.Low {
		t.Errorf("the borrower's override was lost: %v", gate)
	}

	// Back to unmanaged: the table no longer enforces them; the gate
	// still knows them as workloads of no enforced class (a GPU shared by
	// memory refuses them).
	r.SetDefault(occupancy.Unmanaged)
	if gate[1] != occupancy.Unmanaged || gate[3] != occupancy.Unmanaged || gate[2] != occupancy.High {
		t.Errorf("after SetDefault(unmanaged): %v", gate)
	}
	// A label added later is no longer defaulted.
	put("unlabeled", 1, map[string]string{LabelPriority: "low"})
	r.SetDefault(occupancy.High)
	if _, _, class, reason := r.Explain(occupancy.ProcInfo{ContainerID: "unlabeled"}); class != occupancy.Low || reason != ReasonLabel {
		t.Errorf("relabeled: %q %q", class, reason)
	}
}

func TestSetDefaultConcurrent(t *testing.T) {
	r := &Registry{}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < 1000; i++ {
			r.SetDefault([]occupancy.Priority{occupancy.Low, occupancy.High}[i%2])
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 1000; i++ {
			info := occupancy.ProcInfo{ContainerID: "x"}
			r.ClassifyProc(&info)
			r.Classify("y", nil)
		}
	}()
	wg.Wait()
}
