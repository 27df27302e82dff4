package status

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
)

func computeShared() *v1.StateFile {
	f := realistic()
	f.GPUs[2].ComputeShares = []v1.StateComputeShare{
		{PodNamespace: "team-a", PodName: "trainer-7d9f8c6b5-x2x4q-long-name", PodUID: "1a2b3c4d-0000-1111-2222-333344445555",
			TargetPercent: 30, UsedPercent: 29.46, ThrottledSeconds: 12.34, State: "waiting", Frozen: true, Why: "waiting for its turn: busy"},
		{PodNamespace: "team-b", PodName: "server", PodUID: "9a2b3c4d-0000-1111-2222-333344445555",
			TargetPercent: 70, HardCap: true, UsedPercent: 70, ThrottledSeconds: 0, State: "running", Why: "holds the token: it runs for its slice"},
	}
	return f
}

// gpud status shows each pod sharing a GPU's compute: target (a hard cap
// said), measured share, throttled time, the scheduler's state and FROZEN
// while it holds the pod frozen, within 80 columns; -o wide adds the
// pod's UID and why; json and yaml carry the same fields.
func TestRenderComputeShares(t *testing.T) {
	if out := render(t, realistic()); strings.Contains(out, "COMPUTE") {
		t.Errorf("a node without compute shares shows them:\n%s", out)
	}
	f := computeShared()
	out := render(t, f)
	for i, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("line %d is %d columns: %q", i+1, n, line)
		}
	}
	i := strings.Index(out, "GPU COMPUTE SHARES\n")
	if i < 0 {
		t.Fatalf("no compute shares section:\n%s", out)
	}
	lines := strings.Split(strings.TrimRight(out[i:], "\n"), "\n")
	for j, want := range [][]string{
		{"GPU", "POD", "TARGET", "USED", "THROTTLED", "STATE"},
		{"2", "team-a/trainer-7d9f8c6b5-x2…", "30%", "29.5%", "12.3s", "waiting", "FROZEN"},
		{"2", "team-b/server", "70%", "cap", "70.0%", "0s", "running"},
	} {
		if j+1 >= len(lines) {
			t.Fatalf("compute section cut short:\n%s", out[i:])
		}
		if got := strings.Fields(lines[j+1]); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("compute row %d = %q, want fields %q", j, lines[j+1], want)
		}
	}
	var b bytes.Buffer
	if err := RenderWide(&b, f, now); err != nil {
		t.Fatal(err)
	}
	if w := b.String(); !strings.Contains(w, "1a2b3c4d-0000-1111-2222-333344445555") || !strings.Contains(w, "waiting for its turn: busy") ||
		!strings.Contains(w, "team-a/trainer-7d9f8c6b5-x2x4q-long-name") {
		t.Errorf("-o wide lacks the pod's uid, whole name or why:\n%s", w)
	}
	for _, format := range []string{"json", "yaml"} {
		b.Reset()
		if err := Write(&b, f, format, now); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"compute_shares", "target_percent", "used_percent", "throttled_seconds", "frozen"} {
			if !strings.Contains(b.String(), key) {
				t.Errorf("-o %s lacks %s", format, key)
			}
		}
	}
}

// gpud explain says, for a pod under the compute scheduler, its target,
// share and throttled time, and whether the scheduler holds it frozen
// now and why.
func TestRenderExplainCompute(t *testing.T) {
	e := &v1.Explanation{PID: 7, Comm: "train", Monitoring: true, Enforcing: true, Holds: []int{0}, GPUs: []v1.ExplainGPU{
		{Index: 0, State: occupancy.Busy, Holds: true, Shared: true, Allow: true, Rule: "shared: allow",
			Compute: &v1.StateComputeShare{TargetPercent: 30, HardCap: true, UsedPercent: 31.2, ThrottledSeconds: 4.5, State: "capped", Frozen: true,
				Why: "hard cap reached: it used its 30% of the GPU"}},
		{Index: 1, State: occupancy.Busy, Holds: true, Shared: true, Allow: true, Rule: "shared: allow",
			Compute: &v1.StateComputeShare{TargetPercent: 50, UsedPercent: 10, State: "idle", Why: "no work seen on the GPU"}},
	}}
	var b bytes.Buffer
	if err := RenderExplain(&b, e); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"open of GPU 0: allow (rule: shared: allow) [busy, held by it]\n  compute: target 30% cap, used 31.2%, throttled 4.5s; FROZEN by the compute scheduler now: hard cap reached: it used its 30% of the GPU\n",
		"  compute: target 50%, used 10.0%, throttled 0s; idle, not frozen by the compute scheduler: no work seen on the GPU\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("explain lacks %q:\n%s", want, b.String())
		}
	}
}
