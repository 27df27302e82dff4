package status

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
)

const ctrID = "3f1c2d4e5b6a7980a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718"

var now = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return now.Add(-d) }

// realistic is a node with a busy GPU held by a pod and a container, an
// idle GPU held by a host process, and a free GPU.
func realistic() *v1.StateFile {
	idleSince := at(2*time.Hour + 3*time.Minute)
	return &v1.StateFile{
		Version: 1, Node: "gpu-node-017", UpdatedAt: at(2 * time.Second), Monitoring: true, Enforcing: true,
		GPUs: []v1.StateGPU{
			{Index: 0, UUID: "GPU-6f0e7c56-5bd8-4c38-9b1d-6c44e6f3b0a1", Device: "/dev/nvidia0", State: occupancy.Busy,
				Holders: []v1.StateHolder{
					{PID: 4194301, Comm: "pt_main_thread_with_a_long_name", CgroupID: 123456789, ContainerID: ctrID,
						PodUID: "1a2b3c4d-0000-1111-2222-333344445555", Priority: occupancy.Unclassified,
						OpenedAt: at(26*time.Hour + 15*time.Minute), FDs: 12},
					{PID: 4194302, Comm: "tritonserver", ContainerID: ctrID, Priority: occupancy.Unmanaged,
						OpenedAt: at(45 * time.Second), FDs: 3},
				}},
			{Index: 1, Device: "/dev/nvidia1", State: occupancy.Idle, IdleSince: &idleSince,
				Holders: []v1.StateHolder{
					{PID: 812, Comm: "jupyter-lab", Priority: occupancy.Low, OpenedAt: at(9 * 24 * time.Hour), FDs: 1},
				}},
			{Index: 2, Device: "/dev/nvidia2", State: occupancy.Free, Holders: []v1.StateHolder{}},
		},
		Preemptions: []v1.RawPreemption{},
	}
}

func render(t *testing.T, f *v1.StateFile) string {
	t.Helper()
	var b bytes.Buffer
	if err := Render(&b, f, now); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestRenderFits80Columns(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*v1.StateFile)
	}{
		{"realistic", func(*v1.StateFile) {}},
		{"monitoring off", func(f *v1.StateFile) { f.Monitoring = false }},
		{"longest idle age", func(f *v1.StateFile) {
			since := at(59*time.Minute + 59*time.Second)
			f.GPUs[1].IdleSince = &since
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := realistic()
			tc.edit(f)
			out := render(t, f)
			for i, line := range strings.Split(out, "\n") {
				if n := utf8.RuneCountInString(line); n > 80 {
					t.Errorf("line %d is %d columns: %q", i+1, n, line)
				}
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

func TestRenderContent(t *testing.T) {
	out := render(t, realistic())
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 7 { // header, blank, column titles, 2+1+1 GPU rows
		t.Fatalf("%d lines, want 7:\n%s", len(lines), out)
	}
	if want := "node gpu-node-017  monitoring on  rules enforced  updated 2s ago"; lines[0] != want {
		t.Errorf("header = %q, want %q", lines[0], want)
	}
	if lines[1] != "" {
		t.Errorf("line 2 = %q, want blank", lines[1])
	}
	if got := strings.Fields(lines[2]); strings.Join(got, " ") != "GPU STATE PID COMM CONTAINER/POD PRIORITY SINCE" {
		t.Errorf("column titles = %q", lines[2])
	}
	for i, want := range [][]string{
		{"0", "busy", "4194301", "pt_main_thread…", "pod/1a2b3c4d-000", "unclassified", "26h15m"},
		{"4194302", "tritonserver", "ctr/3f1c2d4e5b6a", "unmanaged", "45s"},
		{"1", "idle", "2h03m", "812", "jupyter-lab", "host", "low", "9d"},
		{"2", "free", "-", "-", "-", "-", "-"},
	} {
		if got := strings.Fields(lines[3+i]); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("row %d = %q, want fields %q", i, lines[3+i], want)
		}
	}
	// Columns line up: every row's PID starts under the PID title.
	col := strings.Index(lines[2], "PID")
	for _, row := range lines[3:] {
		if len(row) <= col || row[col-1] != ' ' || row[col] == ' ' {
			t.Errorf("row %q: no value at the PID column %d", row, col)
		}
	}
	if strings.Contains(out, ctrID) {
		t.Error("full container id printed")
	}
	if strings.Contains(out, "preemption") {
		t.Error("preemptions line without preemptions")
	}
}

func TestRenderMonitoringOff(t *testing.T) {
	f := realistic()
	f.Monitoring = false
	out := render(t, f)
	header, _, _ := strings.Cut(out, "\n")
	if !strings.Contains(header, "monitoring OFF") {
		t.Errorf("header = %q, want monitoring OFF", header)
	}
	if strings.Contains(header, "monitoring on") {
		t.Errorf("header = %q says on", header)
	}
}

func TestRenderEdgeCases(t *testing.T) {
	f := &v1.StateFile{Version: 1, Monitoring: true,
		GPUs: []v1.StateGPU{
			// Idle without idle_since: no age shown.
			{Index: 3, State: occupancy.Idle, Holders: []v1.StateHolder{{PID: 9, Comm: "x", OpenedAt: now.Add(time.Minute), FDs: 1}}},
		},
		Preemptions: []v1.RawPreemption{json.RawMessage(`{}`), json.RawMessage(`{}`)},
	}
	out := render(t, f)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if want := "node -  monitoring on  rules NOT enforced  updated - ago"; lines[0] != want {
		t.Errorf("header = %q, want %q", lines[0], want)
	}
	// A holder opened in the future (clock skew) reads 0s.
	if got := strings.Join(strings.Fields(lines[3]), "|"); got != "3|idle|9|x|host|-|0s" {
		t.Errorf("row = %q", lines[3])
	}
	if !strings.Contains(out, "\nLAST PREEMPTIONS (2 recorded") {
		t.Errorf("no preemptions section:\n%s", out)
	}
}

func TestRenderPreemptions(t *testing.T) {
	rec := `{"time":"` + now.Add(-90*time.Second).Format(time.RFC3339Nano) + `","gpu":1,"action":"kill",` +
		`"victim":{"pid":4242,"container_id":"0123456789abcdef0123"},"preemptor":{"pid":77,"pod_uid":"aaaabbbb-cccc"},` +
		`"latency_ms":1.84,"result":"done"}`
	f := &v1.StateFile{Version: 1, Monitoring: true, Preemptions: []v1.RawPreemption{json.RawMessage(rec), json.RawMessage(`not json`)}}
	out := render(t, f)
	for _, want := range []string{"(unreadable record)", "1m30s", "kill", "ctr/01234567 4242", "pod/aaaabbbb 77", "1.8", "done"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	// newest first: the unreadable (last) record comes before the kill
	if strings.Index(out, "unreadable") > strings.Index(out, "kill") {
		t.Errorf("not newest first:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if len([]rune(l)) > 80 {
			t.Errorf("line over 80 columns: %q", l)
		}
	}
}

func TestAgo(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{-time.Hour, "0s"},
		{59 * time.Second, "59s"},
		{time.Minute, "1m00s"},
		{59*time.Minute + 59*time.Second, "59m59s"},
		{time.Hour, "1h00m"},
		{47*time.Hour + 59*time.Minute, "47h59m"},
		{48 * time.Hour, "2d"},
		{400 * 24 * time.Hour, "400d"},
	} {
		if got := ago(now, now.Add(-tc.d)); got != tc.want {
			t.Errorf("ago(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	if got := ago(now, time.Time{}); got != "-" {
		t.Errorf("ago(zero) = %q, want -", got)
	}
}

// busy is a crowded node: long pod names on loans, many holders, big PIDs
// and GPU indexes, long task ids and error results in the preemptions.
func busy() *v1.StateFile {
	f := realistic()
	long := "ml-platform-team-production/distributed-resnet-training-job-with-a-very-long-generated-name-7f9c8d"
	f.Node = "gpu-node-with-a-really-long-fully-qualified-name.us-east-1.compute.internal"
	for i := 0; i < 4; i++ {
		f.GPUs[0].Holders = append(f.GPUs[0].Holders, v1.StateHolder{
			PID: 4194303 - i, Comm: "python3-worker-with-long-name", PodUID: "1a2b3c4d-0000-1111-2222-333344445555",
			Priority: occupancy.High, OpenedAt: at(500 * 24 * time.Hour), FDs: 123456,
		})
	}
	idle := at(47*time.Hour + 59*time.Minute)
	f.GPUs = append(f.GPUs,
		v1.StateGPU{Index: 3, State: occupancy.Lent, Owner: long, Borrower: long + "-borrower",
			Holders: []v1.StateHolder{{PID: 4194304, Comm: "borrower", PodUID: "ffffffff-0000-1111-2222-333344445555",
				Priority: occupancy.Low, OpenedAt: at(time.Minute)}}},
		v1.StateGPU{Index: 4, State: occupancy.Lent, Borrower: "b/" + strings.Repeat("x", 200)},
		v1.StateGPU{Index: 15, State: occupancy.Idle, IdleSince: &idle,
			Holders: []v1.StateHolder{{PID: 1, Comm: "x", ContainerID: ctrID, Priority: occupancy.Unclassified, OpenedAt: at(time.Hour)}}},
	)
	for i := 0; i < 8; i++ {
		rec := map[string]any{
			"time": at(time.Duration(i) * 400 * 24 * time.Hour), "gpu": 15, "action": "reclaim",
			"victim":     map[string]any{"pid": 4194303, "task_id": long, "pod_uid": "1a2b3c4d-0000"},
			"preemptor":  map[string]any{"pid": 4194302, "task_id": long + "-high", "container_id": ctrID},
			"latency_ms": 123456.789, "result": "evicting pod " + long + ": the server is currently unable to handle the request",
		}
		b, _ := json.Marshal(rec)
		f.Preemptions = append(f.Preemptions, b)
	}
	return f
}

func TestRenderBusyFits80Columns(t *testing.T) {
	out := render(t, busy())
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, line := range lines {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("line %d is %d columns: %q", i+1, n, line)
		}
	}
	// Everything is there, cut with an ellipsis.
	for _, want := range []string{"LENT GPUS", "GPU OWNER", "BORROWER", "3   ml-platform-team-production/distrib… ml-platform-team-production/distrib…", "MS       RESULT",
		"b/xxxx", "LAST PREEMPTIONS (8 recorded", "ml-platform-t… 4194303", "ml-platform… 4194302", "123456.8 evicting…",
		"4194300 python3-worker… pod/1a2b3c4d-000 high         500d", "idle 47h59m", "lent        4194304 borrower        pod/ffffffff-000 low          1m00s"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	// Lent GPUs: one row each, owner "-" when unknown.
	var loans []string
	for i, l := range lines {
		if l == "LENT GPUS" {
			loans = lines[i+2 : i+4]
		}
	}
	if len(loans) != 2 || !strings.HasPrefix(loans[0], "3 ") || !strings.HasPrefix(strings.Join(strings.Fields(loans[1]), " "), "4 - b/") {
		t.Errorf("loans = %q", loans)
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

func TestRenderExplain(t *testing.T) {
	e := &v1.Explanation{
		PID: 4242, Comm: "python3", Cgroup: "/kubepods.slice/kubepods-pod1a2b.slice/cri-containerd-3f1c.scope", CgroupID: 77,
		ContainerID: ctrID, PodUID: "1a2b3c4d-0000-1111-2222-333344445555",
		Workload: &v1.Workload{Kind: "pod", Namespace: "batch", Name: "sweep-0", PodUID: "1a2b3c4d-0000-1111-2222-333344445555", TaskID: "batch/sweep-0"},
		Priority: occupancy.Low, Reason: "label", Why: "label gpud.io/priority=low on its pod",
		Monitoring: true, Enforcing: true, Holds: []int{1},
		GPUs: []v1.ExplainGPU{
			{Index: 0, State: occupancy.Busy, HighHolders: 1, Allow: false, Rule: "high-held/low-opens: deny",
				Effects: []string{"the refusal is recorded"}},
			{Index: 1, State: occupancy.Busy, Holds: true, Allow: true, Rule: "free: allow"},
		},
	}
	var b bytes.Buffer
	if err := RenderExplain(&b, e); err != nil {
		t.Fatal(err)
	}
	want := `pid 4242 (python3) in pod batch/sweep-0 (uid 1a2b3c4d-0000-1111-2222-333344445555), task batch/sweep-0, container id 3f1c2d4e5b6a
cgroup /kubepods.slice/kubepods-pod1a2b.slice/cri-containerd-3f1c.scope (id 77)
priority low: label gpud.io/priority=low on its pod
holds GPU 1
open of GPU 0: deny (rule: high-held/low-opens: deny) [busy, 1 other high]
  then: the refusal is recorded
open of GPU 1: allow (rule: free: allow) [busy, held by it]
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	e.Workload, e.ContainerID, e.PodUID, e.Monitoring = nil, "", "", false
	b.Reset()
	RenderExplain(&b, e)
	if !strings.HasPrefix(b.String(), "pid 4242 (python3) on the host\n") || !strings.Contains(b.String(), "monitoring is off") {
		t.Errorf("host process, monitoring off:\n%s", b.String())
	}
}

// Failed writes (a full disk) are shown under the header, within 80
// columns, the error made printable; nothing is shown while none failed.
func TestRenderHealth(t *testing.T) {
	f := realistic()
	var plain bytes.Buffer
	if err := Render(&plain, f, now); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain.String(), "WRITE FAILURES") {
		t.Fatal("failures shown while none happened")
	}
	errAt := at(12 * time.Second)
	f.Health = &occupancy.Health{StateWriteFailures: 3, JournalWriteFailures: 2, JournalPending: 1,
		LastError: "no space left on device\x1b[2J" + strings.Repeat("x", 200), LastErrorAt: &errAt}
	var out bytes.Buffer
	if err := Render(&out, f, now); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"WRITE FAILURES  state file 3, journal 2, 1 records waiting (retried)", "last 12s ago: no space left on device?[2J"} {
		if !strings.Contains(s, want) {
			t.Errorf("missing %q in:\n%s", want, s)
		}
	}
	for _, l := range strings.Split(s, "\n") {
		if utf8.RuneCountInString(l) > Width || strings.ContainsRune(l, '\x1b') {
			t.Errorf("line too long or unsafe: %q", l)
		}
	}
}

// Agents are listed after a GPU's holders with the class "agent", and a
// GPU only agents hold reads free with them listed (not "-").
func TestRenderAgents(t *testing.T) {
	f := realistic()
	f.GPUs[2].Agents = []v1.StateHolder{{PID: 2101, Comm: "nvidia-persiste", Priority: occupancy.Unmanaged, OpenedAt: at(3 * time.Hour), FDs: 1}}
	f.GPUs[1].Agents = []v1.StateHolder{{PID: 2101, Comm: "nvidia-persiste", Priority: occupancy.Unmanaged, OpenedAt: at(3 * time.Hour), FDs: 1}}
	out := render(t, f)
	var agentLines []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "nvidia-persiste") {
			agentLines = append(agentLines, line)
		}
	}
	if len(agentLines) != 2 {
		t.Fatalf("want the agent on 2 lines:\n%s", out)
	}
	for _, l := range agentLines {
		if !strings.Contains(l, " agent ") || strings.Contains(l, "unmanaged") {
			t.Errorf("agent line without the class agent: %q", l)
		}
	}
	if !strings.Contains(agentLines[1], "2 ") || !strings.Contains(agentLines[1], "free") {
		t.Errorf("GPU 2 (free, an agent) line: %q", agentLines[1])
	}
	// The holder lines keep their classes.
	if !strings.Contains(out, "jupyter-lab") || !strings.Contains(out, "low") {
		t.Errorf("the holders changed:\n%s", out)
	}
}

// What NVML says is shown: the activity source and the library, each GPU's
// memory and health, why a GPU is not lent, and the GPUs left alone.
func TestRenderNVMLFacts(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	since := now.Add(-3 * time.Minute)
	no := false
	f := &v1.StateFile{Node: "n", UpdatedAt: now, Monitoring: true, Enforcing: true,
		ActivitySource: "nvml", NVML: &v1.StateNVML{Library: "/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", DriverVersion: "570.86.15"},
		GPUs: []v1.StateGPU{
			{Index: 0, State: occupancy.Idle, Memory: &v1.StateMemory{TotalBytes: 16 << 30, UsedBytes: 13 << 30}, Health: &v1.StateGPUHealth{Healthy: true},
				Lendable: &no, NotLendable: "3072 MiB free, below the floor of 4096 MiB"},
			{Index: 1, State: occupancy.Free, Health: &v1.StateGPUHealth{Reason: "XID 79", Since: &since}},
			{Index: 3, State: occupancy.Free, NVML: &v1.StateGPUNVML{State: "degraded", Reason: "utilization: not supported by this GPU", ActivitySource: "opens"}},
		},
		LeftAlone: []v1.StateLeftAlone{{Device: "/dev/nvidia2", UUID: "GPU-ccc", Reason: "MIG enabled"}},
	}
	var b strings.Builder
	if err := RenderWide(&b, f, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"activity from nvml (NVML /driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1, driver 570.86.15)",
		"GPU 0  memory 13.0 of 16.0 GiB used; not lent: 3072 MiB free, below the floor of 4096 MiB",
		"GPU 1  UNHEALTHY for 3m00s: XID 79",
		"GPU 3  NVML DEGRADED: utilization: not supported by this GPU (activity from opens)",
		"/dev/nvidia2 GPU-ccc  LEFT ALONE: MIG enabled",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	f.ActivitySource, f.NVML = "opens", &v1.StateNVML{Error: "nvidia: nvml: loading libnvidia-ml.so.1: not found"}
	b.Reset()
	Render(&b, f, now)
	if !strings.Contains(b.String(), "activity from opens (no NVML: nvidia: nvml: loading") {
		t.Errorf("status without NVML:\n%s", b.String())
	}
}

// The DRA driver's section: what it offers, why a GPU is not shared.
func TestRenderDRA(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	f := &v1.StateFile{Node: "n", UpdatedAt: now, Monitoring: true, ActivitySource: "nvml", NVML: &v1.StateNVML{Library: "l", DriverVersion: "570"},
		GPUs: []v1.StateGPU{{Index: 0, State: occupancy.Free}, {Index: 1, State: occupancy.Free}},
		DRA:  &v1.StateDRA{Driver: "gpud.io", Offered: 1, Claims: 3, NotOffered: []v1.StateNotOffered{{Index: 1, Reason: "unhealthy: XID 79\x1b[31m"}}},
	}
	var b strings.Builder
	if err := RenderWide(&b, f, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sharing by memory (DRA gpud.io): 1 GPUs offered, 3 claims prepared", "GPU 1  not shared: unhealthy: XID 79"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "\x1b") {
		t.Errorf("a reason's escape sequence reached the terminal:\n%q", b.String())
	}
}

func TestRenderSuspended(t *testing.T) {
	f := &v1.StateFile{Version: 1, Monitoring: true, Suspended: []v1.Suspension{{
		Workload: "pod/aaaabbbb-cccc", PIDs: []int{4242}, GPUs: []int{1}, Since: now.Add(-90 * time.Second),
		Freezer: "cgroup.freeze", Reason: "a high-priority process opened GPU 1\x1b[31m", ThawWhen: "thawed when no high-priority process holds GPU [1]",
	}}}
	out := render(t, f)
	for _, want := range []string{"SUSPENDED", "pod/aaaabbbb-cccc", "[4242]", "1m30s", "cgroup.freeze", "opened GPU 1", "thawed when"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a control character got through:\n%q", out)
	}
	if out := render(t, &v1.StateFile{Version: 1}); strings.Contains(out, "SUSPENDED") {
		t.Errorf("a suspended section without suspensions:\n%s", out)
	}
}

// A GPU shared by memory: each pod's share, its use and whether it is
// over or was preempted, in 80 columns; the whole uid in -o wide; a holder
// outside every share is a conflict. A node without shares says nothing.
func TestRenderShares(t *testing.T) {
	if out := render(t, realistic()); strings.Contains(out, "SHARES") {
		t.Errorf("a node without shares shows them:\n%s", out)
	}
	f := realistic()
	f.GPUs[2].Shared = true
	f.GPUs[2].Shares = []v1.StateShare{
		{ClaimNamespace: "team-a", ClaimName: "train-gpu-mem", PodNamespace: "team-a", PodName: "trainer-7d9f8c6b5-x2x4q",
			PodUID: "1a2b3c4d-0000-1111-2222-333344445555", Priority: occupancy.Low, RequestedBytes: 4 << 30, UsedBytes: 6 << 30, Over: true},
		{ClaimNamespace: "team-b", ClaimName: "serve", PodNamespace: "team-b", PodName: "server",
			PodUID: "9a2b3c4d-0000-1111-2222-333344445555", Priority: occupancy.High, RequestedBytes: 8 << 30, UsedBytes: 1 << 30},
		{ClaimNamespace: "shared-claims", ClaimName: "c", PodNamespace: "team-c", PodName: "gone",
			PodUID: "8a2b3c4d-0000-1111-2222-333344445555", Priority: occupancy.Low, RequestedBytes: 1 << 30, UsedBytes: 3 << 30, Over: true, Preempted: true},
	}
	f.GPUs[2].ShareConflicts = []v1.StateShareConflict{{PID: 4242, PodUID: "7a2b3c4d-0000-1111-2222-333344445555"}}
	out := render(t, f)
	for i, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("line %d is %d columns: %q", i+1, n, line)
		}
	}
	i := strings.Index(out, "GPU MEMORY SHARES\n")
	if i < 0 {
		t.Fatalf("no shares section:\n%s", out)
	}
	lines := strings.Split(strings.TrimRight(out[i:], "\n"), "\n")
	for j, want := range [][]string{
		{"GPU", "POD", "CLAIM", "PRIORITY", "SHARE", "USED", "STATUS"},
		{"2", "team-a/trainer-7d9f8c6b…", "train-gpu-mem", "low", "4.0Gi", "6.0Gi", "OVER"},
		{"2", "team-b/server", "serve", "high", "8.0Gi", "1.0Gi", "ok"},
		{"2", "team-c/gone", "shared-claims…", "low", "1.0Gi", "3.0Gi", "PREEMPTED"},
	} {
		if j+1 >= len(lines) {
			t.Fatalf("shares section cut short:\n%s", out[i:])
		}
		if got := strings.Fields(lines[j+1]); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("shares row %d = %q, want fields %q", j, lines[j+1], want)
		}
	}
	if !strings.Contains(out, "CONFLICT GPU 2: pid 4242 of pod 7a2b3c4d-000… holds it outside every share") {
		t.Errorf("no conflict line:\n%s", out)
	}
	var b bytes.Buffer
	if err := RenderWide(&b, f, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "9a2b3c4d-0000-1111-2222-333344445555") {
		t.Errorf("-o wide lacks the pod uid:\n%s", b.String())
	}
}

// The kernel hooks' mode has its line: what syscalls mode costs, what
// driver mode misses; files of gpuds before it have none.
func TestRenderHooks(t *testing.T) {
	f := realistic()
	if out := render(t, f); strings.Contains(out, "kernel hooks") {
		t.Errorf("hooks line without hooks in the file:\n%s", out)
	}
	for _, tc := range []struct {
		hooks v1.StateHooks
		want  string
	}{
		{v1.StateHooks{Mode: "syscalls", Complete: true}, "kernel hooks syscalls (sys_enter/sys_exit: every syscall on the node pays)"},
		{v1.StateHooks{Mode: "driver", Complete: true}, "kernel hooks driver (nothing on the syscall path)"},
		{v1.StateHooks{Mode: "syscalls", Missing: []string{"gate (observe-only: the kernel refuses it)"}}, "kernel hooks syscalls (missing gate (observe-only: the kernel refuses it)"},
		{v1.StateHooks{Mode: "driver", Missing: []string{"release (nvidia_close)"}}, "kernel hooks driver (nothing on the syscall path; missing release"},
		{v1.StateHooks{Mode: "driver", PassedFDs: "sock tracepoints: at receipt"}, "passed GPU fds (SCM_RIGHTS) seen by sock tracepoints: at receipt"},
		{v1.StateHooks{Mode: "driver", PassedFDs: "sweep only: within 1m0s"}, "passed GPU fds (SCM_RIGHTS) seen by sweep only: within 1m0s"},
	} {
		f.Hooks = &tc.hooks
		if out := render(t, f); !strings.Contains(out, tc.want) {
			t.Errorf("%+v: output lacks %q:\n%s", tc.hooks, tc.want, out)
		}
	}
}

func TestRenderKernelMaps(t *testing.T) {
	f := realistic()
	if out := render(t, f); strings.Contains(out, "KERNEL MAP") {
		t.Errorf("kernel map warning without one in the file:\n%s", out)
	}
	f.KernelMaps = []v1.StateKernelMap{{Name: "cgroup_prio", Entries: 60000, Capacity: 65536,
		Full: "new workloads are not classified in the kernel: the gate lets their opens through and gpud's after-the-fact rule judges them"}}
	out := render(t, f)
	for _, want := range []string{"KERNEL MAP NEARLY FULL  cgroup_prio 60000 of 65536 entries (91%)", "when full: new workloads", "after-the-fact rule judges them"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for i, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > Width {
			t.Errorf("line %d is %d columns: %q", i+1, n, line)
		}
	}
}
