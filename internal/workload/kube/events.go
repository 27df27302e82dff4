package kube

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/workload"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Events posts a core/v1 Event on each pod a preemption record names:
// the victim's and the preemptor's, each naming the GPU and the other party.
// Posting is asynchronous and bounded: a slow API server never delays a kill.
type Events struct {
	client kubernetes.Interface
	reg    *workload.Registry
	node   string
	log    *slog.Logger
	queue  chan preempt.Record
	notes  chan note
}

// note is an Event on one pod that no preemption record carries (a pod
// over its GPU memory share).
type note struct {
	podUID, typ, reason, msg string
}

func NewEvents(c kubernetes.Interface, reg *workload.Registry, node string, log *slog.Logger) *Events {
	return &Events{client: c, reg: reg, node: node, log: log, queue: make(chan preempt.Record, 256), notes: make(chan note, 64)}
}

// Warn queues a Warning Event on the pod podUID; a pod gpud does not know
// by name gets none, and when the queue is full it is dropped (the log and
// the metrics keep what it said). A nil Events (no API server) posts none.
func (p *Events) Warn(podUID, reason, msg string) {
	if p == nil || podUID == "" {
		return
	}
	select {
	case p.notes <- note{podUID: podUID, typ: corev1.EventTypeWarning, reason: reason, msg: msg}:
	default:
		p.log.Warn("event queue full: event dropped", "pod_uid", podUID, "reason", reason)
	}
}

// Note queues a Normal Event on the pod podUID, as Warn queues a Warning.
func (p *Events) Note(podUID, reason, msg string) {
	if p == nil || podUID == "" {
		return
	}
	select {
	case p.notes <- note{podUID: podUID, typ: corev1.EventTypeNormal, reason: reason, msg: msg}:
	default:
		p.log.Warn("event queue full: event dropped", "pod_uid", podUID, "reason", reason)
	}
}

// Record queues a record's events; when the queue is full they are dropped
// (the journal keeps the record). A nil Events (no API server) posts none.
func (p *Events) Record(r preempt.Record) {
	if p == nil || r.Victim.PodUID == "" && r.Preemptor.PodUID == "" {
		return
	}
	select {
	case p.queue <- r:
	default:
		p.log.Warn("event queue full: events dropped", "record_id", r.ID)
	}
}

func (p *Events) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-p.queue:
			p.post(ctx, r)
		case n := <-p.notes:
			if w, ok := p.pod(n.podUID); ok {
				p.Create(ctx, w, n.typ, n.reason, n.msg)
			}
		}
	}
}

func (p *Events) pod(uid string) (workload.Workload, bool) {
	if uid == "" {
		return workload.Workload{}, false
	}
	w, ok := p.reg.Lookup(occupancy.ProcInfo{PodUID: uid})
	return w, ok && w.Name != ""
}

func describe(w workload.Workload, ok bool, pt preempt.Party) string {
	if ok {
		return fmt.Sprintf("pod %s/%s", w.Namespace, w.Name)
	}
	if pt.ContainerID != "" {
		return "container " + ShortID(pt.ContainerID)
	}
	if pt.PID != 0 {
		return fmt.Sprintf("process %d", pt.PID)
	}
	return "a high-priority holder"
}

func ShortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func (p *Events) post(ctx context.Context, r preempt.Record) {
	victim, vok := p.pod(r.Victim.PodUID)
	pre, pok := p.pod(r.Preemptor.PodUID)
	var vReason, vMsg, pReason, pMsg string
	switch r.Action {
	case preempt.ActionKill:
		if r.Rule == sharing.Rule {
			vReason, vMsg = "GPUMemoryShareExceeded", fmt.Sprintf("gpud killed process %d on GPU %d: this pod was over its GPU memory share and %s needed the memory (%s)", r.Victim.PID, r.GPU, describe(pre, pok, r.Preemptor), r.Result)
			pReason, pMsg = "GPUMemoryShareReturned", fmt.Sprintf("gpud preempted %s, over its GPU memory share on GPU %d, for this pod", describe(victim, vok, r.Victim), r.GPU)
			break
		}
		if r.Rule == preempt.RuleSharedHigh {
			vReason, vMsg = "GPUPreemptedForShare", fmt.Sprintf("gpud killed process %d on GPU %d: %s, a high-priority sharer, needed the memory of its share; this pod was %s (%s)", r.Victim.PID, r.GPU, describe(pre, pok, r.Preemptor), r.Reason, r.Result)
			pReason, pMsg = "GPUMemoryShareReturned", fmt.Sprintf("gpud preempted %s, a low-priority sharer of GPU %d, for this pod", describe(victim, vok, r.Victim), r.GPU)
			break
		}
		vReason, vMsg = "GPUPreempted", fmt.Sprintf("gpud killed process %d on GPU %d for %s (%s)", r.Victim.PID, r.GPU, describe(pre, pok, r.Preemptor), r.Result)
		pReason, pMsg = "GPUPreemptedOther", fmt.Sprintf("gpud preempted %s on GPU %d for this pod", describe(victim, vok, r.Victim), r.GPU)
	case preempt.ActionFreeze:
		vReason, vMsg = "GPUFrozen", fmt.Sprintf("gpud froze this pod (cgroup %s, %s) instead of killing process %d: GPU %d is taken by %s; it is thawed when no high-priority process holds the GPU", r.Cgroup, r.Result, r.Victim.PID, r.GPU, describe(pre, pok, r.Preemptor))
		pReason, pMsg = "GPUFrozeOther", fmt.Sprintf("gpud froze %s on GPU %d for this pod", describe(victim, vok, r.Victim), r.GPU)
	case preempt.ActionThaw:
		vReason, vMsg = "GPUThawed", fmt.Sprintf("gpud thawed this pod (%s): %s", r.Result, r.Rule)
	case preempt.ActionDeny:
		vReason, vMsg = "GPUOpenDenied", fmt.Sprintf("gpud refused process %d an open of GPU %d: held by high priority", r.Victim.PID, r.GPU)
	case preempt.ActionReclaim:
		vReason, vMsg = "GPUReclaimed", fmt.Sprintf("gpud reclaims this pod (%s) after GPU %d was taken for %s", r.Result, r.GPU, describe(pre, pok, r.Preemptor))
		pReason, pMsg = "GPUReclaimedOther", fmt.Sprintf("gpud reclaims %s after GPU %d was taken for this pod", describe(victim, vok, r.Victim), r.GPU)
	default:
		return
	}
	if vok {
		p.Create(ctx, victim, corev1.EventTypeWarning, vReason, vMsg)
	}
	if pok && pReason != "" {
		p.Create(ctx, pre, corev1.EventTypeNormal, pReason, pMsg)
	}
}

func (p *Events) Create(ctx context.Context, w workload.Workload, typ, reason, msg string) {
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: w.Name + ".gpud.", Namespace: w.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: w.Namespace,
			Name: w.Name, UID: types.UID(w.PodUID)},
		Reason: reason, Message: msg, Type: typ, Count: 1,
		FirstTimestamp: now, LastTimestamp: now,
		Source: corev1.EventSource{Component: "gpud", Host: p.node},
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := p.client.CoreV1().Events(w.Namespace).Create(cctx, ev, metav1.CreateOptions{}); err != nil {
		p.log.Warn("posting event", "pod", w.Namespace+"/"+w.Name, "reason", reason, "error", err)
	}
}
