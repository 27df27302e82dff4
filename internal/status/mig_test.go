package status

import (
	"strings"
	"testing"

	v1 "github.com/gpud/gpud/api/v1"
)

// A MIG slice is shown as its parent and GPU instance, with its profile,
// parent UUID and capability node; the parent as left alone.
func TestRenderMIGSlice(t *testing.T) {
	f := &v1.StateFile{Version: v1.StateVersion, Node: "n", Monitoring: true,
		GPUs: []v1.StateGPU{{Index: 1<<20 + 12, UUID: "MIG-aaa", Device: "/dev/nvidia-caps/nvidia-cap12", State: "busy",
			Holders: []v1.StateHolder{{PID: 42, Comm: "train", Priority: v1.High, FDs: 1}},
			MIG:     &v1.StateMIG{Parent: 0, ParentUUID: "GPU-ppp", ParentDevice: "/dev/nvidia0", GI: 1, Profile: "3g.40gb"}}},
		LeftAlone: []v1.StateLeftAlone{{Device: "/dev/nvidia0", UUID: "GPU-ppp", Reason: "MIG enabled: its 1 slices are judged"}},
	}
	var b strings.Builder
	if err := RenderWide(&b, f, now); err != nil {
		t.Fatal(err)
	}
	out := render(t, f) + b.String()
	for _, want := range []string{"0/gi1", "MIG 3g.40gb of GPU 0, gi1/ci0, nvidia-cap12", "MIG 3g.40gb of GPU 0, gi1/ci0, nvidia-cap12, parent GPU-ppp", "LEFT ALONE"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "1048588") {
		t.Errorf("status shows a slice's internal index:\n%s", out)
	}
}
