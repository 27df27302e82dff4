package occupancy

import (
	"encoding/json"
	"os"
	"testing"
	"time"
)

func agentInfo(pid int, comm string) ProcInfo {
	return ProcInfo{PID: pid, StartTime: 1, Comm: comm, Priority: Unmanaged, Root: true, Agent: true}
}

// An agent that holds a GPU leaves it free: it is shown, never a holder.
func TestAgentAloneLeavesGPUFree(t *testing.T) {
	l := NewLedger(testGPUs(2), time.Minute)
	l.AddFD(agentInfo(10, "nvidia-persiste"), 0, 3, t0)
	l.AddFD(agentInfo(10, "nvidia-persiste"), 1, 4, t0)
	s := l.Snapshot(t0.Add(time.Second))
	for _, g := range s.GPUs {
		if g.State != Free || len(g.Holders) != 0 || len(g.Agents) != 1 || g.Agents[0].PID != 10 {
			t.Errorf("GPU %d: %s, holders %v, agents %v; want free with the agent shown", g.Index, g.State, g.Holders, g.Agents)
		}
	}
	if h := l.Holders(0); len(h) != 0 {
		t.Errorf("Holders(0) = %v: an agent is never a victim, owner or borrower", h)
	}
	if a := l.Agents(0); len(a) != 1 {
		t.Errorf("Agents(0) = %v", a)
	}
	if c := l.Counts()[0]; c != (ClassCounts{}) {
		t.Errorf("Counts = %+v: an agent never blocks an open", c)
	}
	// Even an agent classified low (it cannot be: the classifier makes it
	// unmanaged) would count for nothing.
	l.AddFD(ProcInfo{PID: 11, StartTime: 1, Comm: "dcgm-exporter", Priority: Low, Agent: true}, 0, 5, t0)
	if c := l.Counts()[0]; c != (ClassCounts{}) {
		t.Errorf("Counts with a low-classed agent = %+v", c)
	}

	f := Render(l.Snapshot(t0), "n", true)
	if len(f.GPUs[0].Holders) != 0 || len(f.GPUs[0].Agents) != 2 || f.GPUs[0].Agents[0].Comm != "nvidia-persiste" {
		t.Errorf("state file GPU 0: holders %v agents %v", f.GPUs[0].Holders, f.GPUs[0].Agents)
	}
	b, err := json.Marshal(f.GPUs[0])
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if string(doc["holders"]) != "[]" || doc["agents"] == nil {
		t.Errorf("holders %s agents %s", doc["holders"], doc["agents"])
	}
	if _, err := ParseStateFile(mustJSON(t, f)); err != nil {
		t.Errorf("the document does not parse back: %v", err)
	}
	// No agents: no key (readers of older files see what they saw).
	empty := Render(NewLedger(testGPUs(1), time.Minute).Snapshot(t0), "n", true)
	if b := mustJSON(t, empty); json.Valid(b) && containsKey(t, b, "agents") {
		t.Errorf("agents key without agents: %s", b)
	}
}

// A workload's GPU goes idle while an agent keeps opening it (GPU Feature
// Discovery's NVML init every minute) and while NVML sees only agents use
// it (DCGM's profiling).
func TestAgentOpensAreNoActivity(t *testing.T) {
	l := NewLedger(testGPUs(1), time.Minute)
	l.AddFD(pinfo(20, 1, "train"), 0, 3, t0)
	for i := 1; i <= 10; i++ {
		at := t0.Add(time.Duration(i) * 20 * time.Second)
		l.AddFD(agentInfo(30, "gpu-feature-dis"), 0, 7, at)
		l.ActivityBy(0, at, []uint32{30})
		l.RemoveFD(30, 0, 7)
	}
	l.Refresh(t0.Add(200 * time.Second))
	s := l.Snapshot(t0.Add(200 * time.Second))
	if s.GPUs[0].State != Idle || !s.GPUs[0].LastActive.Equal(t0) {
		t.Errorf("state %s, last active %v: agents' opens and use counted as activity", s.GPUs[0].State, s.GPUs[0].LastActive)
	}
	// A sample naming a workload's process counts, as does one that names
	// nobody.
	l.AddFD(agentInfo(30, "gpu-feature-dis"), 0, 7, t0.Add(201*time.Second))
	l.ActivityBy(0, t0.Add(201*time.Second), []uint32{30, 20})
	if st := l.Snapshot(t0.Add(202 * time.Second)).GPUs[0].State; st != Busy {
		t.Errorf("after the workload's use: %s, want busy", st)
	}
	l.ActivityBy(0, t0.Add(400*time.Second), nil)
	if st := l.Snapshot(t0.Add(401 * time.Second)).GPUs[0].State; st != Busy {
		t.Errorf("after an anonymous sample: %s, want busy", st)
	}
	// An agent found in /proc on a free GPU is no new activity either.
	l2 := NewLedger(testGPUs(1), time.Minute)
	l2.SetProcess(ProcFDs{Info: agentInfo(40, "nv-hostengine"), FDs: map[int][]int32{0: {3}}}, t0)
	l2.SetProcess(ProcFDs{Info: pinfo(41, 1, "train"), FDs: map[int][]int32{0: {3}}}, t0.Add(time.Hour))
	if g := l2.Snapshot(t0.Add(time.Hour)).GPUs[0]; g.State != Busy || !g.LastActive.Equal(t0.Add(time.Hour)) {
		t.Errorf("a workload found after an agent: %s since %v", g.State, g.LastActive)
	}
}

// Reclassify moves a process between holders and agents, and the GPU's
// state follows at once.
func TestReclassifyAgent(t *testing.T) {
	l := NewLedger(testGPUs(1), time.Minute)
	l.AddFD(pinfo(50, 1, "nvidia-persiste"), 0, 3, t0)
	if st := l.Snapshot(t0).GPUs[0].State; st != Busy {
		t.Fatalf("state %s", st)
	}
	v := l.Version()
	l.Reclassify(func(p *ProcInfo) { p.Agent, p.Priority = true, Unmanaged })
	if l.Version() == v {
		t.Error("becoming an agent is no change")
	}
	if g := l.Snapshot(t0).GPUs[0]; g.State != Free || len(g.Agents) != 1 {
		t.Errorf("after becoming an agent: %s, agents %v", g.State, g.Agents)
	}
	l.Reclassify(func(p *ProcInfo) { p.Agent, p.Priority = false, Low })
	if g := l.Snapshot(t0).GPUs[0]; g.State != Busy || len(g.Holders) != 1 || g.Holders[0].Priority != Low {
		t.Errorf("after ceasing to be one: %s, holders %v", g.State, g.Holders)
	}
}

// Root is the real uid from status, never the owner of /proc/<pid>.
func TestRealRoot(t *testing.T) {
	for doc, want := range map[string]bool{
		"Name:\tx\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n": true,
		"Uid:\t1000\t0\t0\t0\n":                          false, // a setuid-root binary run by 1000: not root's
		"Uid:\t0\t1000\t1000\t1000\n":                    true,
		"Name:\tx\n":                                     false,
		"Uid:\t0\n":                                      false,
		"Uid:\t00\t0\t0\t0\n":                            false,
		"Name:\tUid:\t0\t0\t0\t0\nUid:\t1000\t1000\t1000\t1000\n": false,
	} {
		if got := realRoot([]byte(doc)); got != want {
			t.Errorf("realRoot(%q) = %v, want %v", doc, got, want)
		}
	}
	// This test's own process, through the real /proc.
	info, err := (&ProcFS{Root: "/proc"}).Info(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if info.Root != (os.Getuid() == 0) {
		t.Errorf("Info(self).Root = %v, uid %d", info.Root, os.Getuid())
	}
	if _, err := os.Stat("/proc/1/status"); err == nil {
		info, err := (&ProcFS{Root: "/proc"}).Info(1)
		if err == nil && !info.Root {
			t.Errorf("pid 1 is not root: %+v", info)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func containsKey(t *testing.T, b []byte, key string) bool {
	t.Helper()
	var doc struct {
		GPUs []map[string]json.RawMessage `json:"gpus"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, g := range doc.GPUs {
		if _, ok := g[key]; ok {
			return true
		}
	}
	return false
}

// A rename forgets that the process was root: the uid read with the old
// name proves nothing of whoever chose the new one.
func TestRefreshCommsForgetsRoot(t *testing.T) {
	l := NewLedger(testGPUs(1), time.Minute)
	info := pinfo(60, 1, "python")
	info.Root = true
	l.AddFD(info, 0, 3, t0)
	l.RefreshComms(func(int) (string, bool) { return "python", true })
	if p, _ := l.Has(60); !p.Root {
		t.Fatal("an unchanged name forgot root")
	}
	l.RefreshComms(func(int) (string, bool) { return "nvidia-persiste", true })
	if p, _ := l.Has(60); p.Root || p.Comm != "nvidia-persiste" {
		t.Errorf("after a rename: %+v, want the new name and not root", p)
	}
}

// CountsOf is Counts()[gpu] for every GPU: holders by class, agents and
// unclassified holders left out, a process holding several GPUs counted
// on each.
func TestCountsOfIsCountsOfOneGPU(t *testing.T) {
	l := NewLedger(testGPUs(3), time.Minute)
	l.AddFD(ProcInfo{PID: 20, StartTime: 1, Priority: High}, 0, 3, t0)
	l.AddFD(ProcInfo{PID: 20, StartTime: 1, Priority: High}, 1, 4, t0)
	l.AddFD(ProcInfo{PID: 21, StartTime: 1, Priority: Low}, 0, 3, t0)
	l.AddFD(ProcInfo{PID: 21, StartTime: 1, Priority: Low}, 0, 5, t0)
	l.AddFD(ProcInfo{PID: 22, StartTime: 1, Priority: Low}, 1, 3, t0)
	l.AddFD(ProcInfo{PID: 23, StartTime: 1, Priority: Unclassified}, 1, 3, t0)
	l.AddFD(agentInfo(24, "dcgm-exporter"), 2, 3, t0)
	want := map[int]ClassCounts{0: {High: 1, Low: 1}, 1: {High: 1, Low: 1}, 2: {}}
	all := l.Counts()
	for gpu, w := range want {
		if got := l.CountsOf(gpu); got != w || got != all[gpu] {
			t.Errorf("CountsOf(%d) = %+v, Counts()[%d] = %+v; want %+v", gpu, got, gpu, all[gpu], w)
		}
	}
}
