// Package nri classifies pods through the container runtime's Node Resource
// Interface (containerd ≥ 1.7, CRI-O): the runtime asks gpud about every pod
// sandbox and container synchronously, before the container's first process
// runs, so the kernel gate knows a pod's class before the pod can open a GPU.
package nri

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/workload"
)

// Errors of the socket check: gpud only talks to a socket root made.
var (
	ErrNotSocket = errors.New("nri: not a unix socket")
	ErrNotRoot   = errors.New("nri: socket not owned by root")
)

const (
	// answerWithin bounds gpud's part of a runtime request. The runtime
	// gives a plugin 2 s (api.DefaultPluginRequestTimeout) and then drops
	// it; gpud answers long before, classified or not, so a wedged gpud
	// never fails or stalls a pod's creation.
	answerWithin = 500 * time.Millisecond
	// maxInFlight bounds the classifications still running after their
	// answer was sent (a wedged registry): beyond it, requests are only
	// counted.
	maxInFlight = 64
)

// Plugin is gpud's NRI plugin. The zero value is not usable: set Registry,
// CgroupRoot and Log.
type Plugin struct {
	Socket     string // the runtime's NRI socket (--nri-socket; its default is config.Defaults')
	Registry   *workload.Registry
	CgroupRoot string // cgroup v2 mount, where kubelet makes pod cgroups
	Log        *slog.Logger
	Retry      time.Duration // wait before reconnecting; 0 means 1 s
	// Checkpoint, when set, names the checkpoint directory (its path on
	// the host) a container of the pod gets at CheckpointPath, and whether
	// read-only; ok false: none (preempt.Checkpoints decides).
	Checkpoint func(podUID, namespace, taskID string) (dir string, readOnly, ok bool)

	Connected  atomic.Bool   // registered with the runtime now
	Classified atomic.Uint64 // pods put in the registry from NRI requests
	Late       atomic.Uint64 // requests answered before their classification finished
	Invalid    atomic.Uint64 // sandboxes without a valid pod uid (not kubelet's)

	inFlight atomic.Int32
}

// Run connects to the runtime and serves its requests until ctx ends,
// reconnecting whenever the runtime goes away (a containerd restart) or
// its socket appears later than gpud.
func (p *Plugin) Run(ctx context.Context) {
	sock := p.Socket
	if sock == "" {
		p.Log.Error("nri: no socket given: pods are classified without NRI")
		return
	}
	retry := p.Retry
	if retry <= 0 {
		retry = time.Second
	}
	waiting := false
	for ctx.Err() == nil {
		if err := CheckSocket(sock); err != nil {
			if !waiting {
				p.Log.Info("waiting for the runtime's NRI socket", "socket", sock, "reason", err.Error())
				waiting = true
			}
		} else {
			waiting = false
			if err := p.serve(ctx, sock); err != nil && ctx.Err() == nil {
				p.Log.Warn("NRI connection ended", "socket", sock, "error", err)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// serve runs one connection to the runtime.
func (p *Plugin) serve(ctx context.Context, sock string) error {
	s, err := stub.New(p, stub.WithSocketPath(sock), stub.WithPluginName("gpud"), stub.WithPluginIdx("10"),
		stub.WithLogger(logger{p.Log}))
	if err != nil {
		return fmt.Errorf("nri: plugin: %w", err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			s.Stop()
		case <-done:
		}
	}()
	p.Log.Info("NRI plugin connecting", "socket", sock)
	defer p.Connected.Store(false)
	if err := s.Run(ctx); err != nil {
		return fmt.Errorf("nri: %s: %w", sock, err)
	}
	return nil
}

// socketOwner is root; tests run by another user set their own uid.
var socketOwner uint32 = 0

// CheckSocket accepts only a unix socket root owned, named without a
// symlink at its last component (the runtime's, not one a user planted).
func CheckSocket(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("nri: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%w: %s is %s", ErrNotSocket, path, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != socketOwner {
		return fmt.Errorf("%w: %s", ErrNotRoot, path)
	}
	return nil
}

// Synchronize classifies the pods that existed before gpud connected.
func (p *Plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, _ []*api.Container) ([]*api.ContainerUpdate, error) {
	p.Connected.Store(true)
	for _, pod := range pods {
		p.put(pod)
	}
	p.Log.Info("NRI plugin registered", "pods", len(pods))
	return nil, nil
}

// RunPodSandbox classifies a new pod. kubelet made the pod's cgroup before
// asking for the sandbox, and none of its containers exist yet.
func (p *Plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.classify(pod)
	return nil // never fail a pod's creation
}

// CheckpointPath is where a task's checkpoint directory appears in its
// containers; GPUD_RESUME_FROM names it.
const CheckpointPath = "/gpud-checkpoint"

// CreateContainer classifies the container's pod again before the
// container exists: it covers a pod whose RunPodSandbox came before gpud
// connected, or whose labels changed. A container of a preempted task gets
// the task's checkpoint directory (NRI is where gpud knows which pod a
// container is; the device plugin's Allocate does not).
func (p *Plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.classify(pod)
	return p.checkpointMount(pod, ctr), nil, nil
}

// checkpointMount is the adjustment that mounts the pod's task's
// checkpoint directory, or nil.
func (p *Plugin) checkpointMount(pod *api.PodSandbox, ctr *api.Container) *api.ContainerAdjustment {
	uid := pod.GetUid()
	if p.Checkpoint == nil || !cgroups.ValidPodUID(uid) {
		return nil
	}
	dir, ro, ok := p.Checkpoint(uid, pod.GetNamespace(), TaskID(pod))
	if !ok {
		return nil
	}
	opts := []string{"rbind", "nosuid", "nodev", "rw"}
	if ro {
		opts[3] = "ro"
	}
	adj := &api.ContainerAdjustment{}
	adj.AddMount(&api.Mount{Destination: CheckpointPath, Source: dir, Type: "bind", Options: opts})
	adj.AddEnv("GPUD_RESUME_FROM", CheckpointPath)
	p.Log.Info("checkpoint directory mounted", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(),
		"task_id", TaskID(pod), "read_only", ro)
	return adj
}

// TaskID is a pod's task: its gpud.io/task-id label, else namespace/name
// (as the other pod sources name it).
func TaskID(pod *api.PodSandbox) string {
	if id := pod.GetLabels()[workload.LabelTaskID]; id != "" {
		return id
	}
	return pod.GetNamespace() + "/" + pod.GetName()
}

// RemovePodSandbox forgets a pod whose sandbox is gone.
func (p *Plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	if uid := pod.GetUid(); cgroups.ValidPodUID(uid) {
		p.Registry.RemovePod(uid)
	}
	return nil
}

// classify puts the pod in the registry within answerWithin.
func (p *Plugin) classify(pod *api.PodSandbox) {
	if p.inFlight.Load() >= maxInFlight {
		p.Late.Add(1)
		return
	}
	p.inFlight.Add(1)
	done := make(chan struct{})
	go func() {
		defer p.inFlight.Add(-1)
		defer close(done)
		p.put(pod)
	}()
	select {
	case <-done:
	case <-time.After(answerWithin):
		p.Late.Add(1)
		p.Log.Warn("NRI request answered before its pod was classified", "pod_uid", pod.GetUid(), "after", answerWithin)
	}
}

// put stores the pod as the API-server source does: the class from its
// labels, the cgroup id when its cgroup exists, and the leaf names the
// kernel classifies when it is made.
func (p *Plugin) put(pod *api.PodSandbox) {
	uid := pod.GetUid()
	if !cgroups.ValidPodUID(uid) {
		p.Invalid.Add(1)
		return
	}
	if old, ok := p.Registry.Lookup(occupancy.ProcInfo{PodUID: uid}); ok && old.LiveLabels {
		// NRI gives the labels the pod was made with; the API server's,
		// which gpud has, are at least as new: only the cgroup id and
		// the expected names are NRI's to add (Registry.Put keeps the
		// rest should the informer store the pod meanwhile).
		qos := QOSClass(pod.GetLinux().GetCgroupParent())
		p.Registry.Expect(workload.PodKey(uid), cgroups.PodLeafNames(uid, qos))
		p.Classified.Add(1)
		if old.CgroupID == 0 {
			if cg := cgroups.PodID(p.CgroupRoot, uid, qos); cg != 0 {
				p.Registry.Put(workload.Workload{PodUID: uid, CgroupID: cg})
			}
		}
		return
	}
	labels := pod.GetLabels()
	w := workload.Workload{
		PodUID: uid, Namespace: pod.GetNamespace(), Name: pod.GetName(),
		TaskID: TaskID(pod), PreemptMode: labels[workload.LabelPreemptMode],
	}
	w.Priority, w.Agent = p.Registry.ClassifyPod(uid, w.Namespace, labels)
	qos := QOSClass(pod.GetLinux().GetCgroupParent())
	w.CgroupID = cgroups.PodID(p.CgroupRoot, uid, qos)
	p.Registry.Expect(workload.PodKey(uid), cgroups.PodLeafNames(uid, qos))
	p.Classified.Add(1)
	if p.Registry.Holds(w) {
		return
	}
	p.Registry.Put(w)
}

// QOSClass reads a pod's QoS class from the cgroup parent kubelet gave its
// sandbox ("/kubepods/burstable/pod<uid>" or
// "kubepods-burstable-pod<uid_>.slice"); "" when the parent does not say,
// which makes the cgroup lookups try every class.
func QOSClass(parent string) string {
	switch {
	case strings.Contains(parent, "besteffort"):
		return "BestEffort"
	case strings.Contains(parent, "burstable"):
		return "Burstable"
	case strings.Contains(parent, "kubepods"):
		return "Guaranteed"
	}
	return ""
}

// logger sends NRI's own log lines into gpud's log.
type logger struct{ l *slog.Logger }

func (g logger) Debugf(ctx context.Context, f string, a ...any) {
	g.l.DebugContext(ctx, fmt.Sprintf(f, a...), "component", "nri")
}
func (g logger) Infof(ctx context.Context, f string, a ...any) {
	g.l.DebugContext(ctx, fmt.Sprintf(f, a...), "component", "nri")
}
func (g logger) Warnf(ctx context.Context, f string, a ...any) {
	g.l.WarnContext(ctx, fmt.Sprintf(f, a...), "component", "nri")
}
func (g logger) Errorf(ctx context.Context, f string, a ...any) {
	g.l.ErrorContext(ctx, fmt.Sprintf(f, a...), "component", "nri")
}
