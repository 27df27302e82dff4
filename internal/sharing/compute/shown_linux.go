package compute

import (
	"cmp"
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// Enforcing reports whether the scheduler freezes what it decides
// (--enforce); false for a nil Controller.
func (c *Controller) Enforcing() bool { return c != nil && c.cfg.Enforcing() }

// Decorate adds each GPU's compute shares to the state document: per pod,
// its target, measured share, throttled time, and whether the scheduler
// holds it frozen and why. A nil Controller adds nothing.
func (c *Controller) Decorate(f *v1.StateFile) {
	snap := c.Snapshot()
	if len(snap) == 0 {
		return
	}
	enforcing := c.Enforcing()
	for i := range f.GPUs {
		g := &f.GPUs[i]
		for _, gs := range snap {
			if gs.GPU != g.Index {
				continue
			}
			for _, ps := range gs.Pods {
				g.ComputeShares = append(g.ComputeShares, Shown(ps, enforcing))
			}
			slices.SortFunc(g.ComputeShares, func(a, b v1.StateComputeShare) int {
				return cmp.Or(cmp.Compare(a.PodNamespace, b.PodNamespace), cmp.Compare(a.PodName, b.PodName), cmp.Compare(a.PodUID, b.PodUID))
			})
		}
	}
}

// Share is pod podUID's share of GPU gpu's compute as the state document
// shows it (gpud explain); false when the scheduler has no such pod there.
func (c *Controller) Share(gpu int, podUID string) (v1.StateComputeShare, bool) {
	for _, gs := range c.Snapshot() {
		if gs.GPU != gpu {
			continue
		}
		for _, ps := range gs.Pods {
			if ps.UID == podUID {
				return Shown(ps, c.Enforcing()), true
			}
		}
	}
	return v1.StateComputeShare{}, false
}

// Shown is a pod's status as the state document shows it, with why the
// scheduler holds it frozen or not; enforcing: the scheduler freezes what
// it decides (--enforce).
func Shown(ps PodShare, enforcing bool) v1.StateComputeShare {
	return v1.StateComputeShare{
		PodNamespace: ps.Namespace, PodName: ps.Name, PodUID: ps.UID,
		TargetPercent: ps.Target, HardCap: ps.HardCap,
		UsedPercent: roundTo(ps.Share, 0.1), ThrottledSeconds: roundTo(ps.Throttled.Seconds(), 0.001),
		State: string(ps.State), Frozen: ps.Frozen, Why: why(ps, enforcing),
	}
}

func roundTo(x, unit float64) float64 { return float64(int64(x/unit+0.5)) * unit }

// why says, in words, why the scheduler holds the pod frozen now or not.
func why(ps PodShare, enforcing bool) string {
	would := ps.State == Waiting || ps.State == Capped
	switch {
	case would && !enforcing:
		return fmt.Sprintf("enforcement off (--enforce=false): the scheduler would freeze it now (%s), and freezes nothing", ps.State)
	case ps.Frozen && ps.State == Capped:
		return fmt.Sprintf("hard cap reached: it used its %d%% of the GPU and stays frozen until it is back under it, even with the GPU otherwise idle", ps.Target)
	case ps.Frozen && ps.State == Waiting:
		return fmt.Sprintf("waiting for its turn: busy, and another pod sharing the GPU holds the token (the pod furthest below its target gets the next slice; its target is %d%%)", ps.Target)
	case ps.Frozen:
		return "frozen for its share of another GPU it shares: a pod sharing two GPUs runs only when both let it"
	case would:
		return "the scheduler has decided to freeze it: the freeze is written at its next step"
	case ps.State == Running:
		return "holds the token: it runs for its slice"
	case ps.State == Idle:
		return "no work seen on the GPU: thawed, its share goes to the busy pods"
	case ps.State == Exempted:
		return "high priority (or a system agent): never frozen, only measured"
	}
	return ""
}

// Event reasons: Normal Events, since a pod throttled to what its claim
// asked is the share working as asked; its log and metrics say as much.
const (
	// ReasonThrottled: the pod was frozen while another sharer had its
	// turn (its first time, then at most once every EventEvery).
	ReasonThrottled = "GPUComputeThrottled"
	// ReasonCapped: a hard-capped pod reached its cap.
	ReasonCapped = "GPUComputeCapped"
)

// EventEvery is the least time between two Events of one reason on one
// pod: a pod throttled slice after slice gets one, not one per slice.
const EventEvery = 10 * time.Minute

// Events puts a Normal Event on a pod (kube.Events).
type Events interface {
	Note(podUID, reason, msg string)
}

// Scheduler is what a Notifier watches: the Controller.
type Scheduler interface {
	Snapshot() []GPUStatus
	Enforcing() bool
}

// Notifier puts an Event on a pod the scheduler throttles (ReasonThrottled)
// or caps (ReasonCapped), per pod and reason at most once every Every. It
// looks at the scheduler's snapshot every Poll: a pod's throttled time
// that grew since the last look says it was frozen in between, however
// short the freeze.
type Notifier struct {
	Scheduler Scheduler
	Events    Events
	Clock     Clock
	Every     time.Duration // EventEvery when 0
	Poll      time.Duration // a second when 0

	mu        sync.Mutex
	throttled map[podGPU]time.Duration // at the last look
	last      map[podReason]time.Time  // the last Event
}

type podGPU struct {
	uid string
	gpu int
}

type podReason struct{ uid, reason string }

// NewNotifier returns a Notifier of c's throttling through ev; nil when
// there is no scheduler or no Events (no API server).
func NewNotifier(c *Controller, ev Events) *Notifier {
	if c == nil || ev == nil {
		return nil
	}
	if v := reflect.ValueOf(ev); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil // a nil *kube.Events: no API server
	}
	return &Notifier{Scheduler: c, Events: ev}
}

// Run looks every Poll until ctx ends; a nil Notifier returns at once.
func (n *Notifier) Run(ctx context.Context) {
	if n == nil {
		return
	}
	if n.Clock == nil {
		n.Clock = realClock{}
	}
	poll := cmp.Or(n.Poll, time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.Clock.After(poll):
			n.Observe(n.Clock.Now())
		}
	}
}

// Observe looks at the scheduler once, at now, and puts the Events due.
// Nothing is due while the scheduler freezes nothing (--enforce=false).
func (n *Notifier) Observe(now time.Time) {
	snap := n.Scheduler.Snapshot()
	enforcing := n.Scheduler.Enforcing()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.throttled == nil {
		n.throttled, n.last = map[podGPU]time.Duration{}, map[podReason]time.Time{}
	}
	every := cmp.Or(n.Every, EventEvery)
	seen := map[podGPU]time.Duration{}
	for _, g := range snap {
		for _, p := range g.Pods {
			k := podGPU{p.UID, g.GPU}
			seen[k] = p.Throttled
			grew := p.Throttled > n.throttled[k]
			if !enforcing {
				continue
			}
			reason, msg := "", ""
			switch {
			case p.State == Capped:
				reason, msg = ReasonCapped, fmt.Sprintf("gpud's compute scheduler froze this pod on GPU %d: it reached its hard cap of %d%% of the GPU (measured %.1f%%); it is frozen whenever it is over, even with the GPU otherwise idle (throttled %s so far)",
					g.GPU, p.Target, p.Share, p.Throttled.Round(time.Millisecond))
			case grew:
				reason, msg = ReasonThrottled, fmt.Sprintf("gpud's compute scheduler froze this pod on GPU %d to hold it to its share while others use the GPU: its target is %d%% of the GPU (measured %.1f%%; throttled %s so far); it runs again at its next slice",
					g.GPU, p.Target, p.Share, p.Throttled.Round(time.Millisecond))
			default:
				continue
			}
			kr := podReason{p.UID, reason}
			if t, ok := n.last[kr]; ok && now.Sub(t) < every {
				continue
			}
			n.last[kr] = now
			n.Events.Note(p.UID, reason, msg)
		}
	}
	n.throttled = seen
	// A pod gone from every GPU is forgotten once its last Event is old.
	for kr, t := range n.last {
		if now.Sub(t) >= every && !present(seen, kr.uid) {
			delete(n.last, kr)
		}
	}
}

func present(seen map[podGPU]time.Duration, uid string) bool {
	for k := range seen {
		if k.uid == uid {
			return true
		}
	}
	return false
}
