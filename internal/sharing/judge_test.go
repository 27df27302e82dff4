package sharing

import (
	"encoding/binary"
	"slices"
	"testing"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/preempt"
)

const gib = uint64(1) << 30

func share(claim string, bytes uint64, pods ...string) Share {
	s := Share{ClaimUID: "uid-" + claim, ClaimNamespace: "ns", ClaimName: claim, Request: "gpu", GPU: 0, UUID: "GPU-0", Bytes: bytes}
	for _, p := range pods {
		s.Pods = append(s.Pods, PodRef{UID: p, Namespace: "ns", Name: p})
	}
	return s
}

func proc(pid int, pod string, prio v1.Priority, mem uint64) Proc {
	return Proc{PID: pid, PodUID: pod, Priority: prio, Memory: mem}
}

func mem(total, used uint64) *Memory { return &Memory{Total: total, Used: used} }

func TestJudge(t *testing.T) {
	type want struct {
		used    []uint64
		over    []bool
		preempt []string
		need    uint64
		conf    []int // PIDs
	}
	for _, tc := range []struct {
		name string
		in   Input
		want want
	}{
		{
			name: "within every share: nothing",
			in: Input{Shares: []Share{share("a", 4*gib, "pa"), share("b", 8*gib, "pb")},
				Procs:  []Proc{proc(1, "pa", v1.Low, 3*gib), proc(2, "pb", v1.High, 8*gib)},
				Memory: mem(16*gib, 11*gib)},
			want: want{used: []uint64{3 * gib, 8 * gib}, over: []bool{false, false}, need: gib},
		},
		{
			name: "low over its share, nobody needs memory: warned only",
			in: Input{Shares: []Share{share("low", 4*gib, "pl"), share("high", 8*gib, "ph")},
				Procs:  []Proc{proc(1, "pl", v1.Low, 6*gib), proc(2, "ph", v1.High, 2*gib)},
				Memory: mem(16*gib, 8*gib)},
			want: want{used: []uint64{6 * gib, 2 * gib}, over: []bool{true, false}, need: 6 * gib},
		},
		{
			name: "low over, high within needs what it was promised: low preempted",
			in: Input{Shares: []Share{share("low", 4*gib, "pl"), share("high", 8*gib, "ph")},
				Procs:  []Proc{proc(1, "pl", v1.Low, 6*gib), proc(2, "ph", v1.High, 2*gib)},
				Memory: mem(16*gib, 12*gib)}, // 4 GiB free < 6 GiB owed
			want: want{used: []uint64{6 * gib, 2 * gib}, over: []bool{true, false}, preempt: []string{"pl"}, need: 6 * gib},
		},
		{
			name: "high over its share is reported, never chosen",
			in: Input{Shares: []Share{share("high", 4*gib, "ph"), share("other", 8*gib, "po")},
				Procs:  []Proc{proc(1, "ph", v1.High, 10*gib), proc(2, "po", v1.Low, gib)},
				Memory: mem(16*gib, 15*gib)},
			want: want{used: []uint64{10 * gib, gib}, over: []bool{true, false}, need: 7 * gib},
		},
		{
			name: "unclassified or unmanaged over: never chosen",
			in: Input{Shares: []Share{share("u", 2*gib, "pu"), share("m", 2*gib, "pm"), share("n", 8*gib, "pn")},
				Procs:  []Proc{proc(1, "pu", v1.Unclassified, 5*gib), proc(2, "pm", v1.Unmanaged, 5*gib), proc(3, "pn", v1.Low, 0)},
				Memory: mem(16*gib, 10*gib)},
			want: want{used: []uint64{5 * gib, 5 * gib, 0}, over: []bool{true, true, false}, need: 8 * gib},
		},
		{
			name: "a pod with a low and a high process is not low",
			in: Input{Shares: []Share{share("mixed", 2*gib, "px"), share("n", 8*gib, "pn")},
				Procs:  []Proc{proc(1, "px", v1.Low, 5*gib), proc(2, "px", v1.High, 0)},
				Memory: mem(16*gib, 15*gib)},
			want: want{used: []uint64{5 * gib, 0}, over: []bool{true, false}, need: 8 * gib},
		},
		{
			name: "largest overage first, only as many as the need takes",
			in: Input{Shares: []Share{share("a", 2*gib, "pa"), share("b", 2*gib, "pb"), share("c", 2*gib, "pc"), share("n", 6*gib, "pn")},
				Procs: []Proc{proc(1, "pa", v1.Low, 3*gib), proc(2, "pb", v1.Low, 6*gib), proc(3, "pc", v1.Low, 4*gib),
					proc(4, "pn", v1.High, gib)},
				Memory: mem(16*gib, 14*gib)}, // owed 5, free 2: 3 GiB more; pb frees 6
			want: want{used: []uint64{3 * gib, 6 * gib, 4 * gib, gib}, over: []bool{true, true, true, false}, preempt: []string{"pb"}, need: 5 * gib},
		},
		{
			name: "several chosen when one does not cover the need",
			in: Input{Shares: []Share{share("a", 1*gib, "pa"), share("b", 1*gib, "pb"), share("n", 12*gib, "pn")},
				Procs:  []Proc{proc(1, "pa", v1.Low, 2*gib), proc(2, "pb", v1.Low, 3*gib), proc(3, "pn", v1.High, 0)},
				Memory: mem(16*gib, 15*gib)}, // owed 12, free 1: 11 more; pb 3 + pa 2 < 11: both
			want: want{used: []uint64{2 * gib, 3 * gib, 0}, over: []bool{true, true, false}, preempt: []string{"pb", "pa"}, need: 12 * gib},
		},
		{
			name: "without the GPU's memory nothing is preempted",
			in: Input{Shares: []Share{share("low", 4*gib, "pl"), share("high", 8*gib, "ph")},
				Procs: []Proc{proc(1, "pl", v1.Low, 6*gib), proc(2, "ph", v1.High, 2*gib)}},
			want: want{used: []uint64{6 * gib, 2 * gib}, over: []bool{true, false}, need: 6 * gib},
		},
		{
			name: "a whole-GPU owner in no share is a conflict, never chosen",
			in: Input{Shares: []Share{share("s", 4*gib, "ps")},
				Procs:  []Proc{proc(1, "owner", v1.Low, 14*gib), proc(2, "", v1.Unmanaged, gib), proc(3, "ps", v1.High, 0)},
				Memory: mem(16*gib, 15*gib)},
			want: want{used: []uint64{0}, over: []bool{false}, need: 4 * gib, conf: []int{1, 2}},
		},
		{
			name: "processes of one pod add up; a share for two pods counts both",
			in: Input{Shares: []Share{share("pair", 4*gib, "p1", "p2"), share("n", 4*gib, "pn")},
				Procs:  []Proc{proc(1, "p1", v1.Low, 2*gib), proc(2, "p1", v1.Low, gib), proc(3, "p2", v1.Low, 2*gib)},
				Memory: mem(16*gib, 14*gib)},
			want: want{used: []uint64{5 * gib, 0}, over: []bool{true, false}, preempt: []string{"p1", "p2"}, need: 4 * gib},
		},
		{
			name: "two claims of one pod on one GPU are judged together",
			in: Input{Shares: []Share{share("a", 2*gib, "p"), share("b", 3*gib, "p")},
				Procs:  []Proc{proc(1, "p", v1.Low, 4*gib)},
				Memory: mem(16*gib, 4*gib)},
			want: want{used: []uint64{4 * gib, 4 * gib}, over: []bool{false, false}, need: gib},
		},
		{
			name: "a pod within its share needs no more than it was promised",
			in: Input{Shares: []Share{share("low", 4*gib, "pl"), share("n", 4*gib, "pn")},
				Procs:  []Proc{proc(1, "pl", v1.Low, 6*gib), proc(2, "pn", v1.High, 4*gib)},
				Memory: mem(16*gib, 16*gib)}, // pn used all it was given: owed nothing
			want: want{used: []uint64{6 * gib, 4 * gib}, over: []bool{true, false}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := Judge(tc.in)
			if len(j.Uses) != len(tc.in.Shares) {
				t.Fatalf("%d uses for %d shares", len(j.Uses), len(tc.in.Shares))
			}
			for i, u := range j.Uses {
				if u.Used != tc.want.used[i] || u.Over != tc.want.over[i] {
					t.Errorf("share %s: used %d over %v, want %d %v", u.ClaimName, u.Used, u.Over, tc.want.used[i], tc.want.over[i])
				}
				if u.Preempt != slices.ContainsFunc(u.Pods, func(p PodRef) bool { return slices.Contains(tc.want.preempt, p.UID) }) {
					t.Errorf("share %s: preempt %v", u.ClaimName, u.Preempt)
				}
			}
			if !slices.Equal(j.Preempt, tc.want.preempt) {
				t.Errorf("preempt %v, want %v", j.Preempt, tc.want.preempt)
			}
			if j.Need != tc.want.need {
				t.Errorf("need %d, want %d", j.Need, tc.want.need)
			}
			var conf []int
			for _, c := range j.Conflicts {
				conf = append(conf, c.PID)
			}
			if !slices.Equal(conf, tc.want.conf) {
				t.Errorf("conflicts %v, want %v", conf, tc.want.conf)
			}
		})
	}
}

// FuzzJudge: whatever the shares, processes and memory, only low-priority
// pods are chosen, over their share unless a high sharer's need chose
// them (the shared/high row), only when the GPU's free memory is short of
// the need, and every share gets one verdict.
func FuzzJudge(f *testing.F) {
	f.Add([]byte{4, 6, 1, 8, 2, 3, 16, 12})
	f.Add([]byte{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		prios := []v1.Priority{v1.Low, v1.High, v1.Unmanaged, v1.Unclassified, "", "bogus"}
		pods := []string{"p0", "p1", "p2", "p3", ""}
		var in Input
		i := 0
		next := func() uint64 {
			if i+2 > len(data) {
				i = len(data)
				return 0
			}
			v := uint64(binary.LittleEndian.Uint16(data[i:]))
			i += 2
			return v
		}
		if len(data) > 0 && data[0]%3 != 0 {
			tot := next() * gib / 64
			in.Memory = &Memory{Total: tot, Used: next() * gib / 64}
		}
		for n := next() % 5; n > 0; n-- {
			s := share("c", next()*gib/64)
			for k := next() % 3; k > 0; k-- {
				s.Pods = append(s.Pods, PodRef{UID: pods[next()%uint64(len(pods))]})
			}
			in.Shares = append(in.Shares, s)
		}
		for i < len(data) {
			in.Procs = append(in.Procs, Proc{PID: i, PodUID: pods[next()%uint64(len(pods))],
				Priority: prios[next()%uint64(len(prios))], Memory: next() * gib / 64})
		}
		j := Judge(in)
		if len(j.Uses) != len(in.Shares) {
			t.Fatalf("%d uses for %d shares", len(j.Uses), len(in.Shares))
		}
		if len(j.Preempt) > 0 && (in.Memory == nil || j.Free >= j.Need) {
			t.Fatalf("preempted %v with free %d ≥ need %d (memory %v)", j.Preempt, j.Free, j.Need, in.Memory)
		}
		highSharer := false
		for _, u := range j.Uses {
			highSharer = highSharer || u.Priority == v1.High
		}
		for _, u := range j.Uses {
			if !u.Preempt {
				continue
			}
			if u.Priority != v1.Low {
				t.Fatalf("chose share %+v: not a low pod", u)
			}
			if !u.Over && (u.Rule != preempt.RuleSharedHigh || !highSharer) {
				t.Fatalf("chose share %+v: within its share, and not for a high sharer's need", u)
			}
		}
		for _, uid := range j.Preempt {
			for _, p := range in.Procs {
				if p.PodUID == uid && p.Priority != v1.Low {
					t.Fatalf("chose pod %s with a %s process", uid, p.Priority)
				}
			}
		}
	})
}

// Sharers are judged by class: a high sharer's need preempts the low
// sharers over their share first, and only then, while its need is not
// covered, a low sharer within its share; each choice names its row.
func TestJudgeHighSharerNeedPreemptsLowSharers(t *testing.T) {
	// The case: the low sharer 2 GiB over its share, the GPU full,
	// the high sharer 2 GiB short of its share.
	in := Input{Shares: []Share{share("in", 4*gib, "pin"), share("over", 4*gib, "pover"), share("high", 8*gib, "ph")},
		Procs:  []Proc{proc(1, "pin", v1.Low, 4*gib), proc(2, "pover", v1.Low, 6*gib), proc(3, "ph", v1.High, 6*gib)},
		Memory: mem(16*gib, 16*gib)}
	j := Judge(in)
	if !slices.Equal(j.Preempt, []string{"pover"}) || j.Rules["pover"] != preempt.RuleSharedHigh || j.Uses[0].Preempt || !j.Uses[1].Preempt || j.Uses[1].Rule != preempt.RuleSharedHigh {
		t.Fatalf("preempt %v rules %v uses %+v: want only the over-share low, under the high row", j.Preempt, j.Rules, j.Uses)
	}
	// No low sharer over its share: the high need takes the in-share low.
	in.Procs[1].Memory = 4 * gib
	in.Procs[2].Memory = 0
	in.Memory = mem(16*gib, 12*gib) // 4 GiB free, the high sharer owed 8
	j = Judge(in)
	if !slices.Equal(j.Preempt, []string{"pin"}) || j.Rules["pin"] != preempt.RuleSharedHigh {
		t.Fatalf("preempt %v rules %v: want the larger in-share low (ties by UID) under the high row", j.Preempt, j.Rules)
	}
	// The same need from a low sharer preempts no one within its share.
	in.Procs[2].Priority = v1.Low
	if j = Judge(in); len(j.Preempt) != 0 {
		t.Fatalf("a low sharer's need preempted %v, within their shares", j.Preempt)
	}
}
