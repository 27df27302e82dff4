package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const containerID = "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"

// eventClient returns a fake clientset that, like the API server, names an
// Event from its GenerateName (the fake tracker would store every event of
// a namespace under the name "" and refuse the second).
func eventClient() *fake.Clientset {
	cs := fake.NewClientset()
	var n atomic.Int64
	cs.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if ev, ok := a.(k8stesting.CreateActionImpl).GetObject().(*corev1.Event); ok && ev.Name == "" && ev.GenerateName != "" {
			ev.Name = fmt.Sprintf("%s%05d", ev.GenerateName, n.Add(1))
		}
		return false, nil, nil // on to the tracker
	})
	return cs
}

type eventsFixture struct {
	cs  *fake.Clientset
	reg *workload.Registry
	ev  *Events
	log *testutil.Buffer
}

// The registry knows a victim pod (ml/batch), a preemptor pod in another
// namespace (prod/trainer) and a sentinel pod used to know that earlier
// records have been handled (the queue is handled in order).
var (
	victimPod    = workload.Workload{PodUID: uid(1), Namespace: "ml", Name: "batch", TaskID: "ml/batch", Priority: occupancy.Low}
	preemptorPod = workload.Workload{PodUID: uid(2), Namespace: "prod", Name: "trainer", TaskID: "prod/trainer", Priority: occupancy.High}
	sentinelPod  = workload.Workload{PodUID: uid(3), Namespace: "sentinel", Name: "s", TaskID: "sentinel/s", Priority: occupancy.Low}
)

func newEventsFixture(t *testing.T) *eventsFixture {
	t.Helper()
	reg := &workload.Registry{}
	for _, w := range []workload.Workload{victimPod, preemptorPod, sentinelPod} {
		reg.Put(w)
	}
	// A Docker container is not a pod: no event can name it.
	reg.Put(workload.Workload{ContainerID: containerID, Name: "docker-job", Priority: occupancy.Low})
	cs := eventClient()
	log := &testutil.Buffer{}
	return &eventsFixture{cs: cs, reg: reg, log: log,
		ev: NewEvents(cs, reg, thisNode, slog.New(slog.NewTextHandler(log, nil)))}
}

func (f *eventsFixture) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.ev.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Events.Run did not return after its context ended")
		}
	})
}

func (f *eventsFixture) events(t *testing.T, ns string) []corev1.Event {
	t.Helper()
	l, err := f.cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// drain records a deny on the sentinel pod and waits for its event: every
// record queued before it has been handled by then.
func (f *eventsFixture) drain(t *testing.T) {
	t.Helper()
	before := len(f.events(t, sentinelPod.Namespace))
	f.ev.Record(preempt.Record{ID: "sentinel", Action: preempt.ActionDeny, Victim: preempt.Party{PodUID: sentinelPod.PodUID, PID: 1}})
	testutil.Eventually(t, 5*time.Second, "the sentinel record's event", func() bool {
		return len(f.events(t, sentinelPod.Namespace)) > before
	})
}

// one returns the single event of a namespace.
func (f *eventsFixture) one(t *testing.T, ns string) corev1.Event {
	t.Helper()
	evs := f.events(t, ns)
	if len(evs) != 1 {
		t.Fatalf("%d events in %s, want 1: %+v", len(evs), ns, evs)
	}
	return evs[0]
}

func checkEvent(t *testing.T, ev corev1.Event, on workload.Workload, typ, reason string, msgHas ...string) {
	t.Helper()
	io := ev.InvolvedObject
	if io.Kind != "Pod" || io.APIVersion != "v1" || io.Namespace != on.Namespace || io.Name != on.Name || string(io.UID) != on.PodUID {
		t.Errorf("event %s involves %+v, want pod %s/%s %s", ev.Reason, io, on.Namespace, on.Name, on.PodUID)
	}
	if ev.Namespace != on.Namespace || !strings.HasPrefix(ev.Name, on.Name+".gpud.") {
		t.Errorf("event stored as %s/%s, want in %s named %s.gpud.*", ev.Namespace, ev.Name, on.Namespace, on.Name)
	}
	if ev.Type != typ || ev.Reason != reason {
		t.Errorf("event %s/%s, want %s/%s", ev.Type, ev.Reason, typ, reason)
	}
	if ev.Source.Component != "gpud" || ev.Source.Host != thisNode || ev.Count != 1 || ev.FirstTimestamp.IsZero() {
		t.Errorf("event source %+v count %d first %v", ev.Source, ev.Count, ev.FirstTimestamp)
	}
	for _, s := range msgHas {
		if !strings.Contains(ev.Message, s) {
			t.Errorf("%s message %q lacks %q", reason, ev.Message, s)
		}
	}
}

func TestEventsKillPostsOnVictimAndPreemptor(t *testing.T) {
	f := newEventsFixture(t)
	f.run(t)
	f.ev.Record(preempt.Record{ID: "r1", GPU: 3, Action: preempt.ActionKill, Result: "done",
		Victim:    preempt.Party{PID: 4242, PodUID: victimPod.PodUID},
		Preemptor: preempt.Party{PID: 77, PodUID: preemptorPod.PodUID}})
	f.drain(t)
	checkEvent(t, f.one(t, "ml"), victimPod, corev1.EventTypeWarning, "GPUPreempted",
		"process 4242", "GPU 3", "pod prod/trainer", "(done)")
	checkEvent(t, f.one(t, "prod"), preemptorPod, corev1.EventTypeNormal, "GPUPreemptedOther",
		"pod ml/batch", "GPU 3")
}

func TestEventsDenyPostsOnlyOnVictim(t *testing.T) {
	f := newEventsFixture(t)
	f.run(t)
	f.ev.Record(preempt.Record{ID: "r1", GPU: 1, Action: preempt.ActionDeny,
		Victim:    preempt.Party{PID: 4242, PodUID: victimPod.PodUID},
		Preemptor: preempt.Party{PID: 77, PodUID: preemptorPod.PodUID}})
	f.drain(t)
	checkEvent(t, f.one(t, "ml"), victimPod, corev1.EventTypeWarning, "GPUOpenDenied", "process 4242", "GPU 1")
	if evs := f.events(t, "prod"); len(evs) != 0 {
		t.Errorf("a deny posted %d events on the holder's pod: %+v", len(evs), evs)
	}
}

func TestEventsReclaimPostsOnBoth(t *testing.T) {
	f := newEventsFixture(t)
	f.run(t)
	f.ev.Record(preempt.Record{ID: "r1", GPU: 0, Action: preempt.ActionReclaim, Result: "evicted",
		Victim:    preempt.Party{PodUID: victimPod.PodUID},
		Preemptor: preempt.Party{PodUID: preemptorPod.PodUID}})
	f.drain(t)
	checkEvent(t, f.one(t, "ml"), victimPod, corev1.EventTypeWarning, "GPUReclaimed", "evicted", "GPU 0", "pod prod/trainer")
	checkEvent(t, f.one(t, "prod"), preemptorPod, corev1.EventTypeNormal, "GPUReclaimedOther", "pod ml/batch", "GPU 0")
}

// A preemptor that is not a known pod is described by what the record knows
// of it: a container (short id), else a process.
func TestEventsDescribeNonPodPreemptor(t *testing.T) {
	f := newEventsFixture(t)
	f.run(t)
	f.ev.Record(preempt.Record{ID: "r1", GPU: 0, Action: preempt.ActionKill,
		Victim: preempt.Party{PID: 1, PodUID: victimPod.PodUID}, Preemptor: preempt.Party{PID: 9, ContainerID: containerID}})
	f.ev.Record(preempt.Record{ID: "r2", GPU: 0, Action: preempt.ActionKill,
		Victim: preempt.Party{PID: 2, PodUID: victimPod.PodUID}, Preemptor: preempt.Party{PID: 9}})
	f.ev.Record(preempt.Record{ID: "r3", GPU: 0, Action: preempt.ActionKill,
		Victim: preempt.Party{PID: 3, PodUID: victimPod.PodUID}, Preemptor: preempt.Party{PodUID: uid(99)}})
	f.drain(t)
	want := map[string]string{"process 1 ": "container " + containerID[:12], "process 2 ": "process 9", "process 3 ": "a high-priority holder"}
	evs := f.events(t, "ml")
	if len(evs) != len(want) {
		t.Fatalf("%d events on the victim, want %d", len(evs), len(want))
	}
	for _, ev := range evs {
		for victim, pre := range want {
			if strings.Contains(ev.Message, victim) && !strings.Contains(ev.Message, "for "+pre+" ") {
				t.Errorf("message %q does not describe the preemptor as %q", ev.Message, pre)
			}
		}
		if strings.Contains(ev.Message, containerID) {
			t.Errorf("message %q carries the full container id", ev.Message)
		}
	}
}

func TestEventsForUnknownPodsPostNothing(t *testing.T) {
	f := newEventsFixture(t)
	// A pod known by uid only (a CRI sandbox without metadata): there is no
	// name to post an event on.
	f.reg.Put(workload.Workload{PodUID: uid(4), Priority: occupancy.Low})
	f.run(t)
	for _, r := range []preempt.Record{
		{ID: "r0", Action: preempt.ActionKill, Victim: preempt.Party{PID: 1, PodUID: uid(4)}, Preemptor: preempt.Party{PID: 2, PodUID: uid(4)}},
		// Pods gpud does not know (never seen, or already gone).
		{ID: "r1", Action: preempt.ActionKill, Victim: preempt.Party{PID: 1, PodUID: uid(90)}, Preemptor: preempt.Party{PID: 2, PodUID: uid(91)}},
		// Docker containers: no pod to post on, though the registry knows them.
		{ID: "r2", Action: preempt.ActionKill, Victim: preempt.Party{PID: 1, ContainerID: containerID}, Preemptor: preempt.Party{PID: 2}},
		// Known pods, but an action gpud posts nothing for.
		{ID: "r3", Action: "resumed", Victim: preempt.Party{PID: 1, PodUID: victimPod.PodUID}, Preemptor: preempt.Party{PodUID: preemptorPod.PodUID}},
	} {
		f.ev.Record(r)
	}
	f.drain(t)
	all, err := f.cs.CoreV1().Events(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 1 || all.Items[0].Namespace != sentinelPod.Namespace {
		t.Errorf("records naming no known pod posted events: %+v", all.Items)
	}
}

func TestEventsFullQueueDropsWithoutBlocking(t *testing.T) {
	f := newEventsFixture(t)
	capacity := cap(f.ev.queue)
	const extra = 10
	// Run is not started: nothing drains the queue, as with an API server
	// that does not answer.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < capacity+extra; i++ {
			f.ev.Record(preempt.Record{ID: fmt.Sprintf("r%d", i), GPU: 0, Action: preempt.ActionDeny,
				Victim: preempt.Party{PID: i + 1, PodUID: victimPod.PodUID}})
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Record blocked on a full queue")
	}
	if n := strings.Count(f.log.String(), "event queue full"); n != extra {
		t.Errorf("%d drops logged, want %d:\n%s", n, extra, f.log.String())
	}
	if !strings.Contains(f.log.String(), fmt.Sprintf("record_id=r%d", capacity)) {
		t.Errorf("the first dropped record is not named in the log:\n%s", f.log.String())
	}

	// Once posting resumes, the queued records are posted, the dropped
	// ones are not, and new ones are accepted again.
	f.run(t)
	testutil.Eventually(t, 10*time.Second, "the queued events posted", func() bool { return len(f.events(t, "ml")) >= capacity })
	f.drain(t)
	if n := len(f.events(t, "ml")); n != capacity {
		t.Errorf("%d events posted, want %d (the queue's capacity)", n, capacity)
	}
}

// A record naming neither pod is not queued at all: it cannot take a slot
// from one that can be posted.
func TestEventsRecordWithoutPodsIsNotQueued(t *testing.T) {
	f := newEventsFixture(t)
	for i := 0; i < cap(f.ev.queue)+5; i++ {
		f.ev.Record(preempt.Record{ID: "docker", Action: preempt.ActionKill,
			Victim: preempt.Party{PID: 1, ContainerID: containerID}, Preemptor: preempt.Party{PID: 2}})
	}
	if n := len(f.ev.queue); n != 0 {
		t.Errorf("%d pod-less records queued", n)
	}
	if strings.Contains(f.log.String(), "event queue full") {
		t.Error("pod-less records filled the queue")
	}
}

func TestEventsPostFailureIsLoggedAndDoesNotStop(t *testing.T) {
	f := newEventsFixture(t)
	var fails atomic.Int64
	fails.Store(1)
	f.cs.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if fails.Add(-1) >= 0 {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "", errors.New("no RBAC"))
		}
		return false, nil, nil
	})
	f.run(t)
	f.ev.Record(preempt.Record{ID: "r1", Action: preempt.ActionDeny, Victim: preempt.Party{PID: 1, PodUID: victimPod.PodUID}})
	f.ev.Record(preempt.Record{ID: "r2", Action: preempt.ActionDeny, Victim: preempt.Party{PID: 2, PodUID: victimPod.PodUID}})
	f.drain(t)
	ev := f.one(t, "ml")
	if !strings.Contains(ev.Message, "process 2 ") {
		t.Errorf("the event posted is %q, want the second record's", ev.Message)
	}
	if l := f.log.String(); !strings.Contains(l, "posting event") || !strings.Contains(l, "pod=ml/batch") || !strings.Contains(l, "no RBAC") {
		t.Errorf("the failed post is not logged with its pod and error:\n%s", l)
	}
}

// A pod over its GPU memory share is warned on the pod; a kill under the
// share rule says why on both pods; a pod gpud cannot name gets nothing.
func TestEventsShareOverAndShareKill(t *testing.T) {
	f := newEventsFixture(t)
	f.run(t)
	f.ev.Warn(uid(9), "GPUMemoryOverShare", "unknown pod")
	f.ev.Warn(victimPod.PodUID, "GPUMemoryOverShare", "this pod uses 6442450944 bytes of GPU 0's memory, over the 4294967296 bytes of its claim ml/c")
	testutil.Eventually(t, 5*time.Second, "the warning on the pod", func() bool { return len(f.events(t, "ml")) == 1 })
	checkEvent(t, f.one(t, "ml"), victimPod, corev1.EventTypeWarning, "GPUMemoryOverShare", "over the 4294967296 bytes")
	f.ev.Record(preempt.Record{ID: "r1", GPU: 0, Action: preempt.ActionKill, Rule: sharing.Rule, Result: "done",
		Victim:    preempt.Party{PID: 4242, PodUID: victimPod.PodUID},
		Preemptor: preempt.Party{PID: 77, PodUID: preemptorPod.PodUID}})
	f.drain(t)
	evs := f.events(t, "ml")
	if len(evs) != 2 {
		t.Fatalf("%d events on the victim, want the warning and the kill", len(evs))
	}
	for _, ev := range evs {
		if ev.Reason != "GPUMemoryOverShare" {
			checkEvent(t, ev, victimPod, corev1.EventTypeWarning, "GPUMemoryShareExceeded", "process 4242", "over its GPU memory share", "pod prod/trainer")
		}
	}
	checkEvent(t, f.one(t, "prod"), preemptorPod, corev1.EventTypeNormal, "GPUMemoryShareReturned", "pod ml/batch", "GPU 0")
}
