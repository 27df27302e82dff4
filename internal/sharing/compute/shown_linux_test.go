package compute

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
	"github.com/gpud/gpud/internal/workload/kube"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The state document shows each sharing pod once on its GPU: target,
// measured share, throttled time, and, for the pod the scheduler holds
// frozen, that it is and why; explain's Share is the same record.
func TestDecorateShowsEachPodsShare(t *testing.T) {
	c, fz, _ := newTestController(t, 25, 75)
	now := time.Unix(1000, 0)
	c.refresh(now)
	now = tickFor(c, now, 100)
	f := v1.StateFile{GPUs: []v1.StateGPU{{Index: 0}, {Index: 1}}}
	c.Decorate(&f)
	if len(f.GPUs[1].ComputeShares) != 0 {
		t.Errorf("GPU 1 shares no compute, shows %+v", f.GPUs[1].ComputeShares)
	}
	cs := f.GPUs[0].ComputeShares
	if len(cs) != 2 || cs[0].PodName != "pod-0" || cs[0].PodNamespace != "ns" || cs[0].TargetPercent != 25 || cs[1].TargetPercent != 75 {
		t.Fatalf("compute shares %+v", cs)
	}
	frozen := 0
	for _, s := range cs {
		if s.ThrottledSeconds <= 0 || s.UsedPercent <= 0 {
			t.Errorf("%s: no throttled time or measured share after 2 s of sharing: %+v", s.PodName, s)
		}
		if fz.frozen[Cgroup{Kind: "freezer.state", Path: fmt.Sprintf("/sys/fs/cgroup/freezer/pod%d", 100+int(s.PodName[len(s.PodName)-1]-'0'))}] != s.Frozen {
			t.Errorf("%s shown frozen %v, the freezer says otherwise", s.PodName, s.Frozen)
		}
		switch {
		case s.Frozen:
			frozen++
			if s.State != string(Waiting) || !strings.HasPrefix(s.Why, "waiting for its turn") {
				t.Errorf("frozen pod %s: state %q why %q", s.PodName, s.State, s.Why)
			}
		case s.State != string(Running) || !strings.HasPrefix(s.Why, "holds the token"):
			t.Errorf("thawed pod %s: state %q why %q", s.PodName, s.State, s.Why)
		}
	}
	if frozen != 1 {
		t.Errorf("%d pods shown frozen, want 1: %+v", frozen, cs)
	}
	got, ok := c.Share(0, cs[0].PodUID)
	if !ok || got != cs[0] {
		t.Errorf("Share(0, %s) = %+v, %v; want %+v", cs[0].PodUID, got, ok, cs[0])
	}
	if _, ok := c.Share(1, cs[0].PodUID); ok {
		t.Error("a share on GPU 1, which the pod does not share")
	}
	var nilC *Controller
	nilC.Decorate(&f)
	if _, ok := nilC.Share(0, "x"); ok {
		t.Error("a nil Controller has a share")
	}

	// Enforcement off: nothing frozen, and the pod the scheduler would
	// freeze says so.
	c.cfg.Enforcing = func() bool { return false }
	c.tick(now)
	f = v1.StateFile{GPUs: []v1.StateGPU{{Index: 0}}}
	c.Decorate(&f)
	would := 0
	for _, s := range f.GPUs[0].ComputeShares {
		if s.Frozen {
			t.Errorf("%s shown frozen with enforcement off", s.PodName)
		}
		if strings.HasPrefix(s.Why, "enforcement off") {
			would++
		}
	}
	if would != 1 {
		t.Errorf("%d pods say enforcement off, want 1: %+v", would, f.GPUs[0].ComputeShares)
	}
}

// Each state's words: the hard cap, a freeze for another GPU, idle and
// exempt pods.
func TestShownWhy(t *testing.T) {
	for _, tc := range []struct {
		ps        PodShare
		enforcing bool
		want      string
	}{
		{PodShare{PodStatus: PodStatus{State: Capped, Target: 30, HardCap: true}, Frozen: true}, true, "hard cap reached: it used its 30% of the GPU"},
		{PodShare{PodStatus: PodStatus{State: Running}, Frozen: true}, true, "frozen for its share of another GPU"},
		{PodShare{PodStatus: PodStatus{State: Idle}}, true, "no work seen"},
		{PodShare{PodStatus: PodStatus{State: Exempted}}, true, "high priority"},
		{PodShare{PodStatus: PodStatus{State: Capped}}, false, "enforcement off (--enforce=false): the scheduler would freeze it now (capped)"},
		{PodShare{PodStatus: PodStatus{State: Waiting}}, true, "the scheduler has decided to freeze it"},
	} {
		if got := Shown(tc.ps, tc.enforcing); !strings.HasPrefix(got.Why, tc.want) || got.State != string(tc.ps.State) || got.Frozen != tc.ps.Frozen {
			t.Errorf("%+v (enforcing %v): %+v, want why %q", tc.ps, tc.enforcing, got, tc.want)
		}
	}
	if got := Shown(PodShare{PodStatus: PodStatus{Share: 28.46, Throttled: 1234567 * time.Microsecond}}, true); got.UsedPercent != 28.5 || got.ThrottledSeconds != 1.235 {
		t.Errorf("rounded: used %v throttled %v", got.UsedPercent, got.ThrottledSeconds)
	}
}

// fakeScheduler is a Notifier's scheduler whose snapshot the test sets.
type fakeScheduler struct {
	mu        sync.Mutex
	snap      []GPUStatus
	enforcing bool
}

func (f *fakeScheduler) Snapshot() []GPUStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

func (f *fakeScheduler) Enforcing() bool { return f.enforcing }

func (f *fakeScheduler) set(p PodShare) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.snap = []GPUStatus{{GPU: 0, Pods: []PodShare{p}}}
}

// The Events a throttled and a capped pod get through kube.Events and the
// API server (a fake clientset), the clock the test's: the first
// throttling and the cap at once, then at most one per reason every
// EventEvery, however many slices it is frozen for; none while
// enforcement is off.
func TestNotifierEventsRateLimited(t *testing.T) {
	cs := fake.NewClientset()
	var n atomic.Int64
	cs.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if ev, ok := a.(k8stesting.CreateActionImpl).GetObject().(*corev1.Event); ok && ev.Name == "" {
			ev.Name = fmt.Sprintf("%s%05d", ev.GenerateName, n.Add(1)) // as the API server names it
		}
		return false, nil, nil
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := &workload.Registry{}
	reg.Put(workload.Workload{PodUID: "uid-a", Namespace: "team", Name: "a", TaskID: "team/a", Priority: occupancy.Low, CgroupID: 7})
	ev := kube.NewEvents(cs, reg, "node-1", log)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ev.Run(ctx)
	events := func() []corev1.Event {
		l, err := cs.CoreV1().Events("team").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	byReason := func(want map[string]int) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, fmt.Sprintf("events %v", want), func() bool {
			got := map[string]int{}
			for _, e := range events() {
				got[e.Reason]++
			}
			return fmt.Sprint(got) == fmt.Sprint(want)
		})
	}

	sch := &fakeScheduler{enforcing: true}
	nt := &Notifier{Scheduler: sch, Events: ev}
	now := time.Unix(5000, 0)
	pod := PodShare{PodStatus: PodStatus{UID: "uid-a", Target: 30, State: Running, Share: 35}, Namespace: "team", Name: "a"}
	sch.set(pod)
	nt.Observe(now) // never frozen yet
	// Ten minutes of looks a second apart, frozen between each.
	for i := 1; i <= 600; i++ {
		now = now.Add(time.Second)
		pod.Throttled += 300 * time.Millisecond
		pod.State = Waiting
		sch.set(pod)
		nt.Observe(now)
		if i == 1 {
			byReason(map[string]int{ReasonThrottled: 1})
			e := events()[0]
			if e.Type != corev1.EventTypeNormal || e.InvolvedObject.Name != "a" || !strings.Contains(e.Message, "GPU 0") || !strings.Contains(e.Message, "target is 30%") {
				t.Errorf("event %s %s on %s: %q", e.Type, e.Reason, e.InvolvedObject.Name, e.Message)
			}
		}
		if i == 300 {
			pod.State, pod.HardCap = Capped, true
			sch.set(pod)
			nt.Observe(now)
			nt.Observe(now.Add(time.Millisecond))
			pod.State = Waiting
		}
	}
	byReason(map[string]int{ReasonThrottled: 1, ReasonCapped: 1})

	// Frozen on: EventEvery after the first, the next Event.
	now = now.Add(time.Second)
	pod.Throttled += time.Second
	sch.set(pod)
	nt.Observe(now)
	byReason(map[string]int{ReasonThrottled: 2, ReasonCapped: 1})

	// Enforcement off: the scheduler freezes nothing, and says nothing.
	sch.enforcing = false
	now = now.Add(time.Hour)
	pod.Throttled += time.Second
	pod.State = Capped
	sch.set(pod)
	nt.Observe(now)
	time.Sleep(100 * time.Millisecond)
	byReason(map[string]int{ReasonThrottled: 2, ReasonCapped: 1})
}

// NewNotifier: none without a scheduler or an API server (a nil
// *kube.Events); a nil Notifier's Run returns at once.
func TestNewNotifierNil(t *testing.T) {
	c, _, _ := newTestController(t, 50)
	var none *kube.Events
	if NewNotifier(c, none) != nil || NewNotifier(nil, &kube.Events{}) != nil {
		t.Error("a notifier without a scheduler or Events")
	}
	if NewNotifier(c, &kube.Events{}) == nil {
		t.Error("no notifier with both")
	}
	(*Notifier)(nil).Run(context.Background())
}
